"""`specexit bench serve` end to end on the toy at a tiny size: direct AsyncLLM then the Serve endpoint (its
own local Ray cluster, the openai client), same requests; both paths did the same engine work, every row has
its throughput, engine time and CPU per request, the serve rows their ratio; the JSON line last."""

import json

import pytest

from specexit_app.cli import main as cli_main

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1)]


def test_bench_serve_on_the_toy(capsys, tmp_path):
    out_file = tmp_path / "serve.json"
    argv = ["bench", "serve", "--json", "--model-set", "toy", "--concurrency", "1,4", "--requests", "2,8"]
    argv += ["--max-tokens", "24", "--rounds", "1", "--output", str(out_file)]
    assert cli_main(argv) == 0  # 0: both paths generated the same tokens
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads(out_file.read_text()) == res
    assert {"command", "commit", "machine", "date", "setup", "rows"} <= set(res)
    assert res["setup"]["model_set"] == "toy" and res["setup"]["max_tokens"] == 24
    rows = {(r["path"], r["concurrency"]): r for r in res["rows"]}
    assert set(rows) == {("direct", 1), ("direct", 4), ("serve", 1), ("serve", 4)}
    for (path, c), r in rows.items():
        assert r["requests"] == (2 if c == 1 else 8) and r["completion_tokens"] == 24 * r["requests"]
        assert r["requests_per_s"] > 0 and r["engine_ms_per_request"] > 0
        assert r["cpu_ms_per_request"]["engine"] > 0  # the engine processes were found and measured
        if path == "serve":
            assert r["same_engine_work"] is True and r["ratio_vs_direct"] > 0
            # one round: its ratio is the pooled one (to the rounding of the pooled rates)
            assert r["ratio_by_round"] == [pytest.approx(r["ratio_vs_direct"], abs=0.01)] and r["variant"] == "default"
            assert {"proxy", "ingress", "replica", "client"} <= set(r["cpu_ms_per_request"])
            assert r["outside_engine_cpu_ms_per_request"] > 0
        else:
            assert set(r["cpu_ms_per_request"]) <= {"frontend", "engine", "ray"}
