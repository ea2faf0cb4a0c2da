"""Frozen target features for the draft: the hidden states of three layers, and the target's logits."""

from __future__ import annotations

import torch


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, aux_layer_ids,
                    vocab_rows: torch.Tensor | None = None):
    """Returns (aux [B, T, 3H], logits [B, T, V]) -- or [B, T, len(vocab_rows)] with `vocab_rows`.

    Hidden-state index i is the residual stream after i decoder layers (0 = embeddings) -- the
    same index vLLM's `eagle_aux_hidden_state_layer_ids` uses (and HF's `hidden_states[i]` for
    i < num_layers; the last HF entry is post-norm, so ids must be < num_layers).

    `vocab_rows` (the draft vocabulary's target ids): the token loss only reads those logits, so
    only those rows of the LM head are applied. For a real model this is the difference between
    B x T x 152k logits (10 GB in fp32 for 2 x 8k tokens) and B x T x 32k.
    """
    n_layers = target.config.num_hidden_layers
    if max(aux_layer_ids) >= n_layers:
        raise ValueError(f"aux layer ids {tuple(aux_layer_ids)} must be < num_hidden_layers={n_layers}")
    if vocab_rows is None:
        out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        logits = out.logits
    else:
        out = target.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                                   use_cache=False)
        head = target.get_output_embeddings()
        logits = out.last_hidden_state @ head.weight[vocab_rows].t()
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias[vocab_rows]
    aux = torch.cat([out.hidden_states[i] for i in aux_layer_ids], dim=-1)
    return aux.float(), logits.float()
