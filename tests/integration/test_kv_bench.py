"""`specexit bench kv --json` end to end, the way a user runs it, in a small setting: real vLLM CPU
engines on the toy teacher (a connector engine, its restart, an engine without the connector, then a
SpecExit engine with a small fixed KV pool).

Asserted: the last stdout line is the one JSON object with the public keys; after the restart the
prompts' blocks come from the connector with token-identical greedy output; and the pressure figures
agree with each other (SpecExit's early exit holds KV for less time than EAGLE-3's long thinking).
"""

import json

import pytest

from specexit_app.bench.kv_measures import PRESSURE_KEYS, RESTART_KEYS
from support.cli import run_json, specexit

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=2)]

ARGS = ["--restart-prompts", "2", "--num-blocks", "40", "--max-concurrency", "12", "--max-tokens", "400"]
ARGS += ["--exit-config", "examples/toy/calibrated.json"]


@pytest.fixture(scope="module")
def result():
    p, doc = run_json(specexit("bench", "kv", "--json", *ARGS), timeout=900)
    last = p.stdout.rstrip().splitlines()[-1]
    assert json.loads(last) == doc  # the last line is the whole document
    print(f"\nbench kv: restart {doc['restart']}\nratios {doc['ratios']}")
    for m, e in doc["pressure"].items():
        print(f"{m}: {e}")
    for m, e in doc["pressure_host_tier"].items():
        print(f"{m} with the host tier: {e}")
    return doc


def test_the_json_line_has_the_public_keys(result):
    assert set(RESTART_KEYS) <= set(result["restart"])
    assert set(result["pressure"]) == {"eagle3", "specexit"}
    for e in result["pressure"].values():
        assert set(PRESSURE_KEYS) <= set(e)
        assert isinstance(e["concurrent_without_preemption"], int) and isinstance(e["preemptions"], int)
    assert {"command", "commit", "machine", "date"} <= set(result)


def test_after_a_restart_the_prompts_come_from_the_connector_with_identical_output(result):
    r = result["restart"]
    assert r["identical"] is True
    assert r["hit_share"] >= 0.9
    assert r["blocks_written_before_restart"] == r["prompt_blocks"]
    # the connector supplies all but the tail: at most the partial last block plus one block of tokens
    assert r["prefill_tokens_with"] <= r["prompts"] * 2 * r["block_size"]
    assert r["prefill_tokens_without"] == sum(r["prompt_tokens"])
    assert r["prefill_tokens_ratio"] < 0.25 and r["ttft_ratio"] > 0


def test_pressure_figures_are_consistent(result):
    e, s = result["pressure"]["eagle3"], result["pressure"]["specexit"]
    for m in (e, s):
        assert m["completed"] == m["pressure_requests"]  # preempted requests are recomputed, not lost
        assert m["sweep_preemptions"][:-1] == [0] * (len(m["sweep_preemptions"]) - 1)
        assert m["kv_block_seconds_per_request"] > 0
        # the per-request integral and the engine's own KV usage agree (spec-decoding lookahead and
        # step bookkeeping aside)
        assert 0.5 < m["kv_usage_block_seconds_per_request"] / m["kv_block_seconds_per_request"] < 2.0
    assert s["think_tokens"] < e["think_tokens"]
    assert s["kv_block_seconds_per_request"] < e["kv_block_seconds_per_request"]
    assert s["kv_block_steps_per_request"] < e["kv_block_steps_per_request"]
    assert s["concurrent_without_preemption"] >= e["concurrent_without_preemption"]
    assert e["preemptions"] >= s["preemptions"]


def test_with_the_host_tier_preempted_requests_reload_their_blocks(result):
    for m, h in result["pressure_host_tier"].items():
        assert h["with_host_tier"] is True and h["completed"] == h["pressure_requests"], m
        if h["resumed_requests"]:  # preempted requests resumed: their committed blocks came back
            assert h["resumed_blocks_loaded"] > 0, (m, h)
    # the EAGLE-3 wave holds KV long enough at this pool to be preempted
    assert result["pressure_host_tier"]["eagle3"]["resumed_requests"] > 0
