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


def test_cli_rejects_an_unknown_key_before_any_work(calls, tmp_path):
    from specexit_app.cli import main
    from specexit_core.typed_config import ConfigError

    raw = yaml.safe_load((REPO_ROOT / "examples/toy/calibrate.yaml").read_text())
    raw["tolerence"] = 0.02  # a typo
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="tolerence"):
        main(["calibrate", "--config", str(bad)])
    assert calls == []
