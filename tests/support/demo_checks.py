"""`specexit demo --teacher NAME --quick --json` on a built-in teacher, and the checks every such run
must pass whatever the teacher: the toy demo's JSON, traces in the teacher's chat template closed by
its `</think>`, labels at its tokenizer's single-token paragraph breaks, a top-N draft vocab over its
full vocabulary, the Serve endpoint splitting the reasoning with its vLLM parser, the report.

The teacher's constants come from its `TeacherSpec` (think ids, full vocabulary, template shape,
parser) and the sizes from its demo recipe (`examples/<name>/demo.yaml`, quick block); the test module
of each teacher (`tests/integration/test_demo_<name>.py`, one per teacher so that pytest-xdist's
`loadfile` runs them on different workers) runs the demo once and checks each stage in a test of its
own (`check_teacher_<stage>` here), adding what is particular to its template."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.cli import run_json, specexit
from support.ports import free_port

METHODS = {"plain", "eagle3", "specexit", "specexit_paper", "budget", "deer", "dynasor", "nothink", "oracle"}
FIELDS = {
    "accuracy",
    "accuracy_ci95",
    "accuracy_vs_eagle3",
    "think_tokens",
    "latency_s",
    "probe_requests",
    "speedup_vs_eagle3",
}
STAGES = ["traces", "labels", "train_draft", "calibrate", "serve", "evaluate"]


@dataclass
class DemoRun:
    out: subprocess.CompletedProcess
    res: dict  # the `--json` summary
    wd: Path  # the demo's work folder
    teachers: Path  # $SPECEXIT_TEACHERS_DIR of the run (the teacher materialised there on first use)


def run_teacher_demo(tmp_path: Path, teacher: str, *, timeout: float = 2400) -> DemoRun:
    """`specexit demo --teacher TEACHER --quick --json` in `tmp_path/demo`, materialising the teacher
    into `tmp_path/teachers` (by the run itself: driver and Ray workers), offline. Run once per test
    module (a module-scoped fixture); each stage's checks are tests of their own that read its work."""
    wd, teachers = tmp_path / "demo", tmp_path / "teachers"
    env = {**os.environ, "SPECEXIT_TEACHERS_DIR": str(teachers), "HF_HUB_OFFLINE": "1"}
    argv = specexit("demo", "--teacher", teacher, "--quick", "--json", "--workdir", str(wd), "--port", str(free_port()))
    out, res = run_json(argv, timeout=timeout, env=env)
    return DemoRun(out, res, wd, teachers)


def prompt_ending(spec, tok) -> str:
    """What the teacher's chat template puts after the user's text in a generation prompt."""
    from specexit_core.toy.task import random_problem

    p = random_problem(random.Random(0))
    text = spec.chat_prompt(tok, p)
    return text[text.rindex(p.prompt) + len(p.prompt) :]


def traces_ok(wd: Path) -> list[dict]:
    """The run's trace rows with status ok."""
    import pyarrow.parquet as pq

    traces = pq.read_table(glob.glob(str(wd / "traces" / "part-*.parquet"))).to_pylist()
    return [r for r in traces if r["status"] == "ok"]


def label_rows(wd: Path) -> list[dict]:
    """The run's label rows that have at least one probed break."""
    import pyarrow.parquet as pq

    return [r for r in pq.read_table(glob.glob(str(wd / "labels" / "part-*.parquet"))).to_pylist() if r["boundaries"]]


def check_teacher_summary(run: DemoRun, spec) -> None:
    """The toy demo's JSON, plus the teacher's name; every stage ran with the quick recipe's sizes."""
    from specexit_app.demo_config import load_demo_config

    res, st = run.res, run.res["stages"]
    cfg = load_demo_config(teacher=spec.name, quick=True)
    assert res["teacher"] == spec.name
    assert set(res["methods"]) == METHODS
    for name, m in res["methods"].items():
        assert set(m) == FIELDS and 0 <= m["accuracy"] <= 1 and m["latency_s"] > 0
        assert (m["accuracy_vs_eagle3"] is None) == (name == "eagle3")
        assert (m["speedup_vs_eagle3"] is None) == (name == "eagle3")
    assert res["methods"]["nothink"]["think_tokens"] == 0
    assert list(st) == STAGES
    assert st["traces"]["ok"] + st["traces"]["errors"] == st["traces"]["input_rows"] == cfg.problems
    assert st["train_draft"]["step"] == cfg.train_steps
    assert st["evaluate"]["complete"] and st["evaluate"]["n"] == cfg.eval_problems
    assert (run.teachers / spec.name / "config.json").exists()
    report = Path(res["report"])
    assert report.exists() and "| specexit |" in report.read_text()
    assert "Ray stopped" in run.out.stderr.strip().splitlines()[-1]


def check_teacher_traces(run: DemoRun, spec) -> list[dict]:
    """Traces in the teacher's chat template, closed by its </think>; the thinking is opened by the prompt
    (R1: then never again by the model) or by the model (Qwen3). Returns the ok rows."""
    tok = spec.load_tokenizer()
    ok = traces_ok(run.wd)
    ending = prompt_ending(spec, tok)
    assert ok and all(tok.decode(r["prompt_token_ids"]).endswith(ending) for r in ok)
    assert all((spec.think_start_id in r["prompt_token_ids"]) == spec.think_in_prompt for r in ok)
    if spec.think_in_prompt:
        assert all(spec.think_start_id not in r["completion_token_ids"] for r in ok)
    closed = [r for r in ok if r["finished_think"]]
    assert closed and all(spec.think_end_id in r["completion_token_ids"] for r in closed)
    return ok


def check_teacher_labels(run: DemoRun, spec) -> set[str]:
    """Labels probed at the tokenizer's single-token paragraph breaks (".\n\n", not a bare "\n\n" after a
    period). Returns the decoded breaks."""
    from specexit_core.exit.split_tokens import split_token_ids

    tok = spec.load_tokenizer()
    labels = label_rows(run.wd)
    split = set(split_token_ids(tok))
    assert labels and all(r["completion_token_ids"][b] in split for r in labels for b in r["boundaries"])
    breaks = {tok.decode([r["completion_token_ids"][b]]) for r in labels for b in r["boundaries"]}
    assert breaks and all(b.endswith("\n\n") for b in breaks) and ".\n\n" in breaks
    return breaks


def check_teacher_draft(run: DemoRun, spec) -> dict:
    """A small top-N draft vocab over the full target vocabulary, calibrated, then served and evaluated.
    Returns the draft's config.json."""
    from specexit_app.demo_config import load_demo_config
    from specexit_core.typed_config import read_yaml

    cfg = load_demo_config(teacher=spec.name, quick=True)
    draft = json.loads((run.wd / "draft" / "config.json").read_text())
    assert draft["vocab_size"] == spec.full_vocab_size
    assert draft["draft_vocab_size"] == read_yaml(cfg.train_draft)["draft_vocab_size"]
    assert draft["specexit"]["exit_defaults"] == run.res["stages"]["calibrate"]["exit"]
    return draft


def check_teacher_serve(run: DemoRun, spec) -> dict:
    """The endpoint: the teacher's reasoning parser (the serve recipe's) returns the thinking as reasoning,
    usage carries SpecExit's telemetry. Returns serve.json (summary + rows)."""
    from specexit_app.demo_config import load_demo_config
    from specexit_core.typed_config import read_yaml

    cfg = load_demo_config(teacher=spec.name, quick=True)
    serve_app = read_yaml(cfg.serve)["applications"][0]["args"]["model"]
    assert serve_app["reasoning_parser"] == spec.reasoning_parser and serve_app["source"] == f"teacher:{spec.name}"
    serve = json.loads((run.wd / "serve.json").read_text())
    assert serve["requests"] == 2 * cfg.serve_requests and serve["reasoning_separated"]
    assert run.res["stages"]["serve"]["reasoning_separated"]
    for r in serve["rows"]:  # (a thinking that never closes comes back all reasoning, answer None)
        assert r["reasoning"] and "</think>" not in (r["answer"] or "") and "<think>" not in r["reasoning"]
        assert r["usage_specexit"]["enabled"] == r["specexit"] and r["usage_specexit"]["think_tokens"] > 0
    assert any(r["answer"] for r in serve["rows"])  # at least one closed thinking, split by the parser
    check_answer_reserve(serve)
    check_effort_none(serve)
    return serve


def check_effort_none(serve: dict) -> None:
    """`reasoning_effort: none` through the endpoint: no thinking (no reasoning, no think tokens) and an
    answer, with the teacher's own template and parser (specexit_app/demo_serve.py)."""
    none = serve["effort_none"]
    assert none["answer"] and "</think>" not in none["answer"] and not none["reasoning"]
    assert none["think_tokens"] == 0 and none["completion_tokens"] > 0


def check_answer_reserve(serve: dict) -> None:
    """The endpoint's answer reserve (#40 item 3, specexit_app/demo_serve.py): with `max_tokens` cut
    inside the thinking, effort `max` (no signal exit) still answers, its thinking closed by the reserve
    at the exact budget; SpecExit off runs into the limit and answers nothing."""
    from specexit_core.exit import ExitConfig
    from specexit_core.exit.answer_reserve import ANSWER_RESERVE, reserve_budget

    r = serve["answer_reserve"]
    top, off = r["max"], r["off"]
    assert top["answer"] and top["finish_reason"] == "stop" and top["exit_reason"] == ANSWER_RESERVE
    assert top["think_tokens"] == reserve_budget(r["max_tokens"], ExitConfig().answer_reserve_tokens)
    if r["think_tokens_unlimited"] + 2 > r["max_tokens"]:  # its thinking alone overruns the limit
        assert not off["answer"] and off["finish_reason"] == "length"


def check_replay_matches_the_engine(wd: Path) -> None:
    """The calibration's offline replay (pipelines/calibrate/job.py), run with the calibrated exit over
    the test split's greedy EAGLE-3 traces, gives each problem the think tokens and the correctness the
    engine's own SpecExit run has: the replay is what calibration optimises, the engine what users get
    (a `<think>` written by the model was once counted as a think token by the replay alone)."""
    import pyarrow.parquet as pq

    from pipelines.calibrate.job import draft_token_ids, exit_outcome, load_traces, trace_checks
    from specexit_core.exit import ExitConfig
    from specexit_core.exit.replay import first_exit

    exit_cfg = ExitConfig.from_dict(json.loads((wd / "calibrated.json").read_text())["exit"])
    ids = draft_token_ids(str(wd / "draft"))
    rows = pq.read_table(glob.glob(str(wd / "eval" / "part-*.parquet"))).to_pylist()
    engine = {
        r["problem_id"]: r for r in rows if r["method"] == "specexit" and r["status"] == "ok" and not r["temperature"]
    }
    compared = 0
    for tr in load_traces(str(wd / "eval"), 0.0):
        check = first_exit(trace_checks(tr, exit_cfg.alpha, ids), exit_cfg)
        if check is not None and check.index not in tr["probes"]:
            continue  # an unfinished trace: the oracle probed no break of it, the replay cannot judge
        ok, think = exit_outcome(tr, check)
        live = engine[tr["id"]]
        cut = check.index + 1 if check is not None else len(tr["completion"])
        if live["completion_token_ids"][:cut] != tr["completion"][:cut]:
            continue  # greedy in another batch diverged before the exit: nothing to compare
        assert live["think_tokens"] == think, (tr["id"], live["think_tokens"], think)
        if check is not None:  # the engine's answer after its forced </think> vs the probe's (same greedy text)
            assert bool(live["correct"]) == ok, tr["id"]
        compared += 1
    assert compared >= 1
