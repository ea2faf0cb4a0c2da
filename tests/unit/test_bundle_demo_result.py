"""studies/bundle_demo_result.py: a demo work folder -> docs/results/demo_<teacher>/, judged by the
teacher's own evaluate recipe's targets (issue #13's for the realistic teachers), whatever targets
the run itself printed."""

import json

from PIL import Image

from support.paths import load_script


def _load():
    return load_script("studies/bundle_demo_result.py")


def _m(acc, think, lat, speedup=None):
    m = {"n": 10, "accuracy": acc, "think_tokens": think, "latency_s": lat}
    if speedup:  # what an evaluation records for every method but eagle3
        m["speedup_vs_eagle3"] = {"ratio": speedup, "ci95": [speedup - 0.2, speedup + 0.2], "n": 10}
    return m


def _work_folder(wd, demo: dict, methods: dict):
    """A finished demo's folder as the bundler reads it: demo.json, the evaluation summary, the
    calibrated file, the report and its pictures."""
    (wd / "eval").mkdir(parents=True, exist_ok=True)
    (wd / "report").mkdir()
    (wd / "demo.json").write_text(json.dumps(demo))
    (wd / "eval" / "summary.json").write_text(json.dumps({"by_temperature": {"0": {"methods": methods}}}))
    (wd / "calibrated.json").write_text(json.dumps({"exit": {"method": "confidence"}}))
    (wd / "report" / "report.md").write_text("# report\n")
    for png in ("pareto.png", "latency.png", "signals.png"):
        Image.new("RGBA", (40, 30), (200, 30, 30, 255)).save(wd / "report" / png)


def test_bundle_judges_by_the_teachers_recipe(tmp_path):
    wd = tmp_path / "run"
    methods = {"eagle3": _m(0.9, 160.0, 1.7), "specexit": _m(0.9, 76.0, 1.0, 1.7), "oracle": _m(0.9, 60.0, 0.9, 1.9)}
    _work_folder(wd, {"teacher": "qwen3-like", "targets": {"0": {"printed": "by the run"}}}, methods)
    out = tmp_path / "bundle"
    checks = _load().bundle(wd, "qwen3-like", out, "specexit demo --teacher qwen3-like --json", "a test")["0"]
    # 76 / 60 = 1.27x the oracle: within issue #13's 1.3x, not the toy's 1.25x; 1.7x faster:
    # issue #13's 1.6 passes where the toy's 1.9 would not; no think-reduction bound for this teacher
    assert checks["think_within_1.3x_oracle"]["pass"] and checks["speedup_vs_eagle3"]["pass"]
    assert checks["speedup_vs_eagle3"]["ci95"] == [1.5, 1.9]  # the run's own interval
    assert "think_reduction_vs_eagle3" not in checks
    d = json.loads((out / "demo.json").read_text())
    assert d["targets"] == {"0": {"printed": "by the run"}}  # what the run printed stays as it was
    assert d["calibrated"]["exit"]["method"] == "confidence" and d["run"]["conditions"] == "a test"
    assert sorted(p.name for p in out.iterdir()) == [
        "demo.json",
        "latency.png",
        "pareto.png",
        "report.md",
        "signals.png",
    ]
    assert Image.open(out / "signals.png").mode == "P"  # the palette copy
    _load().bundle(wd, "qwen3-like", out, "specexit demo --teacher qwen3-like --json", "a test", label="run 2")
    assert json.loads((out / "demo.json").read_text())["run"]["label"] == "run 2"


def test_a_run_without_speedup_intervals_gets_them_from_its_rows(tmp_path):
    import pyarrow as pa

    from pipelines.common.parts import write_part
    from support.eval_rows import eval_row

    wd = tmp_path / "run"
    rows = []
    for i in range(10):
        rows += [eval_row(f"p{i}", "eagle3", True, latency=2.0), eval_row(f"p{i}", "specexit", True, latency=1.0)]
        rows += [eval_row(f"p{i}", "oracle", True, latency=0.8)]
    write_part(wd / "eval", pa.Table.from_pylist([dict(r, id=f"{r['problem_id']}/{r['method']}") for r in rows]))
    methods = {"eagle3": _m(0.9, 160.0, 2.0), "specexit": _m(0.9, 76.0, 1.0), "oracle": _m(0.9, 60.0, 0.8)}
    _work_folder(wd, {"teacher": "qwen3-like", "by_temperature": {"0": methods}}, methods)
    out = tmp_path / "bundle"
    checks = _load().bundle(wd, "qwen3-like", out, "cmd", "a test")["0"]
    assert checks["speedup_vs_eagle3"]["value"] == 2.0 and checks["speedup_vs_eagle3"]["ci95"] == [2.0, 2.0]
    d = json.loads((out / "demo.json").read_text())
    assert d["by_temperature"]["0"]["oracle"]["speedup_vs_eagle3"]["ratio"] == 2.5
    assert d["run"]["speedup_intervals"].startswith("computed at bundle time")
