"""`specexit calibrate` end to end on a few toy dev problems: offline replay, engine confirmation, a
config file the plugin reads (SPECEXIT_EXIT_CONFIG and the draft's exit_defaults)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from support.cli import run_json, specexit
from support.paths import REPO_ROOT

pytestmark = pytest.mark.vllm


def test_calibrate_writes_a_config_the_plugin_reads(tmp_path, monkeypatch):
    from specexit_core.draft.checkpoint import read_config
    from specexit_core.exit import ExitConfig
    from specexit_core.toy.paths import DRAFT_DIR
    from specexit_core.vllm_plugin.controls import request_exit_config, server_defaults

    draft = tmp_path / "draft"
    shutil.copytree(DRAFT_DIR, draft)
    cfg = yaml.safe_load((REPO_ROOT / "examples/toy/calibrate.yaml").read_text())
    cfg.update(
        output=str(tmp_path / "calibrated.json"),
        tolerance=0.0,
        write_draft_defaults=True,
        methods=["confidence", "progress", "confidence_progress_remain"],
        alphas=[0.1, 0.3],
    )
    cfg["eval"].update(output=str(tmp_path / "dev"), draft=str(draft), batch_size=4)
    cfg["eval"]["engine"]["model"] = str(REPO_ROOT / cfg["eval"]["engine"]["model"])
    path = tmp_path / "calibrate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _, out = run_json(specexit("calibrate", "--config", str(path), "--n", "4", "--json"), timeout=600)
    assert out == json.loads((tmp_path / "calibrated.json").read_text())
    chosen = ExitConfig.from_dict(out["exit"])  # every field valid
    c = out["calibration"]
    assert c["n_traces"] == 4 and c["grid_size"] > 10
    assert any(e.startswith("alpha = ") for e in c["at_grid_edge"])  # a 2-value axis: any choice is at an end
    # the tolerance (0 here): never less accurate than EAGLE-3 on the dev split, in replay and for real
    assert c["chosen_replay"]["accuracy"] >= c["eagle3"]["accuracy"] - 1e-9 and c["within_tolerance"]
    assert c["chosen_replay"]["think_tokens"] <= c["default"]["think_tokens"] + 1e-9  # default is in the grid
    conf = c["confirmed"]
    assert conf["within_tolerance"]
    assert conf["specexit"]["think_tokens"] == pytest.approx(c["chosen_replay"]["think_tokens"])  # greedy: same exits
    # the plugin's readers accept it: SPECEXIT_EXIT_CONFIG (a path), the draft's exit_defaults, per request
    monkeypatch.setenv("SPECEXIT_EXIT_CONFIG", str(tmp_path / "calibrated.json"))
    assert server_defaults() == chosen
    monkeypatch.delenv("SPECEXIT_EXIT_CONFIG")
    assert server_defaults(read_config(draft).exit_defaults) == chosen
    assert request_exit_config({"specexit": out["exit"]}, ExitConfig()) == chosen
