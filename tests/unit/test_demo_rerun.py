"""A rerun of `specexit demo` over a finished work folder: the calibrate stage is finished when the draft
carries the calibrated file's settings (its last step wrote them), so the rerun neither redoes it nor
trips over its dev run (whose draft then differs: the run identity refuses to resume into it); the serve
stage is finished when serve.json checked this draft with the same app and requests."""

from __future__ import annotations

import json
import shutil

from specexit_app.demo import calibration_brief, finished_calibration, finished_serve, serve_identity
from specexit_core.draft.checkpoint import set_exit_defaults
from specexit_core.exit import ExitConfig
from specexit_core.toy.paths import DRAFT_DIR
from support.paths import REPO_ROOT


def _calibrated(exit_cfg: dict) -> dict:
    cert = {"epsilon": 0.01, "delta": 0.1, "loss": "disagreement", "n_dev": 8, "chosen": exit_cfg, "bound": 0.2}
    profile = {"sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0}, "exit": exit_cfg}
    return {
        "exit": exit_cfg,
        "by_profile": {"T0": profile},
        "efforts": {"low": {"epsilon": 0.05, "exit": exit_cfg, "by_profile": {"T0": profile}}},
        "calibration": {
            "eagle3": {"accuracy": 1.0, "think_tokens": 40},
            "oracle": {"think_tokens": 20},
            "chosen_replay": {"accuracy": 1.0, "think_tokens": 25},
            "selection": "tolerance",
            "certificate": cert,
            "by_profile": {"T0": {"exit": exit_cfg, "certificate": cert, "replay": {"accuracy": 1.0}}},
        },
    }


def test_a_calibration_the_draft_carries_is_finished(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT_DIR, draft)
    chosen = ExitConfig(confidence_threshold=0.4, alpha=0.05).to_dict()
    out = _calibrated(chosen)
    path = tmp_path / "calibrated.json"
    assert finished_calibration(path, str(draft)) is None  # nothing calibrated yet
    path.write_text(json.dumps(out))
    set_exit_defaults(draft, {**chosen, "alpha": 0.1}, out["by_profile"], out["efforts"])
    assert finished_calibration(path, str(draft)) is None  # the draft carries another exit: not this run's
    set_exit_defaults(draft, chosen, out["by_profile"], None)
    assert finished_calibration(path, str(draft)) is None  # the effort levels were not written yet
    set_exit_defaults(draft, chosen, out["by_profile"], out["efforts"])  # what the stage's last step writes
    assert finished_calibration(path, str(draft)) == out
    brief = calibration_brief(out)
    assert brief["exit"] == chosen and brief["certificate"]["selection"] == "tolerance"
    assert brief["by_profile"]["T0"] == {"setting": chosen, "bound": 0.2, "replay": {"accuracy": 1.0}}
    path.write_text("{not json")
    assert finished_calibration(path, str(draft)) is None


def test_an_endpoint_check_of_this_draft_is_finished(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT_DIR, draft)
    serve_yaml = str(REPO_ROOT / "serve_app" / "toy_cpu.yaml")
    identity = serve_identity(serve_yaml, str(draft), 2, 400)
    assert identity["app"]["model"]["draft"] == str(draft) and identity["draft"]
    out = tmp_path / "serve.json"
    assert finished_serve(out, identity) is None  # not served yet
    summary = {"model": "m", "requests": 4, "exits": 1, "complete": True}
    out.write_text(json.dumps({**summary, "identity": identity, "rows": [{"answer": "7"}]}))
    assert finished_serve(out, identity) == summary  # a rerun reads the check back, rows left out
    assert finished_serve(out, serve_identity(serve_yaml, str(draft), 3, 400)) is None  # other requests
    set_exit_defaults(draft, ExitConfig(confidence_threshold=0.4).to_dict())  # the draft carries another exit
    assert finished_serve(out, serve_identity(serve_yaml, str(draft), 2, 400)) is None
    out.write_text(json.dumps({**summary, "complete": False, "identity": identity}))
    assert finished_serve(out, identity) is None
    out.write_text("[1, 2")
    assert finished_serve(out, identity) is None
