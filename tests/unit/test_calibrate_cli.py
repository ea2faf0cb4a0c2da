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


def _serve_config(tmp_path, generation: dict | None, engine_kwargs: dict | None = None, apps=("specexit",)):
    """A Serve config whose model folder (a copy of the toy teacher's config) has `generation` as its
    generation_config.json."""
    import shutil

    from specexit_core.toy.paths import TEACHER_DIR

    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(TEACHER_DIR / "config.json", model / "config.json")
    if generation is not None:
        (model / "generation_config.json").write_text(json.dumps(generation))
    args = {"model": {"id": "m", "source": str(model), "accelerator": "cpu", "engine_kwargs": engine_kwargs or {}}}
    doc = {"applications": [{"name": n, "import_path": "serve_app.app:build_app", "args": args} for n in apps]}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    "generation, engine_kwargs, want_temps, want_profile",
    [
        (
            {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True},
            None,
            [0.0, 0.6],
            "T0.6-p0.95-k20",
        ),  # Qwen3's
        ({"do_sample": False}, None, [0.0, 1.0], "T1"),  # no sampling defaults: vLLM's neutral T = 1
        (None, {"override_generation_config": {"temperature": 0.7}}, [0.0, 0.7], "T0.7"),
        ({"temperature": 0.6, "top_p": 0.95}, {"generation_config": "vllm"}, [0.0, 1.0], "T1"),
        ({"temperature": 0.0}, None, [0.0], None),  # a greedy deployment: greedy only
    ],
)
def test_the_served_sampling_read_from_the_serve_config(
    calls, tmp_path, generation, engine_kwargs, want_temps, want_profile
):
    """`--serve-config`: the profile vLLM serves a request that names none with (the model's
    generation_config.json as vLLM applies it), calibrated with greedy; a flag given wins."""
    from specexit_app.cli import main

    serve = _serve_config(tmp_path, generation, engine_kwargs)
    assert main(["calibrate", "--output", str(tmp_path / "c.json"), "--serve-config", str(serve), "--json"]) in (
        0,
        None,
    )
    cfg = calls[-1]
    assert cfg.temperatures == want_temps
    if want_profile:
        assert cfg.eval.sampling_profile(want_temps[-1]).name == want_profile
    argv = ["calibrate", "--output", str(tmp_path / "d.json"), "--serve-config", str(serve), "--top-p", "0.9", "--json"]
    assert main(argv) in (0, None)
    assert calls[-1].temperatures == want_temps and calls[-1].eval.top_p == 0.9


def test_serve_config_mistakes_are_refused_before_any_work(calls, tmp_path, capsys):
    from specexit_app.cli import main

    serve = _serve_config(tmp_path, {"temperature": 0.6}, apps=("a", "b"))
    assert main(["calibrate", "--serve-config", str(serve)]) == 2
    assert "--app" in capsys.readouterr().err
    argv = ["calibrate", "--serve-config", str(serve), "--app", "b", "--output", str(tmp_path / "c.json"), "--json"]
    assert main(argv) in (0, None)
    assert main(["calibrate", "--app", "b"]) == 2
    assert "--serve-config" in capsys.readouterr().err and len(calls) == 1
