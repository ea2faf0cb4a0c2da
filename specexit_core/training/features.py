"""Frozen target features for the draft: the hidden states of three layers, and the target's logits."""

from __future__ import annotations

import torch


def _capture_hidden(decoder, aux_layer_ids) -> tuple[dict, list]:
    """Forward hooks keeping hidden-state index i (0 = embeddings, i = after decoder layer i-1) --
    only those three, where `output_hidden_states` would keep every layer's (37 x B x T x H for a
    36-layer model: 3 GB in bf16 at 2 x 8k tokens)."""
    got: dict[int, torch.Tensor] = {}
    handles = []
    for i in aux_layer_ids:
        module = decoder.embed_tokens if i == 0 else decoder.layers[i - 1]

        def keep(_mod, _inp, out, i=i):
            got[i] = out[0] if isinstance(out, tuple) else out

        handles.append(module.register_forward_hook(keep))
    return got, handles


@torch.no_grad()
def target_features(
    target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    aux_layer_ids,
    vocab_rows: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = torch.float32,
):
    """Returns (aux [B, T, 3H], logits [B, T, V]) -- or [B, T, len(vocab_rows)] with `vocab_rows`.

    Hidden-state index i is the residual stream after i decoder layers (0 = embeddings) -- the
    same index vLLM's `eagle_aux_hidden_state_layer_ids` uses (and HF's `hidden_states[i]` for
    i < num_layers; the last HF entry is post-norm, so ids must be < num_layers).

    `vocab_rows` (the draft vocabulary's target ids): the token loss only reads those logits, so
    only those rows of the LM head are applied. For a real model this is the difference between
    B x T x 152k logits (10 GB in fp32 for 2 x 8k tokens) and B x T x 32k.
    `out_dtype`: both outputs are cast to it; None keeps the target's dtype (bf16 training).
    """
    n_layers = target.config.num_hidden_layers
    if max(aux_layer_ids) >= n_layers:
        raise ValueError(f"aux layer ids {tuple(aux_layer_ids)} must be < num_hidden_layers={n_layers}")
    decoder = target.get_decoder()
    got, handles = _capture_hidden(decoder, aux_layer_ids)
    try:
        if vocab_rows is None:
            logits = target(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        else:
            out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            head = target.get_output_embeddings()
            logits = out.last_hidden_state @ head.weight[vocab_rows].t()
            if getattr(head, "bias", None) is not None:
                logits = logits + head.bias[vocab_rows]
    finally:
        for h in handles:
            h.remove()
    aux = torch.cat([got.pop(i) for i in aux_layer_ids], dim=-1)
    if out_dtype is not None:
        aux, logits = aux.to(out_dtype), logits.to(out_dtype)
    return aux, logits
