"""The qwen3-like teacher's text and shipped files: Qwen3's chat template renders the realistic traces
as Qwen3-Thinking writes (`<think>\\n...\\n</think>\\n\\n` answer `<|im_end|>`), the used vocabulary
covers held-out text, and what ships stays within the issue's 40 MB."""

from __future__ import annotations

import json
import random

import pytest

from specexit_core.teachers import qwen3_like as q3
from specexit_core.teachers.qwen3_like_build import COMPACT_WEIGHTS, TEACHER_META, Qwen3LikeBuildConfig
from specexit_core.teachers.realistic_traces import RealisticStyle
from specexit_core.toy.task import problems


@pytest.fixture(scope="module")
def tok():
    return q3.load_tokenizer()


def test_template_renders_qwen3_thinking_format(tok):
    p = problems("test", 1)[0]
    prompt, completion = q3.render_example(tok, p, random.Random(0), RealisticStyle())
    assert prompt.endswith("<|im_start|>assistant\n") and p.prompt in prompt
    assert completion.startswith("<think>\n") and completion.endswith("<|im_end|>")
    think, answer = completion.split("\n</think>\n\n")
    assert "\n\n" in think and str(p.answer) in answer
    ids, plen = q3.encode_example(tok, prompt, completion)
    assert ids[plen] == q3.THINK_START_ID and q3.THINK_END_ID in ids[plen:]
    assert tok.convert_tokens_to_ids(q3.EOS_TOKEN) == ids[-1] == tok.eos_token_id


def test_shipped_teacher_within_budget_and_covers_held_out_text(tok):
    if not (q3.ASSETS_DIR / COMPACT_WEIGHTS).exists():
        pytest.skip("qwen3-like teacher not built")
    shipped = [q3.ASSETS_DIR / COMPACT_WEIGHTS, *q3.TOKENIZER_DIR.glob("*.json")]
    assert sum(f.stat().st_size for f in shipped) <= 40 * 10**6
    meta = json.loads((q3.ASSETS_DIR / TEACHER_META).read_text())
    assert meta["full_vocab_size"] == q3.FULL_VOCAB_SIZE
    Qwen3LikeBuildConfig.from_json(json.loads((q3.ASSETS_DIR / "build_config.json").read_text()))
    used, rng = set(meta["used_ids"]), random.Random(1)
    for p in problems("test", 40, seed=5):
        ids, _ = q3.encode_example(tok, *q3.render_example(tok, p, rng, RealisticStyle()))
        assert set(ids) <= used


def test_build_trains_and_writes_the_compact_teacher(tmp_path, caplog, one_torch_thread):
    """Two steps of two sequences through the shared teacher training loop: a loss is logged per step,
    and the compact weights + used ids are written (the full recipe: `specexit teacher build`)."""
    import logging

    from safetensors import safe_open

    from specexit_core.teachers.qwen3_like_build import build

    base = Qwen3LikeBuildConfig().to_json()
    cfg = Qwen3LikeBuildConfig.from_json({**base, "steps": 2, "batch_size": 2, "log_every": 1, "threads": 1})
    with caplog.at_level(logging.INFO, logger="specexit.teachers.build"):
        out = build(cfg, tmp_path / "q3")
    losses = [float(r.getMessage().split("loss ")[1].split()[0]) for r in caplog.records if "step " in r.getMessage()]
    assert len(losses) == 2 and all(x > 0 for x in losses)
    meta = json.loads((out / TEACHER_META).read_text())
    assert meta["full_vocab_size"] == q3.FULL_VOCAB_SIZE and len(meta["used_ids"]) > 10
    with safe_open(str(out / COMPACT_WEIGHTS), "pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").shape[0] < q3.FULL_VOCAB_SIZE  # compact rows only
