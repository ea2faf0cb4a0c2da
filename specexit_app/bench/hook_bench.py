"""`specexit bench hook`: what the SpecExit runner hook adds to one engine step, on this CPU.

Drives `SpecExitRunnerState.before_sample` with synthetic V1-runner state shaped like a decode
step of vLLM with EAGLE-3 (k drafts per request, logit rows [last committed, draft_1..k], aux
hidden states of 3 layers, token ids and positions in the runner's buffers), no engine needed.
Each step commits a random number of drafts per request (rejected drafts are replaced), a share
of the tokens are split tokens, and every request has SpecExit on (the costly case).

`step_us_without_hook` is the sampling work of the same step without the hook, for scale: greedy
rejection sampling of those logits (argmax per row, accept the drafts' longest matching prefix).
The `detail` line also splits the hook's time: `signals_us_*` is its rows' part alone (the aux
layers through the draft's fc signal rows and `activate`, with token ids and positions: torch work
that a GPU engine runs as device kernels and one transfer, here CPU work), timed by a second call
on the same step; `hook_cpu_us_*` is the
hook's CPU time (the thread's, so other jobs' preemption is left out: on a shared machine the
steadier figure).
The synthetic state (`SyntheticDrafter`, `SyntheticRunner`) is also what the hook's unit tests use.

Output: a `setup` line (with the load average before and after: on a shared machine other jobs
inflate every figure), a `detail` line (min and median per size; the min is the closest to the
cost itself), and last the public line `{"hook_us_per_step": ..., "step_us_without_hook": ...}`
(means per step).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from specexit_core.exit import SIGNALS

THINK_START, THINK_END, SPLIT = 1, 2, 3
SIZES = (1, 16, 64, 256)


class SyntheticDrafter:
    """What the hook reads from the drafter: its config's `specexit` block and the signal rows."""

    def __init__(self, hidden: int = 64, exit_defaults: dict | None = None, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.hidden = hidden
        self.config = SimpleNamespace(
            specexit={
                "signals": list(SIGNALS),
                "exit_defaults": exit_defaults,
                "token_ids": {"think_start": THINK_START, "think_end": THINK_END, "split": [SPLIT]},
            }
        )
        self.weight = torch.randn(len(SIGNALS), 3 * hidden, generator=g) / (3 * hidden) ** 0.5

    def signal_weight(self) -> torch.Tensor:
        return self.weight


@dataclass
class SyntheticRequest:
    sampling_params: SimpleNamespace
    num_prompt_tokens: int
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)


class SyntheticRunner:
    """The V1 runner's fields the hook reads (`requests`, `input_batch.req_ids`, `input_ids`,
    `positions`), plus `step(...)` that lays out one decode step and returns the exec state."""

    def __init__(self):
        self.requests: dict[str, SyntheticRequest] = {}
        self.input_batch = SimpleNamespace(req_ids=[])
        self.input_ids = torch.zeros(0, dtype=torch.int32)
        self.positions = torch.zeros(0, dtype=torch.int64)

    def add(
        self,
        req_id: str,
        n_prompt: int,
        extra_args: dict | None = None,
        max_tokens: int = 100_000,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        """A request; its `max_tokens` (vLLM's engine always has one) far off unless a test sets it; its
        prompt ids only when a test needs them (vLLM's are None for a prompt given as embeddings)."""
        sp = SimpleNamespace(extra_args=extra_args, max_tokens=max_tokens)
        self.requests[req_id] = SyntheticRequest(sp, n_prompt, prompt_token_ids)

    def step(self, batch: list[tuple[str, list[int], int]], aux: list[torch.Tensor], vocab: int):
        """batch: (req_id, input tokens [last committed, drafts...], position of input 0)."""
        self.input_batch.req_ids = [r for r, _, _ in batch]
        toks = [t for _, ts, _ in batch for t in ts]
        pos = [p + i for _, ts, p in batch for i in range(len(ts))]
        self.input_ids = torch.tensor(toks, dtype=torch.int32)
        self.positions = torch.tensor(pos, dtype=torch.int64)
        n = len(toks)
        counts = torch.tensor([len(ts) for _, ts, _ in batch])
        sdm = SimpleNamespace(
            num_draft_tokens=[len(ts) - 1 for _, ts, _ in batch],
            cu_num_sampled_tokens=counts.cumsum(0),
            logits_indices=torch.arange(n),
        )
        return SimpleNamespace(spec_decode_metadata=sdm, aux_hidden_states=aux, logits=torch.zeros(n, vocab))


def greedy_rejection(logits: torch.Tensor, draft: torch.Tensor, num_draft: list[int]) -> torch.Tensor:
    """Greedy rejection sampling, batched: the sampler's work for one step (the baseline)."""
    target = logits.argmax(dim=-1)
    k = max(num_draft)
    t = target.view(len(num_draft), k + 1)  # equal k per request in this bench
    match = (t[:, :k] == draft.view(len(num_draft), k)).int().cumprod(dim=1)
    return match.sum(dim=1)


def run_hook_bench(
    sizes=SIZES,
    k: int = 3,
    steps: int = 40,
    warmup: int = 5,
    split_share: float = 0.05,
    accept: float = 0.7,
    hidden: int = 64,
    vocab: int = 4096,
    seed: int = 0,
) -> dict:
    """Mean microseconds per step by size (the two public keys), and in `detail` the min and median
    of both: on a shared machine the mean carries other jobs' load, the min is closest to the cost
    itself, and hook/without-hook ratios are what compares across machines."""
    rng = random.Random(seed)
    hook_us: dict[str, float] = {}
    base_us: dict[str, float] = {}
    detail: dict[str, dict[str, float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # an engine step's host work is single-threaded Python + small ops
    try:
        for n in sizes:
            t = _bench_size(n, k, steps, warmup, split_share, accept, hidden, vocab, seed, rng)
            hook_us[str(n)] = _us(statistics.fmean(t["hook"]))
            base_us[str(n)] = _us(statistics.fmean(t["base"]))
            detail[str(n)] = {
                "hook_us_min": _us(min(t["hook"])),
                "hook_us_median": _us(statistics.median(t["hook"])),
                "without_hook_us_min": _us(min(t["base"])),
                "without_hook_us_median": _us(statistics.median(t["base"])),
                "hook_cpu_us_min": _us(min(t["hook_cpu"])),
                "hook_cpu_us_median": _us(statistics.median(t["hook_cpu"])),
                "signals_us_min": _us(min(t["signals"])),
                "signals_us_median": _us(statistics.median(t["signals"])),
            }
    finally:
        torch.set_num_threads(threads)
    return {"hook_us_per_step": hook_us, "step_us_without_hook": base_us, "detail": detail}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _bench_size(n, k, steps, warmup, split_share, accept, hidden, vocab, seed, rng) -> dict[str, list[float]]:
    from specexit_core.vllm_plugin.runner_hook import SpecExitRunnerState

    runner = SyntheticRunner()
    drafter = SyntheticDrafter(hidden=hidden, seed=seed)
    state = SpecExitRunnerState(runner, drafter)
    committed: dict[str, list[int]] = {}
    for i in range(n):
        rid = f"r{i}"
        runner.add(rid, n_prompt=100, extra_args={"specexit_method": "progress", "specexit_progress_threshold": 0.999})
        committed[rid] = [rng.randrange(4, vocab)]

    def token() -> int:
        return SPLIT if rng.random() < split_share else rng.randrange(4, vocab)

    times: dict[str, list[float]] = {"hook": [], "base": [], "hook_cpu": [], "signals": []}
    for s in range(warmup + steps):
        batch = []
        for rid, c in committed.items():
            batch.append((rid, [c[-1]] + [token() for _ in range(k)], 100 + len(c) - 1))
        rows = len(batch) * (k + 1)
        aux = [torch.randn(rows, hidden) for _ in range(3)]
        ex = runner.step(batch, aux, vocab)
        c0, t0 = time.thread_time(), time.perf_counter()
        state.before_sample(runner, ex)
        t1, c1 = time.perf_counter(), time.thread_time()
        draft = torch.tensor([t for _, ts, _ in batch for t in ts[1:]])
        greedy_rejection(ex.logits, draft, ex.spec_decode_metadata.num_draft_tokens)
        t2 = time.perf_counter()
        state._host_rows(runner, ex.spec_decode_metadata, ex.aux_hidden_states)  # reads only: same work again
        t3 = time.perf_counter()
        if s >= warmup:
            for key, v in (("hook", t1 - t0), ("base", t2 - t1), ("hook_cpu", c1 - c0), ("signals", t3 - t2)):
                times[key].append(v)
        for rid, ts, _ in batch:  # commit: accepted drafts + one target token
            a = 0
            while a < k and rng.random() < accept:
                a += 1
            committed[rid].extend(ts[1 : 1 + a] + [token()])
    return times


def main(sizes=SIZES, steps: int = 40, as_json: bool = True) -> int:
    setup = {
        "k": 3,
        "steps": steps,
        "split_share": 0.05,
        "accept": 0.7,
        "vocab": 4096,
        "hidden": 64,
        "torch_threads": 1,
    }
    load_before = os.getloadavg()
    res = run_hook_bench(sizes=sizes, steps=steps)
    detail = res.pop("detail")
    setup["load_average"] = {
        "before": [round(x, 2) for x in load_before],
        "after": [round(x, 2) for x in os.getloadavg()],
    }
    if not as_json:
        for n in res["hook_us_per_step"]:
            print(
                f"{n:>4} requests: hook {res['hook_us_per_step'][n]:9.1f} us/step, "
                f"sampling without hook {res['step_us_without_hook'][n]:9.1f} us/step"
            )
    print(json.dumps({"setup": setup}))
    print(json.dumps({"detail": detail}))
    print(json.dumps(res))
    return 0
