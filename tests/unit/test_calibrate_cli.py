"""`specexit calibrate --config F --n N --output O --json`: the CLI's wiring to the calibration job
(the job itself runs for real as stage 4 of `specexit demo --quick`, tests/integration/test_demo.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from support.paths import REPO_ROOT


@pytest.fixture
def calls(monkeypatch):
    import pipelines.calibrate.job as job

    seen = []

    def fake_run(cfg):
        seen.append(cfg)
        return {"exit": {"method": "confidence"}, "calibration": {"n_traces": cfg.eval.limit}}

    monkeypatch.setattr(job, "run_calibration", fake_run)
    monkeypatch.setattr(job, "stop_ray_quietly", lambda: None)
    return seen


def test_cli_passes_config_limit_and_output(calls, tmp_path, capsys):
    from specexit_app.cli import main

    rc = main(["calibrate", "--config", str(REPO_ROOT / "examples/toy/calibrate.yaml"), "--n", "4", "--output",
               str(tmp_path / "c.json"), "--json"])  # fmt: skip
    assert rc in (0, None)
    (cfg,) = calls
    assert cfg.eval.limit == 4 and cfg.output == str(tmp_path / "c.json") and cfg.tolerance == 0.01
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["calibration"]["n_traces"] == 4


def test_cli_rejects_an_unknown_key_before_any_work(calls, tmp_path, capsys):
    from specexit_app.cli import main

    raw = yaml.safe_load((REPO_ROOT / "examples/toy/calibrate.yaml").read_text())
    raw["tolerence"] = 0.02  # a typo
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert main(["calibrate", "--config", str(bad)]) == 2  # the message, not a traceback
    assert "tolerence" in capsys.readouterr().err
    assert calls == []


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_prompts_file_calibrates_without_gold(calls, tmp_path, suffix):
    """`--prompts FILE`: the dev run reads the file (its kind from the name), with no gold column, grades
    against each EAGLE-3 trace's own answer, and the exit is the certified one under the disagreement
    loss; its traces go beside the calibrated file."""
    from specexit_app.cli import main

    prompts = tmp_path / f"mine.{suffix}"
    prompts.write_text("")
    out = tmp_path / "mine" / "calibrated.json"
    argv = ["calibrate", "--prompts", str(prompts), "--output", str(out), "--n", "50", "--json"]
    assert main([*argv, "--prompt-column", "question"]) in (0, None)
    (cfg,) = calls
    inp = cfg.eval.input
    assert (inp.kind, inp.path, inp.prompt_column, inp.gold_column) == (suffix, str(prompts), "question", None)
    assert cfg.eval.grade_against == "natural_end" and cfg.eval.limit == 50
    assert (cfg.selection, cfg.loss) == ("certified", "disagreement")
    assert cfg.eval.output == str(tmp_path / "mine" / "calibrated-dev")
    # the recipe's own dev split is untouched without --prompts
    calls.clear()
    assert main(["calibrate", "--output", str(out), "--json"]) in (0, None)
    (cfg,) = calls
    assert cfg.eval.input.kind == "toy" and cfg.eval.grade_against == "gold"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prompts", "/no/such/prompts.jsonl"], "no such file"),
        (["--prompts", "{tmp}/prompts.txt"], "cannot tell the input kind"),
        (["--prompt-column", "question"], "--prompt-column goes with --prompts"),
        (["--temperatures", "0.6,0"], "must start with 0.0"),
        (["--temperatures", "0,warm"], "could not convert"),
        (["--samples", "0"], "samples"),
        (["--top-p", "1.5"], "top_p"),
    ],
)
def test_prompts_mistakes_are_refused_before_any_work(calls, tmp_path, capsys, argv, message):
    from specexit_app.cli import main

    (tmp_path / "prompts.txt").write_text("x\n")
    assert main(["calibrate", *[a.format(tmp=tmp_path) for a in argv]]) == 2
    assert message in capsys.readouterr().err and calls == []


def test_the_served_sampling_and_samples_per_prompt(calls, tmp_path):
    """The deployment's sampling given on the command line: each temperature a profile (top-p / top-k on
    every sampled request), k samples per prompt at the sampled ones."""
    from specexit_app.cli import main

    argv = ["calibrate", "--output", str(tmp_path / "c.json"), "--temperatures", "0,0.6", "--top-p", "0.95"]
    assert main([*argv, "--top-k", "20", "--samples", "4", "--json"]) in (0, None)
    (cfg,) = calls
    assert cfg.temperatures == [0.0, 0.6] and cfg.eval.samples == 4
    assert cfg.eval.sampling_profile(0.6).name == "T0.6-p0.95-k20" and cfg.eval.samples_at(0.0) == 1
