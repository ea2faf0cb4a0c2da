"""The long writer's EAGLE-3 draft (`teachers/long_writer_draft.py`): a few steps at a tiny size give a
checkpoint the project (and so vLLM's eagle3 drafter) loads, shaped for the 3-layer long writer."""

import json

import pytest
import torch
from safetensors.torch import load_file

from specexit_core.draft.checkpoint import load_draft, read_config
from specexit_core.draft.config import SPECEXIT_ARCH
from specexit_core.exit import SIGNALS
from specexit_core.teachers.long_writer import LONG_WRITER_DIR, LONG_WRITER_DRAFT_DIR
from specexit_core.teachers.long_writer_draft import BUILD_INFO, train_long_writer_draft
from specexit_core.teachers.long_writer_drafters import LongWriterDraftConfig

pytestmark = pytest.mark.skipif(not (LONG_WRITER_DIR / "config.json").exists(), reason="no long writer built")


def test_a_few_steps_give_a_loadable_draft_for_the_long_writer(tmp_path):
    target_cfg = json.loads((LONG_WRITER_DIR / "config.json").read_text())
    tiny = LongWriterDraftConfig(steps=2, seqs=2, seq_len=48, batch_size=2, heldout=1, threads=1)
    info = train_long_writer_draft(tmp_path, tiny)
    assert info["steps"] == 2 and info["train_s"] >= 0
    assert all(torch.isfinite(torch.tensor(info[k])) for k in ("loss_first", "loss_last"))
    assert 0.0 <= info["heldout_acc"]["acc_0"] <= 1.0

    draft = load_draft(tmp_path, expect_signals=True)
    cfg = draft.cfg
    n_layers, vocab = target_cfg["num_hidden_layers"], target_cfg["vocab_size"]
    assert cfg.aux_layer_ids == (0, 1, 2) and max(cfg.aux_layer_ids) < n_layers
    assert cfg.vocab_size == cfg.draft_vocab_size == vocab
    assert cfg.hidden_size == cfg.target_hidden_size == target_cfg["hidden_size"]
    assert cfg.signals == SIGNALS and set(cfg.token_ids) == {"think_start", "think_end", "split"}
    assert draft.d2t.eq(0).all() and draft.t2d.all()  # the draft vocab is the whole vocabulary
    # ... so no vocab maps on disk: vLLM's eagle3 drafter has no d2t parameter then and refuses one
    assert not {"d2t", "t2d"} & set(load_file(str(tmp_path / "model.safetensors")))
    # the walk has no think block: signal labels masked, so the signal rows stay neutral (zero)
    assert draft.fc.weight[cfg.hidden_size :].eq(0).all()

    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [SPECEXIT_ARCH]
    assert saved["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert saved["max_position_embeddings"] == target_cfg["max_position_embeddings"]
    assert read_config(tmp_path).aux_layer_ids == (0, 1, 2)
    assert json.loads((tmp_path / BUILD_INFO).read_text())["settings"]["seq_len"] == 48


def test_the_shipped_draft_is_what_the_default_settings_make():
    """`specexit long-writer draft` with no options trains what ships: its recorded settings are the defaults."""
    meta = json.loads((LONG_WRITER_DRAFT_DIR / BUILD_INFO).read_text())
    defaults = LongWriterDraftConfig().model_dump()
    assert meta["measured"]["steps"] == defaults["steps"]
    assert {k: meta["settings"][k] for k in defaults if k != "steps"} == {
        k: v for k, v in defaults.items() if k != "steps"
    }
    assert meta["settings"]["target"] == "the shipped long writer"
