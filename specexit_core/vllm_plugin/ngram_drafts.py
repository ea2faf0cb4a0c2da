"""N-gram reuse beside EAGLE-3: which draft tokens a long-mode request verifies next step.

The lookup is vLLM's own n-gram rule (`vllm/v1/spec_decode/ngram_proposer.py`,
`_find_longest_matched_ngram_and_propose_tokens`: the longest suffix of the context, between
`ngram_min` and `ngram_max` tokens, that occurred earlier; the tokens that followed it), run on the
request's own prompt + committed output + this step's sampled tokens. vLLM runs one draft method per
engine; this adds it per request and per step, beside the engine's EAGLE-3 drafter.

The merge rule (per request and step): if the context yields a full continuation of k tokens
(k: the step's draft length), it replaces EAGLE-3's k drafts; otherwise EAGLE-3's drafts stay.
Never a mix: EAGLE's draft j is conditioned on its own drafts 1..j-1, not on n-gram tokens.
A match found in the context is a sign of repetition (the regime of long outputs where TokenSwift's
n-gram reuse pays), and a partial continuation means the match ran into the end of the context,
where EAGLE-3 knows more. But a match is not always the better guess: on the toy teacher n-gram
drafts were accepted 30-44% of the time against 44-87% for its own EAGLE-3 draft, and replacing
EAGLE's drafts made the long mode 0.76-1.01x EAGLE-3 alone (`specexit bench longgen`). So by
default (`ngram_policy: adaptive`) a full match is used only while this request's n-gram drafts are
accepted at least as often as its EAGLE-3 drafts (`SourceRates`: an EWMA of each source's accepted
fraction per step; a source not tried yet is tried). `always` keeps every full match.

Both sources are deterministic functions of the context, so the target's verification (vLLM's
rejection sampler with `draft_probs=None`) keeps the output distribution exact, also at T > 0
(docs/longgen.md, "In the serving engine").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NGRAM, EAGLE = "ngram", "eagle"
RATE_ALPHA = 0.25  # weight of a step's accepted fraction in its source's EWMA: a memory of ~4 steps


@dataclass
class SourceRates:
    """One request's EWMA of the fraction of drafts accepted per step, by source (None: not tried yet;
    the first observation sets it)."""

    ngram: float | None = None
    eagle: float | None = None

    def observe(self, source: str, accepted: int, drafted: int) -> None:
        if drafted <= 0:
            return
        x = accepted / drafted
        old = getattr(self, source)
        setattr(self, source, x if old is None else (1 - RATE_ALPHA) * old + RATE_ALPHA * x)

    def prefer_ngram(self) -> bool:
        """Whether a full n-gram match should replace EAGLE-3's drafts now."""
        return self.ngram is None or self.eagle is None or self.ngram >= self.eagle


def ngram_continuation(context: np.ndarray, k: int, ngram_min: int, ngram_max: int, max_model_len: int) -> np.ndarray:
    """Up to k tokens following the longest earlier match of the context's suffix (vLLM's rule;
    empty: no match of at least `ngram_min` tokens, or no room left before `max_model_len`)."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    if k <= 0 or len(context) < 2:
        return np.empty(0, np.int32)
    ctx = np.ascontiguousarray(context, dtype=np.int32)
    return _find_longest_matched_ngram_and_propose_tokens(ctx, ngram_min, ngram_max, max_model_len, k)


def merge_drafts(
    eagle: list[int],
    context: np.ndarray,
    ngram_min: int,
    ngram_max: int,
    max_model_len: int,
    use_ngram: bool = True,
) -> tuple[list[int], str]:
    """(the drafts to verify, their source): the n-gram continuation when it is a full k = len(eagle)
    tokens (and `use_ngram`: the policy allows it), else EAGLE-3's drafts unchanged."""
    k = len(eagle)
    if not use_ngram:
        return list(eagle), EAGLE
    cont = ngram_continuation(context, k, ngram_min, ngram_max, max_model_len)
    if k > 0 and len(cont) == k:
        return [int(t) for t in cont], NGRAM
    return list(eagle), EAGLE
