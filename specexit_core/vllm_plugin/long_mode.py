"""The long mode inside vLLM's V1 model runner: n-gram reuse beside EAGLE-3 and the windowed
contextual penalty, per request (controls: long_controls.py), in the same engine as SpecExit.

Three hook points of `GPUModelRunner` (runner_hook.install_runner_hook wires them):

* `before_sample` (in `sample_tokens`, before rejection sampling; before SpecExit's `</think>`
  forcing, so a forced row stays forced): reads the request's step inputs at its logit rows
  [x_0 = last committed token, draft_1 .. draft_k] with their positions, extends the request's own
  token history (prompt + committed output) from them, counts how many of the last step's drafts
  were accepted (by source), and applies the penalty to row j with the window of
  `history + drafts[:j]` (`penalty.chain_presence`): exactly the logits plain decoding with the
  same penalty computes there. Verification is then against the penalised target.
* `after_propose` (wraps `propose_draft_token_ids`, before the drafts are copied to the host or
  handed to the next step): for requests with n-gram reuse, looks up a continuation in
  `history + this step's sampled tokens` and, where one of k tokens exists, overwrites that row of
  EAGLE-3's draft tensor (ngram_drafts.merge_drafts). The tensor is the one the next step scatters
  into its inputs (also under async scheduling, where it stays on the device), so the target
  verifies exactly these tokens.
* `finish` (wraps `_update_states`, which gets the scheduler's finished request ids): one
  `long-<pid>.jsonl` event per finished long-mode request (telemetry.py), then its state goes.

The history is rebuilt from the step inputs, never from `requests[id].output_token_ids` (which holds
`-1` placeholders under async scheduling): last step's inputs below this step's first position
were committed. A request whose history cannot be rebuilt (a step the hook did not see) stops
its long mode (`fallback` in its event) and runs on as a plain EAGLE-3 request; since its penalty
stops too, its output is then no longer the penalised target's. Host work runs only for batches
with a long-mode request: one device->host copy of their rows' ids and positions per step, one of
their sampled tokens when n-gram reuse is on (free on CPU).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from specexit_core.longgen.penalty import chain_presence, penalise
from specexit_core.vllm_plugin.long_controls import LongConfig, request_long_config, server_long_defaults
from specexit_core.vllm_plugin.ngram_drafts import EAGLE, NGRAM, SourceRates, merge_drafts
from specexit_core.vllm_plugin.telemetry import LONG, TELEMETRY_DIR_ENV, EventWriter

log = logging.getLogger("specexit.vllm")


class TokenHistory:
    """A request's prompt + committed output, in a growing int32 buffer (O(1) appends, numpy views)."""

    def __init__(self, tokens):
        self.buf = np.asarray(tokens, np.int32).copy()
        self.n = len(self.buf)

    def __len__(self) -> int:
        return self.n

    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)

    def extend(self, tokens) -> None:
        tokens = np.asarray(tokens, np.int32)
        need = self.n + len(tokens)
        if need > len(self.buf):
            grown = np.empty(max(need, 2 * len(self.buf), 64), np.int32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : need] = tokens
        self.n = need

    def tail(self, w: int) -> list[int]:
        return self.buf[max(self.n - w, 0) : self.n].tolist() if w > 0 else []


@dataclass
class _Req:
    cfg: LongConfig
    hist: TokenHistory | None
    prev_p0: int = -1  # position of last step's input 0
    prev_drafts: list[int] = field(default_factory=list)  # last step's drafts (inputs 1..k)
    prev_source: str | None = None  # where last step's drafts came from
    next_source: str = EAGLE  # where the drafts proposed this step come from
    rates: SourceRates = field(default_factory=SourceRates)  # accepted fraction per source (ngram_policy)
    fallback: str | None = None
    stats: dict = field(
        default_factory=lambda: {
            "steps": 0,
            "ngram_steps": 0,
            "ngram_drafted_tokens": 0,
            "ngram_accepted_tokens": 0,
            "eagle_steps": 0,
            "eagle_drafted_tokens": 0,
            "eagle_accepted_tokens": 0,
            "penalised_rows": 0,
        }
    )


class _LostTrack(RuntimeError):
    pass


class LongModeState:
    """Per-runner long-mode state: per-request configs and histories, engine-wide counters."""

    def __init__(self, runner):
        self.defaults = server_long_defaults()
        self.max_model_len = int(getattr(runner, "max_model_len", 1 << 30))
        self.reqs: dict[str, _Req | None] = {}  # None: long mode off for this request
        self._batch: list[str] = []
        self._long_rows: list[int] = []  # batch rows of this batch's long-mode requests
        self.counters = {
            "requests": 0,
            "ngram_drafted_tokens": 0,
            "ngram_accepted_tokens": 0,
            "eagle_drafted_tokens": 0,
            "eagle_accepted_tokens": 0,
            "penalised_rows": 0,
            "fallbacks": 0,
            "hook_errors": 0,
        }
        self.events = EventWriter(os.environ.get(TELEMETRY_DIR_ENV))
        if self.defaults.active:
            log.info("long mode on by default: %s", self.defaults.telemetry())

    # -- requests ------------------------------------------------------------------------------
    def _state(self, runner, req_id: str) -> _Req | None:
        if req_id in self.reqs:
            return self.reqs[req_id]
        rs = runner.requests[req_id]
        extra = rs.sampling_params.extra_args if rs.sampling_params is not None else None
        try:  # the front end validated the same controls; this is the safety net
            cfg = request_long_config(extra, self.defaults)
        except ValueError as e:
            log.warning("long mode off for %s: invalid controls: %s", req_id, e)
            cfg = None
        st = None
        if cfg is not None and cfg.active:
            prompt = rs.prompt_token_ids
            st = _Req(cfg=cfg, hist=TokenHistory(prompt) if prompt is not None else None)
            if prompt is None:
                self._fall_back(req_id, st, "a prompt without token ids (embeddings)")
            self.counters["requests"] += 1
        self.reqs[req_id] = st
        return st

    def _rows(self, runner, req_ids: list[str]) -> list[int]:
        if req_ids != self._batch:
            for rid in [r for r in self.reqs if r not in runner.requests]:
                self.reqs.pop(rid)  # gone without a finish we saw (aborted before a step)
            self._long_rows = [i for i, r in enumerate(req_ids) if self._state(runner, r) is not None]
            self._batch = list(req_ids)
        return self._long_rows

    def _fall_back(self, req_id: str, st: _Req, reason: str) -> None:
        if st.fallback is None:
            st.fallback = reason
            self.counters["fallbacks"] += 1
            log.warning("long mode stops for request %s: %s", req_id, reason)

    # -- before rejection sampling ---------------------------------------------------------------
    def before_sample(self, runner, exec_state) -> None:
        sdm = exec_state.spec_decode_metadata
        if sdm is None:
            return
        num_reqs = len(sdm.num_draft_tokens)
        req_ids = runner.input_batch.req_ids[:num_reqs]
        rows = self._rows(runner, req_ids)
        if not rows:
            return
        discard = runner.discard_request_mask.np[:num_reqs] if hasattr(runner, "discard_request_mask") else None
        n_drafts = np.asarray(sdm.num_draft_tokens, np.int64)
        start = np.zeros(num_reqs, np.int64)
        np.cumsum(n_drafts[:-1] + 1, out=start[1:])
        live = [r for r in rows if self.reqs[req_ids[r]].fallback is None and (discard is None or not discard[r])]
        if not live:
            return
        logit_rows = np.concatenate([np.arange(start[r], start[r] + n_drafts[r] + 1) for r in live])
        tok, pos = _host_inputs(runner, sdm, logit_rows)
        logits = exec_state.logits
        vocab = logits.shape[-1]
        off = 0
        for r in live:
            n = int(n_drafts[r]) + 1
            t, p = tok[off : off + n], pos[off : off + n]
            off += n
            req_id = req_ids[r]
            st = self.reqs[req_id]
            try:
                self._advance(runner, req_id, st, t, p)
            except _LostTrack as e:
                self._fall_back(req_id, st, str(e))
                continue
            pen = st.cfg.penalty
            if pen.enabled:
                present = chain_presence(
                    st.hist.tail(pen.window), st.prev_drafts, vocab, pen.window, device=logits.device
                )
                s = int(start[r])
                with torch.inference_mode():
                    logits[s : s + n] = penalise(logits[s : s + n], present, pen.theta)
                st.stats["penalised_rows"] += n
                self.counters["penalised_rows"] += n

    def _advance(self, runner, req_id: str, st: _Req, tok: np.ndarray, pos: np.ndarray) -> None:
        """Move the history to input 0 of this step; count last step's accepted drafts."""
        x0, p0 = int(tok[0]), int(pos[0])
        h = st.hist
        if len(h) > p0:
            if int(h.view()[p0]) != x0:
                raise _LostTrack(f"input 0 at position {p0} is not the token the history holds")
            h.truncate(p0 + 1)
        else:
            gap = p0 - len(h)  # accepted drafts of last step before input 0
            if st.prev_p0 == len(h) - 1 and gap <= len(st.prev_drafts):
                h.extend([*st.prev_drafts[:gap], x0])
            else:
                h_new = _resync(runner, req_id, p0, x0)
                if h_new is None:
                    raise _LostTrack(
                        f"committed tokens before position {p0} were never seen (history ends at {len(h)})"
                    )
                st.hist = h = h_new
        if st.prev_p0 >= 0 and st.prev_drafts and st.prev_source is not None and p0 > st.prev_p0:
            acc = min(p0 - st.prev_p0 - 1, len(st.prev_drafts))
            key = f"{st.prev_source}_accepted_tokens"
            st.stats[key] += acc
            self.counters[key] += acc
            st.rates.observe(st.prev_source, acc, len(st.prev_drafts))
        drafts = tok[1:].tolist()
        if drafts:
            src = st.next_source
            st.stats["steps"] += 1
            st.stats[f"{src}_steps"] += 1
            st.stats[f"{src}_drafted_tokens"] += len(drafts)
            self.counters[f"{src}_drafted_tokens"] += len(drafts)
            st.prev_source = src
        else:
            st.prev_source = None
        st.prev_p0, st.prev_drafts = p0, drafts
        st.next_source = EAGLE

    # -- after EAGLE-3 proposed ----------------------------------------------------------------
    def after_propose(self, runner, sampled_token_ids, drafts):
        """Overwrite the rows of n-gram requests whose context yields a full continuation."""
        if not torch.is_tensor(drafts) or drafts.ndim != 2 or drafts.shape[1] == 0:
            return drafts  # (a list: a drafter that already ran on host lists; not EAGLE-3)
        num_reqs = drafts.shape[0]
        req_ids = runner.input_batch.req_ids[:num_reqs]
        if req_ids != self._batch:
            return drafts  # not the batch before_sample saw: leave EAGLE's drafts
        rows = [
            r
            for r in self._long_rows
            if r < num_reqs and self.reqs[req_ids[r]].cfg.ngram and self.reqs[req_ids[r]].fallback is None
        ]
        if not rows or getattr(runner, "_draft_probs", None) is not None:
            return drafts  # probabilistic draft sampling: its q rows would no longer match the tokens
        discard = runner.discard_request_mask.np[:num_reqs] if hasattr(runner, "discard_request_mask") else None
        rows = [r for r in rows if discard is None or not discard[r]]
        if not rows:
            return drafts
        sampled = _host_sampled(sampled_token_ids, rows)
        eagle = drafts[rows].cpu().tolist() if drafts.device.type != "cpu" else drafts[rows].tolist()
        new_rows, new_vals = [], []
        for i, r in enumerate(rows):
            st = self.reqs[req_ids[r]]
            if st.prev_p0 < 0 or len(st.hist) != st.prev_p0 + 1:
                continue  # before_sample did not place this request's history at input 0
            ctx = np.concatenate([st.hist.view(), np.asarray(sampled[i], np.int32)])
            use = st.cfg.ngram_policy == "always" or st.rates.prefer_ngram()
            toks, src = merge_drafts(eagle[i], ctx, st.cfg.ngram_min, st.cfg.ngram_max, self.max_model_len, use)
            st.next_source = src
            if src == NGRAM:
                new_rows.append(r)
                new_vals.append(toks)
        if new_rows:
            idx = torch.tensor(new_rows, dtype=torch.long, device=drafts.device)
            drafts[idx] = torch.tensor(new_vals, dtype=drafts.dtype, device=drafts.device)
        return drafts

    # -- finished requests ---------------------------------------------------------------------
    def finish(self, req_ids) -> None:
        for rid in req_ids:
            st = self.reqs.pop(rid, None)
            if st is not None:
                self.events.append(LONG, {"req_id": rid, **usage_fields(st)})


def usage_fields(st: _Req) -> dict:
    """The event / `usage.specexit.long` fields of one request."""
    return {"config": st.cfg.telemetry(), **st.stats, "fallback": st.fallback}


def _resync(runner, req_id: str, p0: int, x0: int) -> TokenHistory | None:
    """History from the runner's own request state, when it holds real tokens (no async placeholders)."""
    rs = runner.requests.get(req_id)
    if rs is None or rs.prompt_token_ids is None:
        return None
    full = list(rs.prompt_token_ids) + list(rs.output_token_ids)
    if len(full) < p0 + 1 or min(full[: p0 + 1], default=0) < 0 or full[p0] != x0:
        return None
    return TokenHistory(full[: p0 + 1])


def _tensor(buf) -> torch.Tensor:
    return buf.gpu if hasattr(buf, "gpu") else buf


def _host_inputs(runner, sdm, logit_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Input token ids and positions at the given logit rows, in one device->host copy."""
    idx = sdm.logits_indices
    sel = torch.as_tensor(logit_rows, dtype=torch.long, device=idx.device)
    tok_idx = idx.index_select(0, sel)
    ids = _tensor(runner.input_ids).index_select(0, tok_idx)
    positions = _tensor(runner.positions).index_select(0, tok_idx)
    block = torch.stack([ids.to(torch.int64), positions.to(torch.int64)])
    if block.device.type != "cpu":
        block = block.cpu()  # the one wait of this hook per step
    out = block.numpy()
    return out[0], out[1]


def _host_sampled(sampled_token_ids, rows: list[int]) -> list[list[int]]:
    """This step's committed tokens of the given batch rows (rejected slots are -1 in V1)."""
    if isinstance(sampled_token_ids, list):
        return [list(sampled_token_ids[r]) for r in rows]
    t = sampled_token_ids[rows]
    t = t.cpu() if t.device.type != "cpu" else t
    return [[int(x) for x in row if x >= 0] for row in t.tolist()]
