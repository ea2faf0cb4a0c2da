"""`specexit bench longgen --model-set long-writer` end to end at a CI length: the shipped long writer, its
shipped TokenSwift heads and its shipped EAGLE-3 draft (vLLM loads it beside the windowed target). Greedy,
penalty off and on, one prompt: every method's rows, output identical to its backend's plain decoding, the
drafts accepted, the drafter reading at most the model's 1,024-token window. 1K-16K by hand (docs/longgen.md)."""

import json

import pytest

from specexit_app.bench.longgen_bench import METHODS
from specexit_app.cli import main as cli_main

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=0.7)]


def test_bench_longgen_on_the_long_writer(capsys, telemetry_dir):
    argv = ["bench", "longgen", "--model-set", "long-writer", "--json", "--lengths", "96", "--prompts", "1"]
    assert cli_main([*argv, "--temperatures", "0"]) == 0  # 0: every greedy row identical to its plain
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = res["rows"]
    assert res["model_set"]["name"] == "long-writer" and not res["skipped"]
    assert {r["method"] for r in rows} == set(METHODS) and len(rows) == 2 * 5  # penalties x methods
    for r in rows:
        assert r["identical_to_plain"] is True, r
        assert r["length"] == 96 and r["generated_tokens"] == 96
        if r["method"] != "plain":  # the shipped heads and draft are trained: their drafts get accepted
            assert r["tokens_per_forward"] > 1.5 and r["acceptance"] > 0.2, r
        if r["method"] == "tokenswift":
            assert r["drafter_kv_positions"] <= 1023
