"""N-gram reuse beside EAGLE-3: which draft tokens a long-mode request verifies next step.

The lookup is vLLM's own n-gram rule (`vllm/v1/spec_decode/ngram_proposer.py`,
`_find_longest_matched_ngram_and_propose_tokens`: the longest suffix of the context, between
`ngram_min` and `ngram_max` tokens, that occurred earlier; the tokens that followed it), run on the
request's own prompt + committed output + this step's sampled tokens. vLLM runs one draft method per
engine; this adds it per request and per step, beside the engine's EAGLE-3 drafter.

The merge rule (per request and step): if the context yields a full continuation of k tokens
(k: the step's draft length), it replaces EAGLE-3's k drafts; otherwise EAGLE-3's drafts stay.
Never a mix: EAGLE's draft j is conditioned on its own drafts 1..j-1, not on n-gram tokens.
A match found in the context is a strong sign of repetition (the regime of long outputs where
TokenSwift's n-gram reuse pays), and a partial continuation means the match ran into the end of the
context, where EAGLE-3 knows more.

Both sources are deterministic functions of the context, so the target's verification (vLLM's
rejection sampler with `draft_probs=None`) keeps the output distribution exact, also at T > 0
(docs/longgen.md, "In the serving engine").
"""

from __future__ import annotations

import numpy as np

NGRAM, EAGLE = "ngram", "eagle"


def ngram_continuation(context: np.ndarray, k: int, ngram_min: int, ngram_max: int, max_model_len: int) -> np.ndarray:
    """Up to k tokens following the longest earlier match of the context's suffix (vLLM's rule;
    empty: no match of at least `ngram_min` tokens, or no room left before `max_model_len`)."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    if k <= 0 or len(context) < 2:
        return np.empty(0, np.int32)
    ctx = np.ascontiguousarray(context, dtype=np.int32)
    return _find_longest_matched_ngram_and_propose_tokens(ctx, ngram_min, ngram_max, max_model_len, k)


def merge_drafts(
    eagle: list[int], context: np.ndarray, ngram_min: int, ngram_max: int, max_model_len: int
) -> tuple[list[int], str]:
    """(the drafts to verify, their source): the n-gram continuation when it is a full k = len(eagle)
    tokens, else EAGLE-3's drafts unchanged."""
    k = len(eagle)
    cont = ngram_continuation(context, k, ngram_min, ngram_max, max_model_len)
    if k > 0 and len(cont) == k:
        return [int(t) for t in cont], NGRAM
    return list(eagle), EAGLE
