"""The exit inside vLLM's V1 model runner (`GPUModelRunner`, which `CPUModelRunner` subclasses).

Hook point: `sample_tokens`, after the target forward and before rejection sampling. For every
request the step's logit rows are [last committed token, draft_1 .. draft_k]; row j predicts the
token after input j. We compute the signals of the inputs from the target's aux hidden states
with the draft's `fc` signal rows (no extra forward pass), then replay the exit policy:

* committed tokens move the request's exit state (signals of every earlier committed token are
  known);
* drafts are looked at from a copy of it, hypothetically: if input j is a split token whose check
  passes, row j's `</think>` logit is set to 1e9. If drafts 1..j are accepted, the token after the
  split token is `</think>` -- exactly where the reference engine puts it; if one is rejected
  earlier, nothing happened and the next step decides again from the committed text.

The exit state is `ExitTracker`'s, kept for all requests in batch-wide arrays (`BatchTrackers`, one
slot per request) and advanced by one compiled loop per step for the whole batch
(`step_kernels.step_rows`), not Python per token; Python runs per request only for a new
request, an exit decision, a pending exit, a fallback or thinking just over. The device work (aux
rows -> signals) covers only the rows of requests the hook still follows: a request that exited,
ended its thinking, fell back or runs without SpecExit costs no signal rows (the hook's cost:
docs/dev/vllm-0.32-internals.md §9).

Committed tokens are reconstructed from the step inputs alone (device `input_ids`/`positions` at
the logit rows): last step's inputs below this step's first position were committed, and input 0
is the newest committed token. `requests[id].output_token_ids` is never read: under async
scheduling (GPU default for EAGLE-3) it holds `-1` placeholders, one per draft of the previous
step, trimmed a step later; the device buffers hold the real tokens and positions (vLLM corrects
them on the device in `_prepare_inputs`). So the hook is the same with and without async.

The decision depends only on the committed tokens and their signals, never on how many drafts a
step accepted. A request whose exit logic fails (bad settings, lost track of its tokens, non-finite
signals) falls back to no exit, with a `fallbacks-<pid>.jsonl` event; the engine and the other requests go on.

The same patch carries the long mode (long_mode.py: per-request n-gram reuse beside EAGLE-3 and the
windowed contextual penalty): its penalty runs first in `sample_tokens` (so a forced `</think>`
stays forced), its n-gram drafts replace EAGLE-3's rows after `propose_draft_token_ids`, and its
per-request telemetry is written from `_update_states` when the scheduler reports a request finished.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from specexit_core.draft.config import read_specexit_fields
from specexit_core.exit import ExitConfig, ExitDecision
from specexit_core.exit.answer_reserve import reported, with_answer_reserve
from specexit_core.exit.batch_tracker import ERROR, BatchTrackers, ScanEvent, new_events, scan_events
from specexit_core.exit.efforts import THINKING_OFF
from specexit_core.exit.policy import prompt_closed_thinking
from specexit_core.exit.signal_names import SIGNALS
from specexit_core.signals import activate
from specexit_core.vllm_plugin.committed_rows import CommittedRows, Stream
from specexit_core.vllm_plugin.controls import request_effort, request_exit_config, sampling_profile, server_defaults
from specexit_core.vllm_plugin.long_mode import LongModeState
from specexit_core.vllm_plugin.metrics import SpecExitMetrics
from specexit_core.vllm_plugin.telemetry import EXITS, FALLBACKS, TELEMETRY_DIR_ENV, EventWriter

log = logging.getLogger("specexit.vllm")
FORCE_LOGIT = 1e9
_TOK, _POS = 3, 4  # columns of a host row: confidence, progress, remaining, token id, position


@dataclass
class _ReqState:
    cfg: ExitConfig | None
    slot: int | None  # in BatchTrackers / CommittedRows; None: SpecExit off for this request
    pending: tuple[int, int, ExitDecision] | None = None  # forced: (split token idx, token, decision)
    exit: ExitDecision | None = None  # realised exit
    fallback: str | None = None  # why this request runs without exit
    reserve: bool = False  # its think budget is the answer reserve's (answer_reserve.py)
    done: bool = False  # thinking over (exited or `</think>` committed), or fallen back: nothing left to do


class _LostTrack(RuntimeError):
    """The committed tokens cannot be reconstructed (a step the hook did not see)."""


class SpecExitRunnerState:
    """Per-runner state: ids, defaults, per-request state (settings and exit state in slots of
    batch-wide arrays), counters."""

    def __init__(self, runner, drafter_model):
        self.model = drafter_model
        spec = read_specexit_fields(drafter_model.config)
        ids = spec.token_ids or {}
        missing = [k for k in ("think_start", "think_end", "split") if k not in ids]
        if missing:
            raise ValueError(f"SpecExit draft config lacks specexit.token_ids {missing}")
        self.think_start, self.think_end = int(ids["think_start"]), int(ids["think_end"])
        self.split_ids = frozenset(int(t) for t in ids["split"])
        self.defaults = server_defaults(spec.exit_defaults, spec.exit_profiles, spec.exit_efforts)
        self.trackers = BatchTrackers(
            split_token_ids=self.split_ids, think_start_id=self.think_start, think_end_id=self.think_end
        )
        self.rows = CommittedRows()
        # per slot (the last entry answers for "no slot", always False): followed, exit pending
        self.follow = np.zeros(self.trackers.capacity + 1, bool)
        self.pending = np.zeros(self.trackers.capacity + 1, bool)
        self.slot_req: dict[int, str] = {}
        self.reqs: dict[str, _ReqState] = {}
        # effort `none` on a prompt that left thinking open: `</think>` is their first token (_close_first)
        self.close_first: set[str] = set()
        self._seen_batch: list[str] = []  # the batch `_close_first_wanted` last looked at
        self._batch: list[str] = []  # last step's request ids, and their slots (-1: none)
        self._slots = np.zeros(0, np.int64)
        self._last_drafts: tuple = (None, None, None, 0)
        self._compiled_rows: bool | None = None  # CPU float32 rows: `step_kernels.cpu_rows`
        self._blocks_key: tuple | None = None  # what `_signal_blocks` was cut from
        self._blocks: np.ndarray | None = None
        # compiled per-step loops; imported here, at the first step, not at plugin load (numba then
        # breaks vLLM's CPU worker start: exit/batch_scan.py)
        from specexit_core.vllm_plugin import step_kernels

        self.kernels = step_kernels
        self.counters = {
            "requests": 0,
            "exits": 0,
            "think_tokens": 0,
            "steps": 0,
            "fallbacks": 0,
            "hook_errors": 0,
            "telemetry_errors": 0,
        }
        self.metrics = SpecExitMetrics()
        self.events = EventWriter(os.environ.get(TELEMETRY_DIR_ENV))
        log.info("SpecExit active: defaults %s, split ids %s", self.defaults.to_dict(), sorted(self.split_ids))

    # -- request bookkeeping -------------------------------------------------------------------
    def _state(self, runner, req_id: str) -> _ReqState:
        st = self.reqs.get(req_id)
        if st is None:
            rs = runner.requests[req_id]
            sp = rs.sampling_params
            extra = sp.extra_args if sp is not None else None
            st = self.reqs[req_id] = _ReqState(cfg=None, slot=None)
            self.counters["requests"] += 1
            try:  # the front end validated against the same defaults; this is the safety net
                cfg = request_exit_config(extra, self.defaults, sampling_profile(sp) if sp is not None else None)
                st.cfg, st.reserve = with_answer_reserve(cfg, sp.max_tokens if sp is not None else None)
            except Exception as e:  # noqa: BLE001
                self._fall_back(req_id, st, f"invalid SpecExit settings: {e}")
                return st
            prompt = getattr(rs, "prompt_token_ids", None)
            if prompt is not None and prompt_closed_thinking(prompt, self.think_start, self.think_end):
                st.done = True  # thinking closed in the prompt: all answer, nothing to follow
            elif request_effort(extra) == THINKING_OFF:
                st.done = True  # a template without `enable_thinking` (R1-style): close it at once
                self.close_first.add(req_id)
            elif st.cfg.enabled:
                st.slot = self.trackers.add(st.cfg)
                self.rows.reset(st.slot, rs.num_prompt_tokens)
                if st.slot + 1 >= len(self.follow):
                    self.follow = np.concatenate([self.follow, np.zeros(len(self.follow), bool)])
                    self.pending = np.concatenate([self.pending, np.zeros(len(self.pending), bool)])
                self.follow[st.slot] = True
                self.slot_req[st.slot] = req_id
            self.metrics.request(st.cfg.enabled)
        return st

    def prune(self, runner) -> None:
        for rid in [r for r in self.reqs if r not in runner.requests]:
            st = self.reqs.pop(rid)
            self.close_first.discard(rid)
            if st.slot is not None:
                if st.fallback is None:
                    think = int(self.trackers.think[st.slot])
                    self.counters["think_tokens"] += think
                    self.metrics.finished(think)
                self.follow[st.slot] = self.pending[st.slot] = False
                self.slot_req.pop(st.slot, None)
                self.trackers.free(st.slot)

    def _fall_back(self, req_id: str, st: _ReqState, reason: str) -> None:
        """This request runs on without SpecExit; the engine and every other request are untouched."""
        st.pending, st.fallback, st.done = None, reason, True
        if st.slot is not None:
            self.follow[st.slot] = self.pending[st.slot] = False
        self.counters["fallbacks"] += 1
        log.warning("specexit: request %s continues without early exit: %s", req_id, reason)
        self.events.append(FALLBACKS, {"req_id": req_id, "fallback": reason})
        self.counters["telemetry_errors"] = self.events.errors

    def _batch_slots(self, runner, req_ids: list[str]) -> np.ndarray:
        """Slots of this step's requests (-1: SpecExit off); Python per request only when the batch
        changed since last step."""
        if req_ids != self._batch:
            self.prune(runner)
            states = [self.reqs.get(r) or self._state(runner, r) for r in req_ids]
            self._slots = np.array([-1 if st.slot is None else st.slot for st in states], np.int64)
            self._batch = list(req_ids)
        return self._slots

    # -- effort `none` where the template left thinking open ---------------------------------------
    def _close_first_wanted(self, runner) -> bool:
        """Whether a request of this step waits for its first token to be `</think>`; a changed batch's
        new requests get their state here, at their prefill, so one asking for it is known in time."""
        req_ids = runner.input_batch.req_ids
        if req_ids != self._seen_batch:
            self._seen_batch = list(req_ids)
            for rid in req_ids:
                if rid is not None and rid not in self.reqs and rid in runner.requests:
                    self._state(runner, rid)
        return bool(self.close_first)

    def _force_close_first(self, runner, exec_state) -> None:
        """`</think>` as the first generated token of the requests that asked for effort `none` on a
        prompt that left thinking open (the R1 template has no `enable_thinking`): forced on the row that
        samples that token, once their prefill is complete (a partial prefill's sample is discarded)."""
        req_ids = runner.input_batch.req_ids
        sdm = exec_state.spec_decode_metadata
        num_reqs = len(sdm.num_draft_tokens) if sdm is not None else exec_state.logits.shape[0]
        starts = self._n_drafts(sdm.num_draft_tokens)[1] if sdm is not None else np.arange(num_reqs)
        mask = getattr(runner, "discard_request_mask", None)
        discard = mask.np[:num_reqs] if mask is not None else np.zeros(num_reqs, bool)
        for i, rid in enumerate(req_ids[:num_reqs]):
            if rid in self.close_first and not discard[i] and not runner.requests[rid].output_token_ids:
                with torch.inference_mode():  # the logits are inference tensors
                    exec_state.logits[int(starts[i]), self.think_end] = FORCE_LOGIT
                self.close_first.discard(rid)

    # -- the step ----------------------------------------------------------------------------------
    def before_sample(self, runner, exec_state) -> None:
        if self._close_first_wanted(runner):
            self._force_close_first(runner, exec_state)
        sdm = exec_state.spec_decode_metadata
        aux = exec_state.aux_hidden_states
        if sdm is None or not aux:
            return
        self.counters["steps"] += 1
        num_reqs = len(sdm.num_draft_tokens)
        slots = self._batch_slots(runner, runner.input_batch.req_ids[:num_reqs])
        follow = self.follow[slots]  # slot -1 reads the last entry: False
        if hasattr(runner, "discard_request_mask"):
            discard = runner.discard_request_mask.np[:num_reqs]
            if discard.any():
                follow &= ~discard.astype(bool)
        fol = np.flatnonzero(follow)
        if len(fol) == 0:
            return  # SpecExit off or over for the whole batch: no device work at all
        n_drafts, start, k = self._n_drafts(sdm.num_draft_tokens)
        first_row = start  # of each followed request among the step's logit rows
        if len(fol) < num_reqs:  # device work only for the requests that still think
            first_row = start[fol]
            n_drafts, start, rows = _compact(n_drafts, start, fol)
            sig, tok, pos = self._host_rows(runner, sdm, aux, rows)
            slots = slots[fol]
        else:
            sig, tok, pos = self._host_rows(runner, sdm, aux)
        # one compiled loop over the followed requests: committed tokens, exit state, next step's rows
        self.rows.fit(k + 1)
        m = len(slots)
        width = len(self.rows.last_tok) + k
        stream = Stream(
            gen0=np.empty(m, np.int64),
            last_gen0=np.empty(m, np.int64),
            last_input0=np.empty(m, np.int64),
            lost=None,
            tok=np.empty((width, m), np.int64),
            sig=np.empty((width, m, len(SIGNALS))),
            valid=np.empty((width, m), np.bool_),
            n_commit=len(self.rows.last_tok),
        )
        ev = new_events(m)
        flags = np.empty(m, np.int8)
        self.kernels.step_rows(
            self.trackers.code_of,
            self.trackers.state(),
            self.rows.state(),
            slots,
            start,
            n_drafts,
            tok,
            sig,
            pos,
            self.pending,
            ev,
            (stream.gen0, stream.last_gen0, stream.last_input0, stream.tok, stream.sig, stream.valid),
            flags,
        )
        # Python per request only where needed: an event, lost track, a pending exit or thinking over
        todo = np.flatnonzero(flags & self.kernels.ATTENTION).tolist()
        if not todo:
            return
        stream.lost = (flags & self.kernels.LOST) != 0
        events = {e.row: e for e in scan_events(ev, stream.n_commit, [r for r in todo if ev[0][r] >= 0])}
        for r in todo:
            req_id = self.slot_req[int(slots[r])]
            st = self.reqs[req_id]
            try:
                j = self._per_request(req_id, st, stream, r, events.get(r))
            except Exception as e:  # noqa: BLE001 -- one request's failure must not kill the engine
                self._fall_back(req_id, st, f"error: {type(e).__name__}: {e}")
                continue
            if j is not None:
                with torch.inference_mode():  # the logits are inference tensors
                    exec_state.logits[int(first_row[r]) + j, self.think_end] = FORCE_LOGIT

    def _n_drafts(self, num_draft_tokens: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
        """Drafts per request, each request's first logit row and the most drafts (usually the same
        as last step)."""
        if num_draft_tokens != self._last_drafts[0]:
            n = np.asarray(num_draft_tokens, np.int64)
            start = np.zeros(len(n), np.int64)
            np.cumsum(n[:-1] + 1, out=start[1:])
            self._last_drafts = (list(num_draft_tokens), n, start, int(n.max()))
        return self._last_drafts[1], self._last_drafts[2], self._last_drafts[3]

    def _host_rows(self, runner, sdm, aux, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(signals [R, 3], token ids [R], positions [R]) of the logit rows `rows` (None: all):
        signals activated in float64 (as the reference computes them), token ids and positions exact.
        On a GPU in ONE device->host transfer; on CPU from one compiled loop over just those rows
        (`step_kernels.cpu_rows`). A row's signals do not depend on which other
        rows are computed with it (tests/unit/test_runner_hook_rows.py)."""
        idx = sdm.logits_indices
        ids, positions = _tensor(runner.input_ids), _tensor(runner.positions)
        w = self.model.signal_weight()
        if self._compiled_rows is None:  # the engine's device and dtype: the same every step
            # (the compiled loop multiplies the raw features: a drafter normalising fc's input takes the torch path)
            plain = getattr(self.model, "plain_fc_input", True)
            self._compiled_rows = idx.device.type == "cpu" and aux[0].dtype == torch.float32 and plain
        if self._compiled_rows:
            at = idx.numpy() if rows is None else idx.numpy()[rows]
            return self.kernels.cpu_rows(
                tuple(h.numpy() for h in aux), at, self._signal_blocks(w, aux), ids.numpy(), positions.numpy()
            )
        if rows is not None:
            idx = idx.index_select(0, torch.from_numpy(rows).to(idx.device))
        n = idx.shape[0]
        # logits_indices are increasing token indices: as many as tokens means all of them, in order
        whole = rows is None and n == aux[0].shape[0]
        feats = torch.cat(aux if whole else [h.index_select(0, idx) for h in aux], dim=-1)
        if not getattr(self.model, "plain_fc_input", True):
            feats = self.model.fc_input(feats)
        sig = activate(torch.nn.functional.linear(feats.to(w.dtype), w).double())
        ids, positions = (
            (ids[:n], positions[:n]) if whole else (ids.index_select(0, idx), positions.index_select(0, idx))
        )
        if sig.device.type == "cpu":  # a CPU engine in another dtype (bf16): no transfer at all
            return sig.numpy(), ids.numpy().astype(np.int64), positions.numpy().astype(np.int64)
        block = torch.cat([sig, ids.double()[:, None], positions.double()[:, None]], 1)
        host = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
        host.copy_(block, non_blocking=True)
        torch.cuda.current_stream(block.device).synchronize()  # the one wait: rows decide the logits
        out = host.numpy()
        return out[:, :3], out[:, 3].astype(np.int64), out[:, 4].astype(np.int64)

    def _signal_blocks(self, w: torch.Tensor, aux) -> np.ndarray:
        """The signal rows split per aux layer, [layers, 3, hidden] float32 (cached)."""
        key = (w.data_ptr(), len(aux), aux[0].shape[1])
        if self._blocks_key != key:
            self._blocks = np.ascontiguousarray(
                w.float().numpy().reshape(len(SIGNALS), len(aux), -1).transpose(1, 0, 2)
            )
            self._blocks_key = key
        return self._blocks

    def _per_request(self, req_id: str, st: _ReqState, stream: Stream, r: int, ev: ScanEvent | None) -> int | None:
        """The rare per-request part of a step: returns the logit row to force, if any."""
        if stream.lost[r]:
            g0, last = int(stream.gen0[r]), int(stream.last_gen0[r])
            if g0 > last:
                raise _LostTrack(f"committed tokens before {g0} were never seen as step inputs (last input 0: {last})")
            raise _LostTrack(f"input 0 went back or changed: token {g0} (last input 0: {last})")
        self._check_realised(req_id, st, stream, r)
        j = None
        if ev is not None:
            if ev.kind == ERROR:
                raise ValueError(f"signals of a token must be 3 finite numbers (column {ev.col} of this step)")
            gen = self._gen_index(stream, r, ev.col)
            dec = reported(ExitDecision(gen, ev.kind, ev.think_tokens, ev.smoothed), st.reserve)
            tok = int(stream.tok[ev.col, r])
            if not ev.committed:  # a split token among the drafts: force the token after it
                st.pending = (gen, tok, dec)
                j = ev.col - stream.n_commit + 1
            elif ev.col == stream.n_commit - 1:  # the split token is input 0: force the next token now
                st.pending = (gen, tok, dec)
                j = 0
            elif st.exit is None and (st.pending is None or st.pending[0] != gen):
                log.warning("specexit: exit for %s at token %d was not forced in time", req_id, gen)
        slot = st.slot
        self.pending[slot] = st.pending is not None
        if st.pending is None and (self.trackers.exited[slot] or self.trackers.ended[slot]):
            st.done = True  # answer tokens cost nothing from here on
            self.follow[slot] = False
        return j

    @staticmethod
    def _gen_index(stream: Stream, r: int, col: int) -> int:
        """Generated-token index of a stream column."""
        if col < stream.n_commit - 1:
            return int(stream.last_gen0[r]) + 1 + col
        return int(stream.gen0[r]) + col - (stream.n_commit - 1)

    def _check_realised(self, req_id: str, st: _ReqState, stream: Stream, r: int) -> None:
        """A forced exit counts once `</think>` is committed right after the split token."""
        if st.pending is None:
            return
        g, tok, dec = st.pending
        if int(stream.gen0[r]) + 1 <= g + 1:
            return  # not decided yet (a draft before the split token may still be pending)
        st.pending = None
        if stream.token_at(r, g) == tok and stream.token_at(r, g + 1) == self.think_end:
            st.exit = dec
            self.counters["exits"] += 1
            self.metrics.exit(dec.reason, dec.think_tokens)
            self.events.append(
                EXITS,
                {
                    "req_id": req_id,
                    "exit_index": dec.index,
                    "reason": dec.reason,
                    "think_tokens": dec.think_tokens,
                    "smoothed": dec.smoothed,
                },
            )
            self.counters["telemetry_errors"] = self.events.errors


def _compact(n_drafts, start, fol):
    """The followed requests' rows only: their drafts, first rows among the kept rows, and the
    kept rows' indices among the step's logit rows."""
    n = n_drafts[fol]
    k1 = n + 1
    first = np.zeros(len(fol), np.int64)
    np.cumsum(k1[:-1], out=first[1:])
    rows = np.repeat(start[fol] - first, k1) + np.arange(int(k1.sum()))
    return n, first, rows


def _tensor(buf) -> torch.Tensor:
    """The GPU runner keeps CpuGpuBuffers (`.gpu`), the CPU runner plain tensors."""
    return buf.gpu if hasattr(buf, "gpu") else buf


def _drafter_model(runner):
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is not None and hasattr(model, "unwrap"):
        model = model.unwrap()
    return model if model is not None and hasattr(model, "signal_weight") else None


def install_runner_hook() -> None:
    from vllm.v1.worker import gpu_model_runner as gmr

    cls = gmr.GPUModelRunner
    if getattr(cls, "_specexit_patched", False):
        return
    orig = cls.sample_tokens
    orig_propose = cls.propose_draft_token_ids
    orig_update = cls._update_states

    def sample_tokens(self, grammar_output):
        st = getattr(self, "_specexit", None)
        if st is None and not getattr(self, "_specexit_checked", False):
            self._specexit_checked = True
            model = _drafter_model(self)
            if model is not None:
                st = self._specexit = SpecExitRunnerState(self, model)
                self._specexit_long = LongModeState(self)
        long_mode = getattr(self, "_specexit_long", None)
        if long_mode is not None and self.execute_model_state is not None:
            try:  # first: the penalty rewrites whole rows; SpecExit's `</think>` forcing then holds
                long_mode.before_sample(self, self.execute_model_state)
            except Exception:  # noqa: BLE001 -- never take the engine down
                long_mode.counters["hook_errors"] += 1
                log.exception("specexit: long-mode hook failed for a whole step; sampling without it")
        if st is not None and self.execute_model_state is not None:
            try:
                st.before_sample(self, self.execute_model_state)
            except Exception:  # noqa: BLE001 -- never take the engine down: this step runs without exit
                st.counters["hook_errors"] += 1
                log.exception("specexit: exit hook failed for a whole step; sampling without it")
        return orig(self, grammar_output)

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        drafts = orig_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        long_mode = getattr(self, "_specexit_long", None)
        if long_mode is not None:
            try:
                drafts = long_mode.after_propose(self, sampled_token_ids, drafts)
            except Exception:  # noqa: BLE001 -- EAGLE-3's drafts stay
                long_mode.counters["hook_errors"] += 1
                log.exception("specexit: n-gram reuse failed for a whole step; EAGLE-3 drafts kept")
        return drafts

    def _update_states(self, scheduler_output):
        long_mode = getattr(self, "_specexit_long", None)
        if long_mode is not None and scheduler_output.finished_req_ids:
            try:
                long_mode.finish(scheduler_output.finished_req_ids)
            except Exception:  # noqa: BLE001
                long_mode.counters["hook_errors"] += 1
                log.exception("specexit: long-mode telemetry failed")
        return orig_update(self, scheduler_output)

    cls.sample_tokens = sample_tokens
    cls.propose_draft_token_ids = propose_draft_token_ids
    cls._update_states = _update_states
    cls._specexit_patched = True

    # worker methods for `collective_rpc("specexit_counters")` (strings: no pickled functions needed)
    from vllm.v1.worker.worker_base import WorkerBase

    WorkerBase.specexit_counters = runner_counters
    WorkerBase.specexit_live_request_ids = live_request_ids


def live_request_ids(worker) -> list[str]:
    """For `collective_rpc`: the request ids the SpecExit hook holds state for in this worker."""
    st = getattr(worker.model_runner, "_specexit", None)
    return sorted(st.reqs) if st is not None else []


def runner_counters(worker) -> dict:
    """For `collective_rpc`: this worker's SpecExit counters (requests, exits, steps, fallbacks,
    hook_errors, telemetry_errors) and the long mode's, prefixed `long_` (requests, n-gram / EAGLE-3
    drafted and accepted tokens, penalised_rows, fallbacks, hook_errors)."""
    st = getattr(worker.model_runner, "_specexit", None)
    out = dict(st.counters) if st is not None else {}
    long_mode = getattr(worker.model_runner, "_specexit_long", None)
    if long_mode is not None:
        out.update({f"long_{k}": v for k, v in long_mode.counters.items()})
    return out
