"""`python -m pipelines.evaluate.generalisation` for real: the calibrated toy exit evaluated in
distribution and on one shifted test set (division, never in training), each an ordinary evaluation
run (Ray Data, vLLM CPU engine, the toy teacher and its draft) into its own folder; then the summary
JSON, the report and its plot, and a rerun that resumes instead of generating again."""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from support.cli import run_json
from support.paths import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=1)]
N = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("generalisation")
    cfg = yaml.safe_load((REPO_ROOT / "examples/toy/generalisation.yaml").read_text())
    ev = cfg["eval"]
    cfg["shifts"] = ["division"]
    ev.update(methods=["eagle3", "specexit"], latency_problems=1, batch_size=2)
    for k in ("draft", "calibrated"):
        ev[k] = str(REPO_ROOT / ev[k])
    ev["engine"]["model"] = str(REPO_ROOT / ev["engine"]["model"])
    path = tmp / "generalisation.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp / "out"
    cmd = [sys.executable, "-m", "pipelines.evaluate.generalisation", "--config", path, "--output", out]
    _, summary = run_json([*cmd, "--limit", str(N)], timeout=900)
    return {"summary": summary, "out": out, "cmd": cmd}


def _rows(folder) -> list[dict]:
    return [r for f in sorted(folder.glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_one_evaluation_per_distribution_with_the_shifted_prompts(run):
    s, out = run["summary"], run["out"]
    assert set(s["distributions"]) == {"in_distribution", "division"}, s
    assert s["shifts"] == ["division"] and s["temperature"] == 0.0
    assert all(s[k] for k in ("command", "commit", "machine", "date")), "the provenance docs/results/ keeps"
    assert s["command"].startswith("python -m pipelines.evaluate.generalisation --config "), s["command"]
    assert s["specexit_exit"], "the calibrated exit under test is recorded"
    prompts = {}
    for name, d in s["distributions"].items():
        assert d["n"] == N and d["errors"] == 0, (name, d)
        assert set(d["methods"]) == {"eagle3", "specexit"}, d
        rows = _rows(out / name)
        assert len({r["problem_id"] for r in rows}) == N
        prompts[name] = {r["prompt"] for r in rows}
    assert all("/" in p for p in prompts["division"]), prompts["division"]
    assert not any("/" in p for p in prompts["in_distribution"]), prompts["in_distribution"]
    assert json.loads((out / "_generalisation.json").read_text())["distributions"].keys() == s["distributions"].keys()


def test_rows_carry_accuracy_savings_and_moves(run):
    d = run["summary"]["distributions"]
    for name in d:
        e, x = d[name]["methods"]["eagle3"], d[name]["methods"]["specexit"]
        assert 0 <= x["accuracy"] <= 1 and len(x["accuracy_ci95"]) == 2
        assert e["accuracy_vs_eagle3"] is None and x["accuracy_vs_eagle3"]["n"] == N
        assert e["think_tokens"] > 0
        assert x["think_saving_vs_eagle3"] == pytest.approx(1 - x["think_tokens"] / e["think_tokens"])
    moved = d["division"]["methods"]["specexit"]["moved_from_in_distribution"]
    base, shifted = d["in_distribution"]["methods"]["specexit"], d["division"]["methods"]["specexit"]
    assert moved["think_tokens"] == pytest.approx(shifted["think_tokens"] - base["think_tokens"])
    assert "moved_from_in_distribution" not in d["in_distribution"]["methods"]["specexit"]


def test_report_and_plot(run):
    out = run["out"]
    report = (out / "_report" / "report.md").read_text()
    assert "division" in report and "in_distribution" in report.replace(" ", "_")
    assert (out / "_report" / "generalisation.png").stat().st_size > 1000


def test_rerun_resumes_every_distribution(run):
    before = {p: p.stat().st_mtime_ns for p in run["out"].glob("*/part-*.parquet")}
    _, again = run_json([*run["cmd"], "--limit", str(N), "--no-report"], timeout=900)
    after = {p: p.stat().st_mtime_ns for p in run["out"].glob("*/part-*.parquet")}
    assert after == before, "a finished distribution is not generated again"
    for name, d in again["distributions"].items():
        assert d["methods"] == run["summary"]["distributions"][name]["methods"], name
