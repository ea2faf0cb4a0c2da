"""`specexit bench kv`'s pure parts: block-seconds, the concurrency sweep, the JSON shape, the prompts,
the step recorder on a fake engine, and the CLI's options."""

import math
from types import SimpleNamespace

import pytest

from specexit_app.bench import kv_measures as km
from specexit_app.bench.kv_bench import KVBenchConfig, long_reasoning_prompts, restart_prompts
from specexit_app.bench.step_trace import EngineCounters, run_requests
from specexit_app.cli import build_parser, kv_bench_config
from specexit_core.toy.paths import TEACHER_DIR


def test_blocks_held_rounds_up():
    assert [km.blocks_held(n, 32) for n in (1, 32, 33, 64, 65)] == [1, 1, 2, 2, 3]


def test_block_seconds_integrates_the_blocks_after_each_step_over_that_step():
    # request "a": 30 tokens (1 block) during (0, 1], 40 (2 blocks) during (1, 3], 70 (3) during (3, 3.5]
    # request "b": waits during the first step, 20 tokens during (1, 3], preempted (absent) during
    # (3, 3.5], resumed with 33 tokens (2 blocks) during (3.5, 4]
    steps = [(1.0, {"a": 30}), (3.0, {"a": 40, "b": 20}), (3.5, {"a": 70}), (4.0, {"b": 33})]
    got = km.block_seconds(steps, start=0.0, block_size=32)
    assert got["a"] == pytest.approx(1 * 1 + 2 * 2 + 3 * 0.5)
    assert got["b"] == pytest.approx(1 * 2 + 2 * 0.5)
    assert km.block_steps(steps, 32) == {"a": 1 + 2 + 3, "b": 1 + 2}
    assert km.block_seconds([], start=0.0, block_size=32) == {}


def test_usage_integral_matches_the_per_request_sum_when_usage_is_exact():
    steps = [(1.0, {"a": 30}), (3.0, {"a": 40, "b": 20}), (3.5, {"a": 70})]
    num_blocks = 10
    usage = [(t, sum(math.ceil(n / 32) for n in c.values()) / num_blocks) for t, c in steps]
    total = sum(km.block_seconds(steps, 0.0, 32).values())
    assert km.usage_block_seconds(usage, 0.0, num_blocks) == pytest.approx(total)


def test_sweep_stops_at_the_first_preempting_concurrency():
    calls = []

    def run(n):
        calls.append(n)
        return 0 if n <= 5 else 3

    n, rows = km.largest_without_preemption(run, 32)
    assert n == 5 and calls == [1, 2, 3, 4, 5, 6]
    assert rows[-1] == {"concurrency": 6, "preemptions": 3}
    # never preempting: the sweep's limit (the true figure may be higher)
    assert km.largest_without_preemption(lambda n: 0, 4)[0] == 4
    # a preemption at 1 request: nothing served without one
    assert km.largest_without_preemption(lambda n: 1, 4)[0] == 0


def test_result_has_exactly_the_public_keys():
    restart = dict.fromkeys(km.RESTART_KEYS, 1.0)
    entry = dict.fromkeys(km.PRESSURE_KEYS, 1)
    doc = km.kv_result(restart, {"eagle3": entry, "specexit": entry | {"completed": 8}}, ratios={})
    assert (
        set(doc["restart"]) == set(km.RESTART_KEYS) == {"hit_share", "prefill_tokens_ratio", "ttft_ratio", "identical"}
    )
    assert set(doc["pressure"]) == {"eagle3", "specexit"}
    assert set(km.PRESSURE_KEYS) == {"concurrent_without_preemption", "preemptions", "kv_block_seconds_per_request"}
    with pytest.raises(ValueError, match=r"restart\.ttft_ratio"):
        km.kv_result({k: 1 for k in km.RESTART_KEYS if k != "ttft_ratio"}, {"eagle3": entry, "specexit": entry})
    with pytest.raises(ValueError, match=r"pressure\.specexit\.preemptions"):
        km.kv_result(restart, {"eagle3": entry, "specexit": {k: 1 for k in km.PRESSURE_KEYS if k != "preemptions"}})
    with pytest.raises(ValueError, match=r"pressure\.eagle3"):
        km.kv_result(restart, {"specexit": entry})
    assert km.ratio(1, 0) is None and km.ratio(1, 4) == 0.25


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TEACHER_DIR))


def test_restart_prompts_are_long_multi_turn_and_share_no_block(tok):
    prompts = restart_prompts(tok, 4, 352)
    assert all(9 * 32 <= len(p) <= 352 for p in prompts)  # 9+ full blocks each
    assert len({tuple(p[:32]) for p in prompts}) == 4  # every first block differs
    text = tok.decode(prompts[0])
    assert text.count("<|im_start|>user") >= 3 and "<|im_start|>system" in text and "</think>" in text
    assert tok.unk_token_id not in prompts[0]
    with pytest.raises(ValueError, match="no room"):
        restart_prompts(tok, 1, 64)


def test_long_reasoning_prompts_are_the_longest_toy_problems(tok):
    prompts, golds = long_reasoning_prompts(tok, 8)
    assert len(prompts) == len(golds) == 8 and all(len(p) >= 25 for p in prompts)


class _FakeEngine:
    """Two requests: r0 gets 2 tokens per step for 2 steps; r1 waits one step, then 1 token and stops."""

    def __init__(self):
        self.added, self.t = [], 0

    def has_unfinished_requests(self):
        return bool(self.added) and self.t < 3

    def add_request(self, rid, prompt, params):
        assert params.output_kind.name == "DELTA"
        self.added.append(rid)
        return rid + "-internal"

    def step(self):
        self.t += 1
        r0, r1 = self.added
        out = lambda rid, toks, fin: SimpleNamespace(  # noqa: E731
            request_id=rid,
            outputs=[SimpleNamespace(token_ids=toks, text="x" * len(toks), finish_reason="stop" if fin else None)],
            num_cached_tokens=0,
            finished=fin,
            metrics=SimpleNamespace(num_preemptions=0),
        )
        return {1: [out(r0, [5, 6], False)], 2: [out(r0, [7, 8], True), out(r1, [9], True)], 3: []}[self.t]


def test_run_requests_records_each_step_and_time_to_first_token():
    from vllm import SamplingParams

    llm = SimpleNamespace(llm_engine=_FakeEngine())
    counters = EngineCounters()
    trace = run_requests(llm, [[1] * 30, [1] * 31], SamplingParams(max_tokens=4), counters)
    assert [c for _, c in trace.steps] == [{"0": 32}, {"0": 34, "1": 32}]
    r0, r1 = trace.requests
    assert r0.token_ids == [5, 6, 7, 8] and r0.finish_reason == "stop" and r1.token_ids == [9]
    assert r0.ttft_s is not None and r1.ttft_s is not None and r0.first_token <= r1.first_token
    assert trace.preemptions == 0
    assert km.block_steps(trace.steps, 32) == {"0": 1 + 2, "1": 1}


def test_engine_counters_read_iteration_and_scheduler_stats():
    c = EngineCounters()
    c.record(SimpleNamespace(kv_cache_usage=0.5), SimpleNamespace(num_preempted_reqs=2))
    c.record(SimpleNamespace(kv_cache_usage=0.25), None)
    assert c.preemptions == 2 and [u for _, u in c.usage] == [0.5, 0.25]


def test_cli_bench_kv_options_map_to_the_config():
    args = build_parser().parse_args(["bench", "kv", "--json", "--restart-prompts", "2", "--num-blocks", "40"])
    assert args.json and args.restart_prompts == 2 and args.num_blocks == 40
    cfg = kv_bench_config(args)
    assert cfg.restart_prompts == 2 and cfg.num_blocks == 40 and cfg.max_concurrency == 32
    with pytest.raises(ValueError):
        KVBenchConfig(num_blocks=8)  # below one max-length request
    with pytest.raises(ValueError):
        KVBenchConfig(blocks=40)  # unknown keys are errors
