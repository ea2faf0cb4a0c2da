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

The decision therefore depends only on the committed tokens and their signals, never on how many
drafts a step accepted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field

import torch

from specexit_core.draft.config import read_specexit_fields
from specexit_core.exit import ExitConfig, ExitDecision, ExitTracker
from specexit_core.vllm_plugin.controls import request_exit_config, server_defaults
from specexit_core.vllm_plugin.metrics import SpecExitMetrics

log = logging.getLogger("specexit.vllm")
FORCE_LOGIT = 1e9


@dataclass
class _ReqState:
    cfg: ExitConfig
    tracker: ExitTracker | None  # None: SpecExit off for this request
    n_prompt: int
    appended: int = 0  # output tokens fed to the tracker
    n_sig: int = 0  # signals fed to the tracker
    sigs: dict[int, tuple[float, float, float]] = field(default_factory=dict)  # generated idx -> signals
    step_inputs: list[int] = field(default_factory=list)  # generated idx of this step's inputs
    step_sigs: list[tuple[float, float, float]] = field(default_factory=list)
    pending: tuple[int, int, ExitDecision] | None = None  # forced: (split token idx, token, decision)
    exit: ExitDecision | None = None  # realised exit


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
        self.counters = {"requests": 0, "exits": 0, "think_tokens": 0, "steps": 0}
        self.metrics = SpecExitMetrics()
        self.event_dir = os.environ.get("SPECEXIT_TELEMETRY_DIR")
        log.info("SpecExit active: defaults %s, split ids %s", self.defaults.to_dict(), sorted(self.split_ids))

    # -- request bookkeeping -------------------------------------------------------------------
    def _state(self, runner, req_id: str) -> _ReqState:
        st = self.reqs.get(req_id)
        if st is None:
            rs = runner.requests[req_id]
            extra = rs.sampling_params.extra_args if rs.sampling_params is not None else None
            cfg = request_exit_config(extra, self.defaults)  # validated in the front end already
            tracker = (ExitTracker(cfg, split_token_ids=self.split_ids, think_start_id=self.think_start,
                                   think_end_id=self.think_end, in_think=True) if cfg.enabled else None)
            st = self.reqs[req_id] = _ReqState(cfg=cfg, tracker=tracker, n_prompt=rs.num_prompt_tokens)
            self.counters["requests"] += 1
            self.metrics.request(cfg.enabled)
        return st

    def prune(self, runner) -> None:
        for rid in [r for r in self.reqs if r not in runner.requests]:
            st = self.reqs.pop(rid)
            if st.tracker is not None:
                self.counters["think_tokens"] += st.tracker.think_tokens
                self.metrics.finished(st.tracker.think_tokens)

    # -- the step ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def before_sample(self, runner, exec_state) -> None:
        sdm = exec_state.spec_decode_metadata
        aux = exec_state.aux_hidden_states
        if sdm is None or not aux:
            return
        self.counters["steps"] += 1
        self.prune(runner)
        idx = sdm.logits_indices
        # Few torch ops per step (each costs microseconds of dispatch on a tiny model): one
        # gather per aux layer, one matmul, one transfer; the 3 activations of a few rows are
        # cheaper in plain Python than as more tensor ops.
        w = self.model.signal_weight()
        raw = (torch.cat([h[idx] for h in aux], dim=-1).to(w.dtype) @ w.t()).tolist()
        sig = [_activate(r) for r in raw]
        toks = _tensor(runner.input_ids)[idx].tolist()
        pos = _tensor(runner.positions)[idx].tolist()
        cu = sdm.cu_num_sampled_tokens.tolist()
        num_reqs = len(cu)
        discard = runner.discard_request_mask.np[:num_reqs] if hasattr(runner, "discard_request_mask") else None
        logits = exec_state.logits
        for r, req_id in enumerate(runner.input_batch.req_ids[:num_reqs]):
            if discard is not None and discard[r]:
                continue
            st = self._state(runner, req_id)
            if st.tracker is None:
                continue
            start = cu[r - 1] if r else 0
            rows = range(start, cu[r])
            gen = [pos[i] - st.n_prompt for i in rows]
            if gen[0] < 0:  # prefill row: the input is a prompt token
                continue
            # Last step's inputs below this step's first input were committed (input 0 and the
            # accepted drafts); rejected drafts sat at indices >= gen[0]. No need to see the
            # sampler output, so this also holds with async scheduling.
            for g, v in zip(st.step_inputs, st.step_sigs):
                if g < gen[0]:
                    st.sigs[g] = v
            st.step_inputs = gen
            st.step_sigs = [tuple(sig[i]) for i in rows]
            st.sigs[gen[0]] = st.step_sigs[0]  # input 0 is the last committed token
            j = self._decide(runner, req_id, st, [toks[i] for i in rows])
            if j is not None:
                logits[start + j, self.think_end] = FORCE_LOGIT

    def _decide(self, runner, req_id: str, st: _ReqState, inputs: list[int]) -> int | None:
        out = runner.requests[req_id].output_token_ids
        tr = st.tracker
        self._check_realised(req_id, st, out)
        if tr.exited:
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
        if not tr.in_think or len(inputs) == 1:
            return None
        # Only a split token among the drafts (or a budget that ends within them) can force an
        # exit this step; most steps have neither, and skip the look-ahead copy entirely.
        budget = tr.cfg.max_think_tokens
        if (budget is None or tr.think_tokens + len(inputs) - 1 < budget) and \
                not any(t in self.split_ids for t in inputs[1:]):
            return None
        # 2) hypothetically, drafts 1..k (a copy: the committed state only moves on real tokens)
        hyp = tr.fork()
        for j in range(1, len(inputs)):
            if j > 1:
                hyp.add_signal(st.step_sigs[j - 1])
            dec = hyp.append(inputs[j])
            if dec is not None:
                st.pending = (st.step_inputs[j], inputs[j], dec)
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
            self._emit(req_id, st)

    @staticmethod
    def _feed_signals(st: _ReqState, tr: ExitTracker, upto: int) -> None:
        while st.n_sig <= upto and st.n_sig in st.sigs:
            tr.add_signal(st.sigs.pop(st.n_sig))
            st.n_sig += 1

    def _emit(self, req_id: str, st: _ReqState) -> None:
        if not self.event_dir:
            return
        ev = {"req_id": req_id, "time": time.time(), "exit_index": st.exit.index, "reason": st.exit.reason,
              "think_tokens": st.exit.think_tokens, "smoothed": st.exit.smoothed}
        os.makedirs(self.event_dir, exist_ok=True)
        with open(os.path.join(self.event_dir, f"exits-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(ev) + "\n")


def _activate(raw: list[float]) -> tuple[float, float, float]:
    """fc signal logits -> (confidence, progress, remaining): sigmoid, sigmoid, expm1 of log1p."""
    c, p, r = raw
    return (_sigmoid(c), _sigmoid(p), max(math.expm1(min(r, 20.0)), 0.0))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


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
            st.before_sample(self, self.execute_model_state)
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
    """For `collective_rpc`: this worker's SpecExit counters (requests, exits, steps)."""
    st = getattr(worker.model_runner, "_specexit", None)
    return dict(st.counters) if st is not None else {}
