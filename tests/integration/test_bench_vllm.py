"""`specexit bench vllm --json` runs and reports every method side by side (a smoke run, n=4)."""

import pytest

from support.cli import run_json, specexit

pytestmark = pytest.mark.vllm


def test_bench_vllm_json():
    _, res = run_json(specexit("bench", "vllm", "--n", "4", "--json"), timeout=900)
    assert set(res["methods"]) == {"eagle3", "specexit", "specexit_never_fires"}
    for m in res["methods"].values():
        for key in ("accuracy", "think_tokens", "latency_s", "acceptance_length"):
            assert key in m
        assert 1.0 < m["acceptance_length"] <= 4.0  # k=3: at most 3 drafts + 1 bonus per step
    # the never-firing thresholds must not change the text; the default exit shortens thinking
    assert res["methods"]["specexit_never_fires"]["think_tokens"] == res["methods"]["eagle3"]["think_tokens"]
    assert res["methods"]["specexit"]["think_tokens"] <= res["methods"]["eagle3"]["think_tokens"]
    # same text, same drafts: per-method counters give the same acceptance for never-fires and eagle3
    assert res["methods"]["specexit_never_fires"]["acceptance_length"] == pytest.approx(
        res["methods"]["eagle3"]["acceptance_length"], abs=1e-9
    )
