"""Frozen target features for the draft: the hidden states of three layers, and the target's logits."""

from __future__ import annotations

import torch


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, aux_layer_ids):
    """Returns (aux [B, T, 3H], logits [B, T, V]).

    Hidden-state index i is the residual stream after i decoder layers (0 = embeddings) -- the
    same index vLLM's `eagle_aux_hidden_state_layer_ids` uses (and HF's `hidden_states[i]` for
    i < num_layers; the last HF entry is post-norm, so ids must be < num_layers).
    """
    n_layers = target.config.num_hidden_layers
    if max(aux_layer_ids) >= n_layers:
        raise ValueError(f"aux layer ids {tuple(aux_layer_ids)} must be < num_hidden_layers={n_layers}")
    out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[i] for i in aux_layer_ids], dim=-1)
    return aux.float(), out.logits.float()
