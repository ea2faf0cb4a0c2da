"""`specexit demo --teacher NAME --quick --json` on a built-in teacher, and the checks every such run
must pass whatever the teacher: the toy demo's JSON, traces in the teacher's chat template closed by
its `</think>`, labels at its tokenizer's single-token paragraph breaks, a top-N draft vocab over its
full vocabulary, the Serve endpoint splitting the reasoning with its vLLM parser, the report.

The teacher's constants come from its `TeacherSpec` (think ids, full vocabulary, template shape,
parser) and the sizes from its demo recipe (`examples/<name>/demo.yaml`, quick block); the test module
of each teacher (`tests/integration/test_demo_<name>.py`, one per teacher so that pytest-xdist's
`loadfile` runs them on different workers) adds what is particular to its template."""

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


@dataclass
class DemoArtifacts:
    """What the run wrote, read back for the teacher's own checks."""

    tok: object  # the teacher's tokenizer
    traces_ok: list[dict]  # trace rows with status ok
    labels: list[dict]  # label rows with at least one boundary
    breaks: set[str]  # decoded boundary tokens
    draft: dict  # the draft's config.json
    serve: dict  # serve.json (summary + rows)


def run_teacher_demo(tmp_path: Path, teacher: str, *, timeout: float = 2400) -> DemoRun:
    """`specexit demo --teacher TEACHER --quick --json` in `tmp_path/demo`, materialising the teacher
    into `tmp_path/teachers` (by the run itself: driver and Ray workers), offline."""
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


def check_teacher_demo(run: DemoRun, spec) -> DemoArtifacts:
    """The teacher-generic assertions on a quick demo run of `spec`'s teacher; returns what it read."""
    import pyarrow.parquet as pq

    from specexit_app.demo_config import load_demo_config
    from specexit_core.exit.split_tokens import split_token_ids
    from specexit_core.typed_config import read_yaml

    res, wd, st = run.res, run.wd, run.res["stages"]
    cfg = load_demo_config(teacher=spec.name, quick=True)
    # the toy demo's JSON, plus the teacher's name
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

    # traces: the teacher's chat template, closed by its </think>; the thinking is opened by the prompt
    # (R1: then never again by the model) or by the model (Qwen3)
    tok = spec.load_tokenizer()
    traces = pq.read_table(glob.glob(str(wd / "traces" / "part-*.parquet"))).to_pylist()
    ok = [r for r in traces if r["status"] == "ok"]
    ending = prompt_ending(spec, tok)
    assert ok and all(tok.decode(r["prompt_token_ids"]).endswith(ending) for r in ok)
    assert all((spec.think_start_id in r["prompt_token_ids"]) == spec.think_in_prompt for r in ok)
    if spec.think_in_prompt:
        assert all(spec.think_start_id not in r["completion_token_ids"] for r in ok)
    closed = [r for r in ok if r["finished_think"]]
    assert closed and all(spec.think_end_id in r["completion_token_ids"] for r in closed)

    # labels: probed at the tokenizer's single-token paragraph breaks (".\n\n", not a bare "\n\n" after a period)
    labels = [r for r in pq.read_table(glob.glob(str(wd / "labels" / "part-*.parquet"))).to_pylist() if r["boundaries"]]
    split = set(split_token_ids(tok))
    assert labels and all(r["completion_token_ids"][b] in split for r in labels for b in r["boundaries"])
    breaks = {tok.decode([r["completion_token_ids"][b]]) for r in labels for b in r["boundaries"]}
    assert breaks and all(b.endswith("\n\n") for b in breaks) and ".\n\n" in breaks

    # the draft: a small top-N vocab over the full target vocabulary, calibrated, then served and evaluated
    draft = json.loads((wd / "draft" / "config.json").read_text())
    assert draft["vocab_size"] == spec.full_vocab_size
    assert draft["draft_vocab_size"] == read_yaml(cfg.train_draft)["draft_vocab_size"]
    assert draft["specexit"]["exit_defaults"] == st["calibrate"]["exit"]

    # the endpoint: the teacher's reasoning parser (the serve recipe's) returns the thinking as
    # reasoning, usage carries SpecExit's telemetry
    serve_app = read_yaml(cfg.serve)["applications"][0]["args"]["model"]
    assert serve_app["reasoning_parser"] == spec.reasoning_parser and serve_app["source"] == f"teacher:{spec.name}"
    serve = json.loads((wd / "serve.json").read_text())
    assert serve["requests"] == 2 * cfg.serve_requests and serve["reasoning_separated"]
    assert st["serve"]["reasoning_separated"]
    for r in serve["rows"]:  # (a thinking that never closes comes back all reasoning, answer None)
        assert r["reasoning"] and "</think>" not in (r["answer"] or "") and "<think>" not in r["reasoning"]
        assert r["usage_specexit"]["enabled"] == r["specexit"] and r["usage_specexit"]["think_tokens"] > 0
    assert any(r["answer"] for r in serve["rows"])  # at least one closed thinking, split by the parser
    check_replay_matches_the_engine(wd)
    report = Path(res["report"])
    assert report.exists() and "| specexit |" in report.read_text()
    assert "Ray stopped" in run.out.stderr.strip().splitlines()[-1]
    return DemoArtifacts(tok, ok, labels, breaks, draft, serve)


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
