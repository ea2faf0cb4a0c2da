"""The long writer (issue #14, item 2): the walk task, its checker, the PoSE windows, the shipped model."""

import json
import random

import pytest

from specexit_core.teachers.long_writer import LONG_WRITER_DIR, MAX_MODEL_LEN, MAX_OUTPUT_TOKENS
from specexit_core.teachers.long_writer_build import (
    SHIPPED_STAGES,
    WINDOWED_STAGE,
    LineIds,
    LongWriterBuildConfig,
    PoseWindows,
    ShortWindows,
    batches,
    stage_recipe,
    window,
)
from specexit_core.teachers.long_writer_task import LINE_TOKENS, WalkPrompt, next_state, prompts, render, score
from specexit_core.teachers.long_writer_tokenizer import build_tokenizer

P = WalkPrompt(s=69, t=26, a=9, b=5)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_lines_follow_the_rule_and_have_a_fixed_length(tok):
    state = P.state(0)
    assert state == (0, 0, 69, 9, 26, 5)
    for i in range(1, 1600):
        state = next_state(state)  # from the previous line alone
        assert state == P.state(i)
    assert P.line(199) == "Step 1 99 : 60 + 9 , 21 + 5 .\n" and P.line(200) == "Step 2 0 : 69 + 9 , 26 + 5 .\n"
    assert all(len(ids_of(tok, P.line(i))) == LINE_TOKENS for i in (0, 99, 100, 1555))
    assert len(ids_of(tok, P.text)) == 11 and tok.decode(ids_of(tok, P.text + P.line(7))) == P.text + P.line(7)


def test_a_correct_walk_scores_one_in_every_bucket(tok):
    ids = ids_of(tok, P.reference(1300))[:16384]
    sc = score(P, ids, tok)
    assert sc.n_steps == 16384 // LINE_TOKENS  # the cut last line is not a step
    assert sc.fraction_correct == sc.fraction_reference == 1.0 and sc.first_error is None
    assert {k: b["correct"] for k, b in sc.buckets().items()} == {"0-1K": 1.0, "1K-4K": 1.0, "4K-16K": 1.0}


def test_a_corrupted_step_is_detected(tok):
    lines = [P.line(i) for i in range(600)]
    h, lo, x, a, y, b = P.state(500)
    lines[500] = render((h, lo, (x + 1) % 100, a, y, b))  # one wrong number
    lines[300] = "Step 3 0 : 9 + 9 , 9 9 .\n"  # malformed
    sc = score(P, "".join(lines), tok)
    bad = [s.index for s in sc.steps if not s.correct]
    # the wrong line, and the next one (it does not follow from what was written); the malformed line only
    assert bad == [300, 500, 501]
    assert [s.index for s in sc.steps if not s.matches_reference] == [300, 500]
    assert sc.first_error == 300 * LINE_TOKENS
    b = sc.buckets()  # line 300 starts at output token 3900, line 500 at 6500
    assert b["1K-4K"]["correct"] == pytest.approx(1 - 1 / b["1K-4K"]["steps"])
    assert b["4K-16K"]["correct"] == pytest.approx(1 - 2 / b["4K-16K"]["steps"]) and b["0-1K"]["correct"] == 1.0


def test_a_slip_the_model_then_follows_counts_once(tok):
    shifted = WalkPrompt(P.s + 1, P.t, P.a, P.b)  # from line 10 on, X is one off and keeps the rule
    text = P.reference(10) + shifted.reference(50, start=10)
    sc = score(P, text, tok)
    assert [s.index for s in sc.steps if not s.correct] == [10]
    assert sum(not s.matches_reference for s in sc.steps) == 50


def test_test_prompts_are_not_train_prompts():
    ps = prompts("test", 20)
    assert all(p.split == "test" for p in ps) and len(set(ps)) == 20
    assert all(1 <= p.a <= 9 and 1 <= p.b <= 9 for p in ps)


def test_pose_windows_hold_the_true_tokens_at_their_true_positions(tok):
    lines = LineIds(tok)
    rng = random.Random(3)
    cfg = PoseWindows()
    full = ids_of(tok, P.text + P.reference(MAX_OUTPUT_TOKENS // LINE_TOKENS + 1))
    far = 0
    for _ in range(50):
        ids, labels, pos = window(P, rng, cfg, lines)
        assert len(ids) == len(labels) == len(pos) <= cfg.window_tokens
        assert pos == sorted(set(pos)) and pos[-1] < len(full)
        assert ids == [full[q] for q in pos]  # every token sits where it would be in one long output
        assert labels[:11] == [-100] * 11  # no loss on the prompt
        # a chunk's first line (its previous line is not in the window) has no loss, unless it is line 0
        for k in range(11, len(pos)):
            if pos[k] != pos[k - 1] + 1 and pos[k] != 11:
                assert labels[k : k + LINE_TOKENS] == [-100] * LINE_TOKENS
        far = max(far, pos[-1])
    assert far > 15000  # positions reach a 16K output


def test_a_long_window_stage_mixes_in_short_steps_at_the_share_asked(tok):
    from itertools import islice

    long = PoseWindows(window_tokens=2048, max_chunks=2, min_chunk_lines=16)
    short = ShortWindows(share=0.5, batch_size=8, pose=PoseWindows())
    shapes = [
        tuple(x.shape)
        for x, _, _ in islice(batches(LongWriterBuildConfig(batch_size=2, pose=long, short=short), tok), 40)
    ]
    n_short = sum(b == 8 and t <= 512 for b, _, t in shapes)
    assert all((b, t <= 512) in ((8, True), (2, False)) for b, _, t in shapes)
    assert 10 <= n_short <= 30  # about half the steps, drawn from the seeded stream
    plain = [tuple(x.shape) for x, _, _ in islice(batches(LongWriterBuildConfig(batch_size=2, pose=long), tok), 10)]
    assert all(b == 2 and t > 512 for b, _, t in plain)  # no `short`: every step is a long one


def test_windowed_stage_windows_are_runs_of_consecutive_tokens(tok):
    """A sliding-window stage trains on one run of true consecutive tokens per window: the prompt heads it only
    where it starts at line 0, else its first line (previous line outside the window) has no loss."""
    lines = LineIds(tok)
    rng = random.Random(5)
    cfg = stage_recipe(WINDOWED_STAGE, "unused").pose
    full = ids_of(tok, P.text + P.reference(MAX_OUTPUT_TOKENS // LINE_TOKENS + 1))
    at_zero = 0
    for _ in range(40):
        ids, labels, pos = window(P, rng, cfg, lines)
        assert pos == list(range(pos[0], pos[0] + len(pos)))  # no gap: index distance = true distance
        assert ids == [full[q] for q in pos] and len(ids) >= 1024  # a full window of context, and then some
        if pos[0] == 0:
            at_zero += 1
            assert labels[:11] == [-100] * 11 and labels[11:] == ids[11:]
        else:
            assert labels[:LINE_TOKENS] == [-100] * LINE_TOKENS and labels[LINE_TOKENS:] == ids[LINE_TOKENS:]
    assert 4 <= at_zero <= 24  # ~30% start at line 0


def test_window_shapes_that_do_not_fit_a_sliding_window_are_refused():
    with pytest.raises(ValueError, match="at_line_0"):  # PoSE gaps would sit inside the window
        LongWriterBuildConfig.from_json({"arch": {"sliding_window": 1024}})
    with pytest.raises(ValueError, match="max_chunks must be 1"):
        PoseWindows(prompt="at_line_0", max_chunks=2)


def test_shipped_model_config_and_size(tok):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(LONG_WRITER_DIR))
    assert cfg.architectures == ["Qwen3ForCausalLM"] and cfg.tie_word_embeddings
    assert cfg.max_position_embeddings == MAX_MODEL_LEN >= 16384 + 11 + 1000
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    shipped = AutoTokenizer.from_pretrained(str(LONG_WRITER_DIR))
    assert shipped.get_vocab() == tok.get_vocab()
    assert sum(f.stat().st_size for f in LONG_WRITER_DIR.iterdir()) <= 10 * 2**20
    built = json.loads((LONG_WRITER_DIR / "build_config.json").read_text())
    assert built["recipe"]["arch"]["max_position_embeddings"] == MAX_MODEL_LEN
    # every layer windowed, as the build's second stage made it (a stock Qwen3 config)
    assert cfg.use_sliding_window and cfg.sliding_window == 1024 and set(cfg.layer_types) == {"sliding_attention"}
    assert built["recipe"] == stage_recipe(SHIPPED_STAGES[-1], "stage3").to_json()  # the last of the stages


def test_shipped_model_writes_correct_steps(tok):
    import torch

    from specexit_core.longgen.plain import plain_decode
    from specexit_core.longgen.target import Target
    from specexit_core.teachers.long_writer import load_long_writer

    torch.set_num_threads(1)
    model, mtok = load_long_writer()
    target = Target(model)
    assert target.window == 1024
    for p in prompts("test", 2, seed=1):  # past the window: what a position 16K in sees
        out = plain_decode(target, ids_of(mtok, p.text), 1400).token_ids
        assert score(p, out, mtok).fraction_correct >= 0.95


def test_heads_command_trains_saves_and_records_heads(tmp_path, capsys):
    """`specexit long-writer heads` at a tiny size: heads load back for the shipped model, with their settings."""
    from specexit_app.cli import main
    from specexit_core.longgen.heads import load_heads

    out = tmp_path / "heads"
    argv = ["long-writer", "heads", "--out", str(out), "--seqs", "2", "--head-len", "24", "--steps", "3"]
    assert main([*argv, "--batch-positions", "32", "--threads", "1"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["steps"] == 3 and info["seqs"] == 2 and len(info["head_top1"]) == 3
    heads = load_heads(out)
    assert heads.cfg.hidden_size == 256 and heads.cfg.num_heads == 3
    meta = json.loads((out / "heads_build.json").read_text())
    assert meta["config"]["head_len"] == 24 and meta["measured"]["positions"] > 0


def test_the_shipped_heads_are_what_the_default_settings_make():
    from specexit_core.teachers.long_writer import LONG_WRITER_HEADS_DIR
    from specexit_core.teachers.long_writer_drafters import LongWriterHeadsConfig

    meta = json.loads((LONG_WRITER_HEADS_DIR / "heads_build.json").read_text())
    assert meta["config"] == LongWriterHeadsConfig().model_dump()
