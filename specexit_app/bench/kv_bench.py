"""`specexit bench kv`: what the tiered KV connector and SpecExit's early exit save in KV, on the toy.

(a) restart: long prompts (a system prompt plus a multi-turn history of toy problems and the
    teacher's own traces, a few hundred tokens each, every prompt with its own prefix) go to engine
    A with the connector (directory tier in a temporary folder), which writes their blocks; A is
    shut down and a NEW engine B starts on the same folder (a restart). B and an engine C without the
    connector then serve the same prompts, one at a time, interleaved: B's share of the prompts' full
    blocks loaded from the connector, prefill tokens computed and time to first token, each B / C, and
    whether B's greedy output equals C's (and A's).
(b) pressure: one SpecExit engine (the shipped draft) with a fixed, small KV pool
    (`num_gpu_blocks_override`), long reasoning requests (toy problems with 5-6 operations) submitted
    together, with the exit disabled ("eagle3": thresholds that never fire, same draft, same engine)
    and enabled ("specexit"). Per method: the largest concurrency served without any preemption
    (sweep 1, 2, ... until one preempts), then one wave of `pressure_requests` at once: preemptions,
    completed requests and KV block-seconds per request (bench/kv_measures.py). Then the same waves
    on an engine whose connector keeps blocks in a host-memory tier, generated blocks included
    (`save_generated`): a request preempted to free KV reloads its prompt and output blocks when it
    resumes instead of recomputing them ("pressure_host_tier": resumed requests, blocks they loaded,
    wall time vs the wave without it, greedy output identical to it).
Engines are shut down between phases. Times are wall times on this machine: compare ratios.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from pydantic import Field

from specexit_app.bench import kv_measures as km
from specexit_app.bench.methods import rotated
from specexit_app.bench.step_trace import attach_counters, run_requests
from specexit_core.exit import NEVER_FIRES, load_exit_overrides
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.toy.task import MAX_OPS, grade, problems
from specexit_core.toy.traces import make_trace
from specexit_core.typed_config import StrictModel
from specexit_core.vllm_env import apply_cpu_defaults, in_process_engine_env, toy_llm_kwargs

log = logging.getLogger("specexit.bench.kv")
MAX_MODEL_LEN = 512  # the toy teacher's positions (toy_llm_kwargs)
DIR_WAIT_S = 60.0  # engine A's background writer publishes block files after the request returns


class KVBenchConfig(StrictModel):
    restart_prompts: int = Field(4, ge=1)  # long prompts, each with its own prefix
    history_tokens: int = Field(352, ge=64)  # a restart prompt's length, at most (system + turns)
    restart_max_tokens: int = Field(100, ge=1)  # greedy tokens compared with and without the connector
    block_size: int = Field(32, ge=32)  # the CPU backend takes multiples of 32
    num_blocks: int = Field(64, ge=17)  # the pressure KV pool; >= max_model_len / block_size + 1
    max_concurrency: int = Field(32, ge=1)  # the sweep's upper end
    pressure_requests: int | None = Field(None, ge=1)  # the pressure wave (default: max_concurrency)
    max_tokens: int = Field(400, ge=1)  # per pressure request
    num_speculative_tokens: int = Field(3, ge=1)
    exit_config: str | None = None  # calibrated exit JSON for "specexit"; None: the draft's defaults
    host_tier_bytes: int = Field(256 << 20, ge=1 << 20)  # the pressure connector's host tier (per worker)


# ------------------------------------------------------------------ prompts
def restart_prompts(tok, n: int, max_len: int) -> list[list[int]]:
    """n chat prompts of at most `max_len` tokens: a system message (distinct per prompt, so prompts
    share no block), earlier turns (a toy problem and the teacher-style trace answering it), and a
    new question, ending in the generation prompt."""
    probs = problems("train", 40 * n, seed=7)
    rng = random.Random(7)
    out = []
    for i in range(n):
        own = probs[40 * i : 40 * (i + 1)]
        system = f"Compute from left to right . {own[0].text} = {own[0].answer} . So the answer is {own[0].answer} ."
        question = {"role": "user", "content": own[-1].prompt}
        msgs = [{"role": "system", "content": system}]
        for p in own[1:-1]:
            turn = [
                {"role": "user", "content": p.prompt},
                {"role": "assistant", "content": make_trace(p, rng).completion},
            ]
            if len(_ids(tok, msgs + turn + [question])) <= max_len:  # else a shorter turn may still fit
                msgs += turn
        ids = _ids(tok, msgs + [question])
        if len(ids) > max_len or len(msgs) < 3:
            raise ValueError(f"history_tokens {max_len} leaves no room for a turn")
        out.append(ids)
    return out


def _ids(tok, msgs) -> list[int]:
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def long_reasoning_prompts(tok, n: int) -> tuple[list[list[int]], list[int]]:
    """The first n toy test problems with 5-6 operations (the longest traces), as prompt ids and answers."""
    from specexit_core.toy.teacher_eval import prompt_ids

    probs = [p for p in problems("test", 60 * n, seed=1234) if len(p.steps) >= MAX_OPS - 1][:n]
    if len(probs) < n:
        raise ValueError(f"only {len(probs)} long toy problems for {n} requests")
    return [prompt_ids(tok, p) for p in probs], [p.answer for p in probs]


# ------------------------------------------------------------------ engines
def _make(**overrides):
    from vllm import LLM

    return LLM(**toy_llm_kwargs(str(TEACHER_DIR), disable_log_stats=False, **overrides))


def _shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


@contextmanager
def _engine(**overrides):
    llm = _make(**overrides)
    try:
        yield llm
    finally:
        _shutdown(llm)


def _greedy(max_tokens: int, extra_args: dict | None = None):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=extra_args)


def _warm(llm, tok) -> None:
    """One short toy request first, so the first measured one pays no first-forward costs."""
    from specexit_core.toy.teacher_eval import prompt_ids

    run_requests(llm, [prompt_ids(tok, problems("dev", 1)[0])], _greedy(2))


# ------------------------------------------------------------------ (a) restart
def _read_stats(stats_dir: Path) -> dict:
    (f,) = stats_dir.glob("kv-stats-*.json")
    return json.loads(f.read_text())


def _wait_for_blocks(directory: Path, namespace: str, prompts, block_size: int) -> int:
    from specexit_core.kv_cache.block_keys import prefix_block_keys
    from specexit_core.kv_cache.directory_tier import DirectoryTier

    tier = DirectoryTier(directory, "tp0-pp0")
    keys = {k for p in prompts for k in prefix_block_keys(namespace, p, block_size)}
    deadline = time.monotonic() + DIR_WAIT_S
    while not all(tier.contains(k) for k in keys) and time.monotonic() < deadline:
        time.sleep(0.2)
    return sum(tier.contains(k) for k in keys)


def run_restart(cfg: KVBenchConfig, tok, root: Path) -> dict:
    from specexit_core.kv_cache.settings import kv_transfer_config

    prompts = restart_prompts(tok, cfg.restart_prompts, cfg.history_tokens)
    if max(map(len, prompts)) + cfg.restart_max_tokens > MAX_MODEL_LEN:
        raise ValueError(f"history_tokens + restart_max_tokens exceed the toy's {MAX_MODEL_LEN} positions")
    bs, sp = cfg.block_size, _greedy(cfg.restart_max_tokens)
    directory = root / "blocks"

    def connector(stats: str) -> dict:
        return kv_transfer_config(str(directory), stats_dir=str(root / stats), host_bytes=64 << 20)

    with _engine(block_size=bs) as plain:  # C: no connector, alive through both connector engines
        with _engine(block_size=bs, kv_transfer_config=connector("stats_a")) as a:
            a_out = [run_requests(a, [p], sp).requests[0].token_ids for p in prompts]
            ns = _read_stats(root / "stats_a")["namespace"]
        written = _wait_for_blocks(directory, ns, prompts, bs)
        with _engine(block_size=bs, kv_transfer_config=connector("stats_b")) as b:
            _warm(b, tok)
            _warm(plain, tok)
            got: dict[str, list] = {"b": [], "c": []}
            for i, p in enumerate(prompts):  # interleaved, alternating who goes first
                for name in rotated(["b", "c"], i):
                    got[name].append(run_requests(b if name == "b" else plain, [p], sp).requests[0])
            stats = _read_stats(root / "stats_b")["scheduler"]

    def prefill(rs) -> int:
        return sum(r.prompt_len - r.num_cached_tokens for r in rs)

    def ttft(rs) -> float:
        return statistics.mean(r.ttft_s for r in rs)

    b_ids, c_ids = [r.token_ids for r in got["b"]], [r.token_ids for r in got["c"]]
    matched = stats["matched_blocks_host"] + stats["matched_blocks_directory"]
    return {
        "hit_share": km.ratio(matched, stats["prompt_blocks"]),
        "prefill_tokens_ratio": km.ratio(prefill(got["b"]), prefill(got["c"])),
        "ttft_ratio": km.ratio(ttft(got["b"]), ttft(got["c"])),
        "identical": b_ids == c_ids and a_out == c_ids,
        "prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "prompt_blocks": stats["prompt_blocks"],
        "blocks_from_directory": stats["matched_blocks_directory"],
        "blocks_from_host": stats["matched_blocks_host"],
        "blocks_written_before_restart": written,
        "prefill_tokens_with": prefill(got["b"]),
        "prefill_tokens_without": prefill(got["c"]),
        "ttft_s_with": ttft(got["b"]),
        "ttft_s_without": ttft(got["c"]),
        "ttft_s_with_each": [r.ttft_s for r in got["b"]],
        "ttft_s_without_each": [r.ttft_s for r in got["c"]],
        "block_size": bs,
        "max_tokens": cfg.restart_max_tokens,
    }


# ------------------------------------------------------------------ (b) pressure
def _wave_entry(trace, golds, close_id: int, block_size: int, num_blocks: int) -> dict:
    n = len(trace.requests)
    bsec = km.block_seconds(trace.steps, trace.start, block_size)
    bsteps = km.block_steps(trace.steps, block_size)
    ids = [r.token_ids for r in trace.requests]
    done = [r for r in trace.requests if r.finish_reason is not None]
    return {
        "preemptions": trace.preemptions,
        "requests_preempted": sum(r.num_preemptions > 0 for r in trace.requests),
        "completed": len(done),
        "answered": sum(r.finish_reason == "stop" for r in trace.requests),  # ended by EOS, not max_tokens
        "accuracy": sum(grade(r.text, g) for r, g in zip(trace.requests, golds)) / n,
        "kv_block_seconds_per_request": sum(bsec.values()) / n,
        "kv_block_steps_per_request": sum(bsteps.values()) / n,
        "kv_usage_block_seconds_per_request": km.usage_block_seconds(trace.usage, trace.start, num_blocks) / n,
        "think_tokens": statistics.mean(t.index(close_id) if close_id in t else len(t) for t in ids),
        "tokens": statistics.mean(len(t) for t in ids),
        "wall_s": trace.end - trace.start,
    }


def run_pressure(cfg: KVBenchConfig, tok, root: Path) -> tuple[dict, dict]:
    """(pressure, pressure_host_tier): per method the sweep and a wave on an engine without a
    connector, then the same wave on an engine whose connector keeps prompt and committed generated
    blocks in a host-memory tier (`save_generated`), so preempted requests reload instead of recompute."""
    from specexit_core.kv_cache.settings import kv_transfer_config

    wave = cfg.pressure_requests or cfg.max_concurrency
    prompts, golds = long_reasoning_prompts(tok, max(wave, cfg.max_concurrency))
    spec_args = {"specexit": load_exit_overrides(cfg.exit_config)} if cfg.exit_config else None
    sps = {
        "eagle3": _greedy(cfg.max_tokens, {"specexit": dict(NEVER_FIRES)}),
        "specexit": _greedy(cfg.max_tokens, spec_args),
    }
    close_id = tok.convert_tokens_to_ids("</think>")
    spec = {"method": "eagle3", "model": str(DRAFT_DIR), "num_speculative_tokens": cfg.num_speculative_tokens}
    engine = {
        "speculative_config": spec,
        "block_size": cfg.block_size,
        "num_gpu_blocks_override": cfg.num_blocks,
        "max_num_seqs": max(64, wave, cfg.max_concurrency),
    }
    res: dict = {m: {} for m in km.PRESSURE_METHODS}
    host: dict = {m: {} for m in km.PRESSURE_METHODS}
    outputs: dict[str, list] = {}
    with _engine(**engine) as llm:
        counters = attach_counters(llm)
        for m in km.PRESSURE_METHODS:
            run_requests(llm, prompts[:1], sps[m], counters)  # warm-up
        for m in km.PRESSURE_METHODS:
            n, rows = km.largest_without_preemption(
                lambda k, m=m: run_requests(llm, prompts[:k], sps[m], counters).preemptions, cfg.max_concurrency
            )
            res[m]["concurrent_without_preemption"] = n
            res[m]["sweep_limit_reached"] = n == cfg.max_concurrency  # the true limit may be higher
            res[m]["sweep_preemptions"] = [r["preemptions"] for r in rows]
        for m in km.PRESSURE_METHODS:
            trace = run_requests(llm, prompts[:wave], sps[m], counters)
            outputs[m] = [r.token_ids for r in trace.requests]
            res[m] |= _wave_entry(trace, golds[:wave], close_id, cfg.block_size, cfg.num_blocks)
            log.info("pressure %s: %s", m, res[m])
    # the same waves with the host tier: blocks per request at most max_model_len / block_size
    stats = root / "stats_pressure"
    connector = kv_transfer_config(None, stats_dir=str(stats), host_bytes=cfg.host_tier_bytes, save_generated=True)
    with _engine(**engine, kv_transfer_config=connector) as llm:
        counters = attach_counters(llm)
        for m in km.PRESSURE_METHODS:
            run_requests(llm, prompts[:1], sps[m], counters)  # warm-up
        for m in km.PRESSURE_METHODS:
            before = _read_stats(stats)["scheduler"]
            trace = run_requests(llm, prompts[:wave], sps[m], counters)
            after = _read_stats(stats)["scheduler"]
            host[m] = _wave_entry(trace, golds[:wave], close_id, cfg.block_size, cfg.num_blocks) | {
                "resumed_requests": after["resumed_requests"] - before["resumed_requests"],
                "resumed_blocks_loaded": after["resumed_blocks_loaded"] - before["resumed_blocks_loaded"],
                "identical_to_without": [r.token_ids for r in trace.requests] == outputs[m],
                "wall_s_ratio_vs_without": km.ratio(trace.end - trace.start, res[m]["wall_s"]),
                "with_host_tier": True,
                "pressure_requests": wave,
            }
            log.info("pressure %s with the host tier: %s", m, host[m])
    for m in km.PRESSURE_METHODS:
        res[m] |= {"with_host_tier": False, "pressure_requests": wave}
    return res, host


# ------------------------------------------------------------------ the bench
def run_bench(cfg: KVBenchConfig) -> dict:
    # Each engine in an engine-core process of its own, not in this one (the CPU default): vLLM keeps the
    # KV connector in a process-wide global, so a plain engine beside a connector engine in one process
    # would find the other's connector; and a restart is a new process.
    os.environ.update(in_process_engine_env(False))
    apply_cpu_defaults()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TEACHER_DIR))
    with tempfile.TemporaryDirectory(prefix="specexit-kv-bench-") as tmp:
        restart = run_restart(cfg, tok, Path(tmp))
        pressure, pressure_host = run_pressure(cfg, tok, Path(tmp))
    e, s = pressure["eagle3"], pressure["specexit"]
    ratios = {
        "concurrency_specexit_vs_eagle3": km.ratio(
            s["concurrent_without_preemption"], e["concurrent_without_preemption"]
        ),
        "kv_block_seconds_specexit_vs_eagle3": km.ratio(
            s["kv_block_seconds_per_request"], e["kv_block_seconds_per_request"]
        ),
        "kv_block_steps_specexit_vs_eagle3": km.ratio(s["kv_block_steps_per_request"], e["kv_block_steps_per_request"]),
    }
    return km.kv_result(
        restart,
        pressure,
        pressure_host_tier=pressure_host,
        ratios=ratios,
        config=cfg.model_dump(),
        specexit_exit=load_exit_overrides(cfg.exit_config) if cfg.exit_config else "the draft's defaults",
    )


def main(cfg: KVBenchConfig, as_json: bool, extra: dict | None = None) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout for the report
    res = {**(extra or {}), **run_bench(cfg)}
    if as_json:
        print(json.dumps(res))  # one line, the last on stdout
    else:
        print_summary(res)
    return 0


def print_summary(res: dict) -> None:
    r = res["restart"]
    print(
        f"restart: hit share {r['hit_share']:.2f}, prefill tokens with/without {r['prefill_tokens_ratio']:.3f}, "
        f"TTFT with/without {r['ttft_ratio']:.2f}, identical {r['identical']}"
    )
    print(f"{'pressure':10s} {'no-preempt c':>12s} {'preemptions':>11s} {'completed':>9s} {'block-s/req':>11s}")
    for m, e in res["pressure"].items():
        print(
            f"{m:10s} {e['concurrent_without_preemption']:12d} {e['preemptions']:11d} {e['completed']:9d} "
            f"{e['kv_block_seconds_per_request']:11.3f}"
        )
    for m, e in res.get("pressure_host_tier", {}).items():
        print(
            f"{m} with the host tier: preemptions {e['preemptions']}, resumed {e['resumed_requests']} loading "
            f"{e['resumed_blocks_loaded']} blocks, wall time x{e['wall_s_ratio_vs_without']:.2f}, "
            f"identical {e['identical_to_without']}"
        )
