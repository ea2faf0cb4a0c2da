"""README's main command runs (small n): teacher eval + vLLM with the SpecExit draft, off vs on."""

import json
from pathlib import Path

import pytest

from support.cli import run_json, specexit
from support.demo_checks import (
    FIELDS,
    METHODS,
    check_answer_reserve,
    check_effort_none,
    check_replay_matches_the_engine,
)
from support.ports import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=6)]


def test_toy_demo_json():
    _, res = run_json(specexit("toy", "demo", "--n", "12", "--json"), timeout=900)
    assert res["teacher"]["n"] == 12
    assert set(res["vllm"]) == {"eagle3", "specexit"}
    assert res["vllm"]["specexit"]["think_tokens"] < res["vllm"]["eagle3"]["think_tokens"]
    assert res["think_token_reduction"] > 0.1


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`specexit demo --quick --json`, once for the module: every stage runs for real (Ray Data, Ray Train,
    Ray Serve, vLLM); the tests below check each stage's part of its output and work folder."""
    wd = tmp_path_factory.mktemp("toy-demo") / "demo"
    out, res = run_json(
        specexit("demo", "--quick", "--json", "--workdir", str(wd), "--port", str(free_port())), timeout=1500
    )
    return out, res, wd


def test_summary_json_has_every_method_and_field(demo):
    """The last line is the per-method summary of issue #7 (the JSON's public interface:
    tests/support/demo_checks.py)."""
    _, res, _ = demo
    assert set(res["methods"]) == METHODS
    for name, m in res["methods"].items():
        assert set(m) == FIELDS
        assert 0 <= m["accuracy"] <= 1 and m["latency_s"] > 0
        assert m["accuracy_ci95"][0] <= m["accuracy"] <= m["accuracy_ci95"][1]
        assert (m["accuracy_vs_eagle3"] is None) == (name == "eagle3")
        assert (m["speedup_vs_eagle3"] is None) == (name == "eagle3")
    ms = res["methods"]
    assert ms["nothink"]["think_tokens"] == 0
    assert ms["deer"]["probe_requests"] > 0 and ms["dynasor"]["probe_requests"] > 0
    assert ms["eagle3"]["probe_requests"] == 0 and ms["specexit"]["probe_requests"] == 0
    assert ms["oracle"]["think_tokens"] <= ms["eagle3"]["think_tokens"]
    # SpecExit at each reasoning effort level (8 dev problems certify none: every level but max runs
    # with the exit off, max with signals that never fire: all think as EAGLE-3 does)
    levels = res["by_effort"]["0"]
    assert list(levels) == ["minimal", "low", "medium", "high", "xhigh", "max"]
    for level in levels.values():
        assert set(level) == FIELDS and level["think_tokens"] == pytest.approx(ms["eagle3"]["think_tokens"])


def test_every_stage_ran_and_is_accounted_for(demo):
    _, res, _ = demo
    st = res["stages"]
    assert list(st) == ["traces", "labels", "train_draft", "calibrate", "serve", "evaluate"]
    assert st["traces"]["ok"] + st["traces"]["errors"] == st["traces"]["input_rows"] == 24
    assert st["train_draft"]["step"] == 6
    assert st["serve"]["requests"] == 4 and st["serve"]["reasoning_separated"]
    assert st["evaluate"]["complete"] and st["evaluate"]["n"] == 4
    assert isinstance(st["calibrate"]["at_grid_edge"], list)
    # the certified exit's record (issue #39): per sampling profile its setting and certified bound
    cal = res["calibration"]
    assert (cal["epsilon"], cal["delta"], cal["loss"], cal["n_dev"]) == (0.01, 0.1, "disagreement", 8)
    assert set(cal["by_profile"]) == {"T0"} and cal["by_profile"]["T0"]["setting"] == st["calibrate"]["exit"]
    assert cal["by_profile"]["T0"]["bound"] is None  # 4 test prompts certify nothing at 1 point
    # the certificate checked on the evaluation's problems: the loss between specexit and eagle3 measured
    on_test = cal["on_test"]["0"]
    assert on_test["profile"] == "T0" and on_test["n"] == on_test["problems"] == 4 and on_test["holds"] is None
    assert 0 <= on_test["test_loss"] <= 1


def test_the_endpoint_keeps_an_answer_reserve_and_effort_none_thinks_nothing(demo):
    _, _, wd = demo
    serve = json.loads((wd / "serve.json").read_text())
    check_answer_reserve(serve)
    check_effort_none(serve)


def test_the_calibrated_draft_is_what_was_served_and_evaluated(demo):
    _, res, wd = demo
    draft = json.loads((wd / "draft" / "config.json").read_text())
    assert draft["specexit"]["exit_defaults"] == res["stages"]["calibrate"]["exit"]
    # the reasoning effort levels travel with the draft too (each certified at its epsilon)
    efforts = json.loads((wd / "calibrated.json").read_text())["efforts"]
    assert draft["specexit"]["exit_efforts"] == efforts and set(efforts) == {
        "minimal",
        "low",
        "medium",
        "high",
        "xhigh",
    }


def test_report_and_plots(demo):
    _, res, _ = demo
    report = Path(res["report"])
    assert report.exists() and "| specexit |" in report.read_text()
    assert "## The certified exit on the test problems" in report.read_text()
    for png in ("pareto.png", "latency.png", "signals.png", "certificate.png"):
        assert (report.parent / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_is_visible_and_ray_stops_before_the_summary(demo):
    out, _, _ = demo
    assert "[demo] stage 6/6: evaluate done" in out.stderr  # progress is visible
    # Ray is down before the summary is printed, and the demo says so last on stderr: nothing follows
    # that line (vLLM actors' resource_tracker warnings and tracebacks still appear *during* the run,
    # streamed by Ray, up to the moment it stops; they can no longer come after the summary)
    assert "[demo] done in" in out.stderr.strip().splitlines()[-1], out.stderr[-2000:]
    assert "Ray stopped" in out.stderr.strip().splitlines()[-1]


def test_calibration(demo, monkeypatch):
    _, _, wd = demo
    _check_calibration(wd, json.loads((wd / "draft" / "config.json").read_text()), monkeypatch)


def test_calibration_replay_matches_the_engine(demo):
    check_replay_matches_the_engine(demo[2])


def test_signal_quality_of_the_run(demo, tmp_path):
    """`specexit signals` on the run's calibration dev traces (#44 item 1): confidence against the probes,
    progress / remaining against their truth, the replayed grid's front beside EAGLE-3 and the oracle."""
    from specexit_app.cli import main as cli_main

    _, _, wd = demo
    out = tmp_path / "signals.json"
    assert cli_main(["signals", str(wd / "calibrate" / "dev"), "--draft", str(wd / "draft"), "--out", str(out)]) == 0
    r = json.loads(out.read_text())["by_temperature"]["0"]
    c, g, h = r["confidence"], r["regression"], r["headroom"]
    assert r["traces"] >= 1 and c["breaks"] == sum(b["n"] for b in c["reliability"]) > 0
    assert c["auroc"] is None or 0 <= c["auroc"] <= 1
    assert g["tokens"] > 0 and 0 <= g["progress_mae"] <= 1 and g["remaining_mae_tokens"] >= 0
    assert h["front"] and h["oracle"]["think_tokens"] <= h["eagle3"]["think_tokens"]
    # the oracle exits only where the answer stays right: EAGLE-3's accuracy in fewer think tokens
    assert h["oracle"]["accuracy"] == h["eagle3"]["accuracy"]


def _check_calibration(wd, draft: dict, monkeypatch) -> None:
    """Stage 4 is `specexit calibrate` (examples/toy/calibrate.yaml on the dev split, run in-process):
    offline replay over the grid, the engine's confirmation, and a config every plugin reader takes
    (SPECEXIT_EXIT_CONFIG as a path, the draft's exit_defaults, per-request settings)."""
    from specexit_core.exit import ExitConfig
    from specexit_core.exit.profiles import SamplingProfile
    from specexit_core.vllm_plugin.controls import request_exit_config, server_defaults

    out = json.loads((wd / "calibrated.json").read_text())
    chosen = ExitConfig.from_dict(out["exit"])  # every field valid
    c = out["calibration"]
    assert c["n_traces"] == 8 and c["grid_size"] > 10
    tol = c["tolerance"]
    # never less accurate than EAGLE-3 on the dev split beyond the tolerance, in replay and for real
    assert c["chosen_replay"]["accuracy"] >= c["eagle3"]["accuracy"] - tol - 1e-9 and c["within_tolerance"]
    assert c["chosen_replay"]["think_tokens"] <= c["default"]["think_tokens"] + 1e-9  # the default is in the grid
    k = c["certificate"]  # Learn then Test's record beside the point-estimate choice (selection: tolerance)
    assert c["selection"] == "tolerance" and k["loss"] == "disagreement" and (k["epsilon"], k["delta"]) == (0.01, 0.1)
    assert k["n_order"] + k["n_test"] == k["n_dev"] == 8 and k["chosen"] is None  # 4 test prompts cannot show 1 point
    conf = c["confirmed"]
    assert conf["within_tolerance"]
    assert conf["specexit"]["think_tokens"] == pytest.approx(c["chosen_replay"]["think_tokens"])  # greedy: same exits
    # the peers: chosen on the same dev traces by the same rule, confirmed by the engine, then used
    peers = out["peers"]
    assert set(peers) == {"deer", "dynasor", "budget"}
    for name in ("deer", "dynasor", "budget"):
        pc = c["peers"][name]
        assert pc["within_tolerance"]  # the grid holds settings that never exit
        assert conf[name]["think_tokens"] == pytest.approx(pc["replay"]["think_tokens"])  # greedy: replay = engine
    assert (
        c["peers"]["dynasor"]["paper_every"] >= 1
        and 0 <= c["peers"]["dynasor"]["cross_check"]["same_decision_share"] <= 1
    )
    ev = json.loads((wd / "eval" / "_summary.json").read_text())
    assert ev["peer_settings"]["deer"] == peers["deer"] and ev["peer_settings"]["dynasor"] == peers["dynasor"]
    assert ev["methods"]["budget"]["setting"] == peers["budget"] and ev["methods"]["budget"]["chosen_on"] == "dev"
    # per sampling profile (here greedy only): the same rule on the same traces chooses the same exit
    assert set(out["by_profile"]) == {"T0"} and out["by_profile"]["T0"]["exit"] == out["exit"]
    assert c["by_profile"]["T0"]["replay"] == {k: c["chosen_replay"][k] for k in ("accuracy", "think_tokens")}
    assert draft["specexit"]["exit_profiles"] == out["by_profile"]
    monkeypatch.delenv("SPECEXIT_EXIT_CONFIG", raising=False)
    served = server_defaults(draft["specexit"]["exit_defaults"], draft["specexit"]["exit_profiles"])
    assert served.joint == chosen and served.select(SamplingProfile(0.0)) == ("T0", chosen)  # the draft's defaults
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", str(wd / "calibrated.json"))
    assert server_defaults().joint == chosen and server_defaults().select(SamplingProfile(0.0))[1] == chosen
    assert request_exit_config({"specexit": out["exit"]}, ExitConfig()) == chosen


def test_every_stage_output_opens_as_a_dataset(demo):
    """Every folder of Parquet the demo wrote (traces, labels, the calibration's dev run, the evaluation;
    and a folder holding such folders) opens with pandas, pyarrow's dataset reader and Ray Data, each giving
    the stage's rows and schema: the stages' metadata starts with `_` (pipelines/common/meta_files.py). A
    killed writer's leftover temp file changes nothing."""
    import pandas as pd
    import pyarrow.dataset as pads
    import ray

    from pipelines.common.parts import TMP_PREFIX, read_all
    from pipelines.common.schemas import LABELS, TRACES

    _, res, wd = demo
    leaves = sorted({p.parent for p in wd.rglob("part-*.parquet")})
    names = {f.relative_to(wd).as_posix() for f in leaves}
    assert {"traces", "labels", "eval", "calibrate/dev"} <= names, names
    # folders of such folders (calibrate/: the dev run and any other) open as one dataset too
    nested = sorted({wd / a for f in leaves for a in f.relative_to(wd).parents if str(a) != "."} - set(leaves))
    (wd / "traces" / f"{TMP_PREFIX}0badc0de-part-00000.parquet").write_bytes(b"PAR1 cut short by a kill")
    own = {f: read_all(f) for f in leaves}  # the stages' own reader: their rows and schema
    st = res["stages"]
    assert own[wd / "traces"].schema == TRACES and own[wd / "traces"].num_rows == st["traces"]["input_rows"]
    assert own[wd / "labels"].schema == LABELS
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for folder in [*leaves, *nested]:
            tables = [t for f, t in own.items() if f == folder or folder in f.parents]
            rows, columns = sum(t.num_rows for t in tables), tables[0].schema.names
            df = pd.read_parquet(folder)
            assert len(df) == rows and list(df.columns) == columns, folder
            ds = pads.dataset(folder, format="parquet")
            assert ds.count_rows() == rows and ds.schema.names == columns, folder
            rd = ray.data.read_parquet(str(folder))
            assert rd.count() == rows and rd.schema().names == columns, folder
    finally:
        ray.shutdown()


def test_a_rerun_resumes_every_stage(demo):
    """`specexit demo` again over the finished work folder (README: "a rerun resumes"), last in this module:
    traces, labels and evaluation rows are all found written, training, calibration and the endpoint check
    have nothing to do (the calibrate stage's dev run could not be resumed: its draft now carries the exit),
    and the comparison is the same."""
    _, res, wd = demo
    out, again = run_json(
        specexit("demo", "--quick", "--json", "--workdir", str(wd), "--port", str(free_port())), timeout=900
    )
    log = out.stderr
    assert "traces: 24 input rows, 24 already in" in log and "labels: 24 input traces, 24 already in" in log
    assert "already holds run demo-draft at step 6; nothing to do" in log
    assert "this draft's calibration (it carries the exit); nothing to do" in log
    assert "is this draft's endpoint check (same app, same requests); nothing to do" in log
    assert "evaluate: 4 problems, 4 already in" in log
    assert again["stages"]["calibrate"]["exit"] == res["stages"]["calibrate"]["exit"]
    for name, m in res["methods"].items():
        assert (again["methods"][name]["accuracy"], again["methods"][name]["think_tokens"]) == (
            m["accuracy"],
            m["think_tokens"],
        ), name
