"""The exit inside vLLM's V1 model runner (`GPUModelRunner`, which `CPUModelRunner` subclasses).

Hook point: `sample_tokens`, after the target forward and before rejection sampling. For every
request the step's logit rows are [last committed token, draft_1 .. draft_k]; row j predicts the
token after input j. We compute the signals of the inputs from the target's aux hidden states
with the draft's `fc` signal rows (no extra forward pass), then replay the exit policy:

* committed tokens go through the request's persistent `ExitTracker` (signals of every earlier
  committed token are known);
* drafts go through a copy of it, hypothetically: if input j is a split token whose check passes,
  row j's `</think>` logit is set to 1e9. If drafts 1..j are accepted, the token after the split
  token is `</think>` -- exactly where the reference engine puts it; if one is rejected earlier,
  nothing happened and the next step decides again from the committed text.

Committed tokens are reconstructed from the step inputs alone (device `input_ids`/`positions` at
the logit rows): last step's inputs below this step's first position were committed, and input 0
is the newest committed token. `requests[id].output_token_ids` is never read: under async
scheduling (GPU default for EAGLE-3) it holds `-1` placeholders, one per draft of the previous
step, trimmed a step later; the device buffers hold the real tokens and positions (vLLM corrects
them on the device in `_prepare_inputs`). So the hook is the same with and without async.

The decision depends only on the committed tokens and their signals, never on how many drafts a
step accepted. A request whose exit logic fails (bad settings, lost track of its tokens) falls
back to no exit, with a `fallbacks-<pid>.jsonl` event; the engine and the other requests go on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from specexit_core.draft.config import read_specexit_fields
from specexit_core.exit import ExitConfig, ExitDecision, ExitTracker
from specexit_core.signals import activate
from specexit_core.vllm_plugin.controls import request_exit_config, server_defaults
from specexit_core.vllm_plugin.metrics import SpecExitMetrics
from specexit_core.vllm_plugin.telemetry import EXITS, FALLBACKS, TELEMETRY_DIR_ENV, EventWriter

log = logging.getLogger("specexit.vllm")
FORCE_LOGIT = 1e9
_TOK, _POS = 3, 4  # columns of a host row: confidence, progress, remaining, token id, position


@dataclass
class _ReqState:
    cfg: ExitConfig | None
    tracker: ExitTracker | None  # None: SpecExit off for this request (or fallen back)
    n_prompt: int
    committed: list[int] = field(default_factory=list)  # generated tokens known to be committed
    appended: int = 0  # committed tokens fed to the tracker
    n_sig: int = 0  # signals fed to the tracker
    sigs: dict[int, tuple[float, float, float]] = field(default_factory=dict)  # generated idx -> signals
    step_gen0: int = 0  # generated idx of last step's input 0
    step_rows: list = field(default_factory=list)  # last step's host rows
    pending: tuple[int, int, ExitDecision] | None = None  # forced: (split token idx, token, decision)
    exit: ExitDecision | None = None  # realised exit
    fallback: str | None = None  # why this request runs without exit
    done: bool = False  # thinking over (exited or `</think>` committed): nothing left to decide


class _LostTrack(RuntimeError):
    """The committed tokens cannot be reconstructed (a step the hook did not see)."""


class SpecExitRunnerState:
    """Per-runner state: ids, defaults, per-request trackers, counters."""

    def __init__(self, runner, drafter_model):
        self.model = drafter_model
        spec = read_specexit_fields(drafter_model.config)
        ids = spec.token_ids or {}
        missing = [k for k in ("think_start", "think_end", "split") if k not in ids]
        if missing:
            raise ValueError(f"SpecExit draft config lacks specexit.token_ids {missing}")
        self.think_start, self.think_end = int(ids["think_start"]), int(ids["think_end"])
        self.split_ids = frozenset(int(t) for t in ids["split"])
        self.defaults = server_defaults(spec.exit_defaults)
        self.reqs: dict[str, _ReqState] = {}
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
            extra = rs.sampling_params.extra_args if rs.sampling_params is not None else None
            st = self.reqs[req_id] = _ReqState(cfg=None, tracker=None, n_prompt=rs.num_prompt_tokens)
            self.counters["requests"] += 1
            try:  # the front end validated against the same defaults; this is the safety net
                st.cfg = request_exit_config(extra, self.defaults)
            except Exception as e:  # noqa: BLE001
                self._fall_back(req_id, st, f"invalid SpecExit settings: {e}")
                return st
            if st.cfg.enabled:
                st.tracker = ExitTracker(
                    st.cfg,
                    split_token_ids=self.split_ids,
                    think_start_id=self.think_start,
                    think_end_id=self.think_end,
                    in_think=True,
                )
            self.metrics.request(st.cfg.enabled)
        return st

    def prune(self, runner) -> None:
        for rid in [r for r in self.reqs if r not in runner.requests]:
            st = self.reqs.pop(rid)
            if st.tracker is not None:
                self.counters["think_tokens"] += st.tracker.think_tokens
                self.metrics.finished(st.tracker.think_tokens)

    def _fall_back(self, req_id: str, st: _ReqState, reason: str) -> None:
        """This request runs on without SpecExit; the engine and every other request are untouched."""
        st.tracker, st.pending, st.fallback = None, None, reason
        st.sigs.clear()
        st.step_rows = []
        self.counters["fallbacks"] += 1
        log.warning("specexit: request %s continues without early exit: %s", req_id, reason)
        self.events.append(FALLBACKS, {"req_id": req_id, "fallback": reason})
        self.counters["telemetry_errors"] = self.events.errors

    # -- the step ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def before_sample(self, runner, exec_state) -> None:
        sdm = exec_state.spec_decode_metadata
        aux = exec_state.aux_hidden_states
        if sdm is None or not aux:
            return
        self.counters["steps"] += 1
        self.prune(runner)
        num_reqs = len(sdm.num_draft_tokens)
        req_ids = runner.input_batch.req_ids[:num_reqs]
        states = [self.reqs.get(r) or self._state(runner, r) for r in req_ids]
        if all(st.tracker is None or st.done for st in states):
            return  # SpecExit off for the whole batch: no device work at all
        rows = self._host_rows(runner, sdm, aux)
        cu = [0, *accumulate(n + 1 for n in sdm.num_draft_tokens)]  # host-side: no device sync
        discard = runner.discard_request_mask.np[:num_reqs] if hasattr(runner, "discard_request_mask") else None
        logits = exec_state.logits
        for r, st in enumerate(states):
            if st.tracker is None or st.done or (discard is not None and discard[r]):
                continue
            start = cu[r]
            try:
                j = self._step(runner, req_ids[r], st, rows[start : cu[r + 1]])
            except Exception as e:  # noqa: BLE001 -- one request's failure must not kill the engine
                self._fall_back(req_ids[r], st, f"error: {type(e).__name__}: {e}")
                continue
            if j is not None:
                logits[start + j, self.think_end] = FORCE_LOGIT

    def _host_rows(self, runner, sdm, aux) -> list[list[float]]:
        """[confidence, progress, remaining, token, position] per logit row, in ONE device->host
        transfer: signals activated on the device (float64, as the reference computes them), token
        ids and positions exact in float64."""
        idx = sdm.logits_indices
        w = self.model.signal_weight()
        raw = (torch.cat([h[idx] for h in aux], dim=-1).to(w.dtype) @ w.t()).double()
        block = torch.cat(
            [
                activate(raw),
                _tensor(runner.input_ids)[idx].double()[:, None],
                _tensor(runner.positions)[idx].double()[:, None],
            ],
            1,
        )
        if block.device.type != "cpu":
            host = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
            host.copy_(block, non_blocking=True)
            torch.cuda.current_stream(block.device).synchronize()  # the one wait: rows decide the logits
            block = host
        return block.tolist()

    def _step(self, runner, req_id: str, st: _ReqState, rows: list[list[float]]) -> int | None:
        gen0 = int(rows[0][_POS]) - st.n_prompt
        if gen0 < 0:  # prefill row: the input is a prompt token
            return None
        self._commit(runner, req_id, st, gen0, rows)
        return self._decide(req_id, st, [int(x[_TOK]) for x in rows])

    def _commit(self, runner, req_id: str, st: _ReqState, gen0: int, rows) -> None:
        """Last step's inputs below `gen0` were committed (its input 0 and accepted drafts; rejected
        drafts sat at indices >= gen0); this step's input 0 is the newest committed token."""
        committed = st.committed
        for i, x in enumerate(st.step_rows):
            g = st.step_gen0 + i
            if g >= gen0:
                break
            if g == len(committed):
                committed.append(int(x[_TOK]))
            st.sigs[g] = (x[0], x[1], x[2])
        if gen0 == len(committed):
            committed.append(int(rows[0][_TOK]))
        elif gen0 > len(committed):
            raise _LostTrack(f"committed tokens {len(committed)}..{gen0 - 1} were never seen as step inputs")
        elif committed[gen0] != int(rows[0][_TOK]):
            raise _LostTrack(f"token {gen0} changed from {committed[gen0]} to {int(rows[0][_TOK])}")
        st.sigs[gen0] = (rows[0][0], rows[0][1], rows[0][2])
        st.step_gen0, st.step_rows = gen0, rows

    def _decide(self, req_id: str, st: _ReqState, inputs: list[int]) -> int | None:
        out = st.committed
        tr = st.tracker
        self._check_realised(req_id, st, out)
        if tr.exited:
            st.done = st.pending is None  # answer tokens cost nothing from here on
            return None
        # 1) catch the committed tracker up; the last committed token is input 0
        for g in range(st.appended, len(out)):
            self._feed_signals(st, tr, upto=g)
            dec = tr.append(out[g])
            st.appended = g + 1
            if dec is not None:
                if g == len(out) - 1:  # the split token is input 0: force the next token now
                    st.pending = (g, out[g], dec)
                    return 0
                if st.exit is None and (st.pending is None or st.pending[0] != g):
                    log.warning("specexit: exit for %s at token %d was not forced in time", req_id, g)
                return None
        if not tr.in_think:
            st.done = st.pending is None
            return None
        if len(inputs) == 1:
            return None
        # Only a split token among the drafts (or a budget that ends within them) can force an
        # exit this step; most steps have neither, and skip the look-ahead copy entirely.
        budget = tr.cfg.max_think_tokens
        if (budget is None or tr.think_tokens + len(inputs) - 1 < budget) and not any(
            t in self.split_ids for t in inputs[1:]
        ):
            return None
        # 2) hypothetically, drafts 1..k (a copy: the committed state only moves on real tokens)
        hyp = tr.fork()
        rows = st.step_rows
        for j in range(1, len(inputs)):
            if j > 1:
                hyp.add_signal(rows[j - 1][:3])
            dec = hyp.append(inputs[j])
            if dec is not None:
                st.pending = (st.step_gen0 + j, inputs[j], dec)
                return j
            if not hyp.in_think:
                return None
        return None

    def _check_realised(self, req_id: str, st: _ReqState, out: list[int]) -> None:
        """A forced exit counts once `</think>` is committed right after the split token."""
        if st.pending is None:
            return
        g, tok, dec = st.pending
        if len(out) <= g + 1:
            return  # not decided yet (a draft before the split token may still be pending)
        st.pending = None
        if out[g] == tok and out[g + 1] == self.think_end:
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

    @staticmethod
    def _feed_signals(st: _ReqState, tr: ExitTracker, upto: int) -> None:
        while st.n_sig <= upto and st.n_sig in st.sigs:
            tr.add_signal(st.sigs.pop(st.n_sig))
            st.n_sig += 1


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

    def sample_tokens(self, grammar_output):
        st = getattr(self, "_specexit", None)
        if st is None and not getattr(self, "_specexit_checked", False):
            self._specexit_checked = True
            model = _drafter_model(self)
            if model is not None:
                st = self._specexit = SpecExitRunnerState(self, model)
        if st is not None and self.execute_model_state is not None:
            try:
                st.before_sample(self, self.execute_model_state)
            except Exception:  # noqa: BLE001 -- never take the engine down: this step runs without exit
                st.counters["hook_errors"] += 1
                log.exception("specexit: exit hook failed for a whole step; sampling without it")
        return orig(self, grammar_output)

    cls.sample_tokens = sample_tokens
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
    hook_errors, telemetry_errors)."""
    st = getattr(worker.model_runner, "_specexit", None)
    return dict(st.counters) if st is not None else {}
