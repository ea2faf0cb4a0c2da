"""`specexit bench longgen` end to end on the toy (CPU vLLM + the PyTorch engine): one short length, greedy and
sampled, penalty off and on, one prompt, heads trained in-process for a few steps. Every method's rows with the
public keys, greedy output identical to its backend's plain decoding (and torch's plain equal to vLLM's, with
the windowed penalty through the plain engine's logits processor), positive ratios, the JSON line last."""

import json

import pytest

from specexit_app.bench.longgen_bench import METHODS
from specexit_app.cli import main as cli_main
from support.longgen_keys import PUBLIC_ROW_KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1)]
KEYS = PUBLIC_ROW_KEYS


def test_bench_longgen_on_the_toy(capsys, telemetry_dir):
    argv = ["bench", "longgen", "--json", "--lengths", "64", "--prompts", "1", "--temperatures", "0,0.6"]
    argv += ["--train-steps", "20", "--train-seqs", "4", "--heads-out", ""]
    assert cli_main(argv) == 0  # 0: every greedy row identical to its plain
    out = capsys.readouterr().out.strip().splitlines()
    res = json.loads(out[-1])
    rows = res["rows"]
    assert {r["method"] for r in rows} == set(METHODS) and not res["skipped"]
    assert {"command", "commit", "machine", "date"} <= set(res)
    assert len(rows) == 2 * 2 * 5  # temperatures x penalties x (plain torch, tokenswift, plain vllm, eagle3, long)
    for r in rows:
        assert set(r) >= KEYS, r
        assert r["length"] == 64 and r["generated_tokens"] == 64
        assert r["wall_s"] > 0 and r["speedup_vs_plain"] > 0 and 0 < r["distinct_n"] <= 1
        if r["temperature"] == 0.0:
            assert r["identical_to_plain"] is True, r
        else:
            assert r["identical_to_plain"] is None
        if r["method"] != "plain":
            assert r["tokens_per_forward"] >= 1.0 and 0 <= r["acceptance"] <= 1
        if r["method"] == "vllm_long":
            assert r["speedup_vs_eagle3"] > 0 and r["ngram_drafted_tokens"] >= r["ngram_accepted_tokens"] >= 0
    agree = [r["torch_vllm_plain_agree"] for r in rows if r["method"] == "plain" and "torch_vllm_plain_agree" in r]
    assert agree == [True, True]  # greedy, penalty off and on
