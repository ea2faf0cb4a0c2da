"""The shipped SpecExit toy draft: checkpoint layout, held-out signal quality, and its trainer."""

import json

from specexit_core.draft.checkpoint import load_draft, read_config
from specexit_core.toy.draft_build import DraftTrainConfig, heldout_signal_metrics, make_traces
from specexit_core.toy.hf_generate import load_teacher
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from support.cli import run, specexit, tail


def test_shipped_draft_is_a_specexit_checkpoint():
    cfg = read_config(DRAFT_DIR)
    assert cfg.signals == ("confidence", "progress", "remaining")
    assert cfg.token_ids and cfg.token_ids["think_end"] > 0 and cfg.token_ids["split"]
    raw = json.loads((DRAFT_DIR / "config.json").read_text())
    assert raw["architectures"] == ["SpecExitLlamaForCausalLMEagle3"]
    assert raw["eagle_aux_hidden_state_layer_ids"] == list(cfg.aux_layer_ids)
    d = load_draft(DRAFT_DIR)
    assert tuple(d.fc.weight.shape) == (cfg.hidden_size + 3, 3 * cfg.target_hidden_size)


def test_heldout_signal_quality(teacher):
    """Fresh held-out traces (test split, greedy + sampled), probe labels, the shipped heads."""
    model, tok = teacher
    cfg = DraftTrainConfig(n_heldout=60)
    held = make_traces(model, tok, "test", 60, cfg, seed=77)
    m = heldout_signal_metrics(load_draft(DRAFT_DIR), model, held)
    assert m["progress_mae"] <= 0.15, m
    assert m["confidence_auroc"] >= 0.85, m


def test_train_draft_cli_runs_end_to_end(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"n_train": 24, "n_heldout": 8, "steps": 3, "batch_size": 4, "log_every": 1}))
    out = run(specexit("toy", "train-draft", "--config", str(cfg), "--out", str(tmp_path / "d")), timeout=900)
    assert out.returncode == 0, tail(out)
    assert "step 3/3" in out.stderr and "token" in out.stderr  # step logs with loss terms
    model, _ = load_teacher(TEACHER_DIR)
    d = load_draft(tmp_path / "d", target_embed=model.get_input_embeddings().weight)
    assert d.cfg.draft_vocab_size == DraftTrainConfig().draft_vocab_size
    assert "heldout" in json.loads((tmp_path / "d" / "specexit_train.json").read_text())
