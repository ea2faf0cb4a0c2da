"""Which of a step's inputs are committed tokens, for many requests at once (the runner hook's part).

A request's logit rows in one step are [last committed token, draft_1 .. draft_k] at generated
indices gen0 .. gen0 + k. Last step's inputs below this step's gen0 were committed (its input 0 and
the drafts the target accepted); this step's input 0 is the newest committed token. So per request
slot we keep last step's rows (tokens and signals) and gen0: one step's committed tokens are last
step's drafts 1..a (a = gen0 - last gen0 - 1 accepted) and this step's input 0 -- read from the
device rows, never from `output_token_ids` (which holds `-1` placeholders under async scheduling).

`step_kernels.stream_row` lays one step out as `BatchTrackers.scan` columns (column-major, [L, N]): [last step's
drafts 1..W-1 (valid below a) | input 0 (valid unless the step repeats last step's input 0) |
drafts 1..k (hypothetical)]; `step_kernels.stream_row` / `advance_row` (compiled) read and write
these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_SIGNALS = 3


@dataclass
class Stream:
    gen0: np.ndarray  # [N] generated index of input 0
    last_gen0: np.ndarray  # [N] last step's gen0 (-1: no step yet)
    last_input0: np.ndarray  # [N] last step's input 0 token
    lost: np.ndarray  # [N] committed tokens cannot be reconstructed from the rows seen
    tok: np.ndarray  # [L, N]
    sig: np.ndarray  # [L, N, 3]
    valid: np.ndarray  # [L, N]
    n_commit: int  # columns below this are committed

    def token_at(self, r: int, g: int) -> int | None:
        """Committed token with generated index g of row r, if this step's stream holds it."""
        last, g0 = int(self.last_gen0[r]), int(self.gen0[r])
        if g == g0 and self.valid[self.n_commit - 1, r]:
            return int(self.tok[self.n_commit - 1, r])
        if g == last:
            return int(self.last_input0[r])
        if last < g < g0:
            return int(self.tok[g - last - 1, r])
        return None


class CommittedRows:
    """Per slot: prompt length, last step's gen0 and rows (column-major: [row, slot])."""

    def __init__(self, capacity: int = 16, width: int = 1):
        self.n_prompt = np.zeros(capacity, np.int64)
        self.last_gen0 = np.full(capacity, -1, np.int64)
        self.last_n = np.ones(capacity, np.int64)  # rows of last step (1: the virtual row before token 0)
        self.last_tok = np.full((width, capacity), -1, np.int64)
        self.last_sig = np.zeros((width, capacity, N_SIGNALS))

    def reset(self, slot: int, n_prompt: int) -> None:
        if slot >= len(self.n_prompt):
            self._grow(max(slot + 1, 2 * len(self.n_prompt)), len(self.last_tok))
        self.n_prompt[slot] = n_prompt
        self.last_gen0[slot] = -1  # so that the first decode step (gen0 = 0) commits its input 0
        self.last_n[slot] = 1
        self.last_tok[:, slot] = -1

    def _grow(self, cap: int, width: int) -> None:
        def grown(a, shape, fill):
            out = np.full(shape, fill, a.dtype)
            out[tuple(slice(0, n) for n in a.shape)] = a
            return out

        self.n_prompt = grown(self.n_prompt, (cap,), 0)
        self.last_gen0 = grown(self.last_gen0, (cap,), -1)
        self.last_n = grown(self.last_n, (cap,), 1)
        self.last_tok = grown(self.last_tok, (width, cap), -1)
        self.last_sig = grown(self.last_sig, (width, cap, N_SIGNALS), 0.0)

    def fit(self, width: int) -> None:
        """Room for `width` rows per slot (a step with more drafts than any before)."""
        if width > len(self.last_tok):
            self._grow(len(self.n_prompt), width)

    def state(self) -> tuple:
        """The arrays `step_kernels.stream_row` / `advance_row` read and write, in their order."""
        return self.n_prompt, self.last_gen0, self.last_n, self.last_tok, self.last_sig
