"""The shipped toy teacher: files match the builder's recipe, it loads, and it reasons correctly."""

import json

from safetensors import safe_open

from specexit_core.toy.build import BuildConfig
from specexit_core.toy.hf_generate import generate, load_teacher
from specexit_core.toy.paths import TEACHER_DIR
from specexit_core.toy.task import grade, problems
from specexit_core.toy.teacher_eval import evaluate, oracle_exit, prompt_ids
from specexit_core.toy.tokenizer import build_tokenizer
from support.cli import run, run_json, specexit, tail


def test_shipped_files_match_build_config():
    cfg = BuildConfig.from_json(json.loads((TEACHER_DIR / "build_config.json").read_text()))
    tok = build_tokenizer()
    want = cfg.arch.hf_config(
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    ).to_dict()
    have = json.loads((TEACHER_DIR / "config.json").read_text())
    for key in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "eos_token_id",
        "pad_token_id",
        "architectures",
        "model_type",
    ]:
        assert have[key] == want[key], key
    weights = TEACHER_DIR / "model.safetensors"
    assert weights.stat().st_size < 10 * 2**20  # "a few MB"
    with safe_open(str(weights), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
        assert tuple(emb.shape) == (cfg.arch.vocab_size, cfg.arch.hidden_size)
        n_layers = {k.split(".")[2] for k in f.keys() if k.startswith("model.layers.")}  # noqa: SIM118 (safe_open: keys(), no iteration)
        assert len(n_layers) == cfg.arch.num_hidden_layers


def test_build_config_rejects_unknown_keys():
    import pytest

    with pytest.raises(ValueError, match="stepz"):  # a ConfigError naming the key
        BuildConfig.from_json({"stepz": 3})


def test_teacher_solves_held_out_problems(teacher):
    model, tok = teacher
    ps = problems("test", 24, seed=7)
    outs = generate(model, tok, [prompt_ids(tok, p) for p in ps], max_new_tokens=400)
    texts = [tok.decode(o) for o in outs]
    assert all("</think>" in t for t in texts)
    assert sum(grade(t, p.answer) for t, p in zip(texts, ps)) >= 20
    # a trace looks like reasoning: several paragraphs, the answer after </think>
    assert all(t.split("</think>")[0].count("\n\n") >= 2 for t in texts)


def test_greedy_think_length_varies_across_problems(teacher):
    model, tok = teacher
    ps = problems("test", 24, seed=7)
    outs = generate(model, tok, [prompt_ids(tok, p) for p in ps], max_new_tokens=400)
    close = tok.convert_tokens_to_ids("</think>")
    lens = {o.index(close) for o in outs if close in o}
    assert len(lens) >= 8


def test_forced_answer_after_last_calculation_is_right(teacher):
    """The overthinking the exit removes exists: cutting after the last step already answers right."""
    model, tok = teacher
    close, brk = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("\n\n")
    ps = problems("test", 12, seed=11)
    prompts = [prompt_ids(tok, p) for p in ps]
    outs = generate(model, tok, prompts, max_new_tokens=400)
    saved = []
    for p, pr, o in zip(ps, prompts, outs):
        cut, probes = oracle_exit(pr, o, p.answer, model=model, tok=tok, close_id=close, break_id=brk)
        if cut is not None:
            assert probes and probes[-1][1]  # the last break is the natural end: right
            saved.append((o.index(close) - cut) / o.index(close))
    assert len(saved) >= 10 and sum(saved) / len(saved) > 0.3


def test_eval_reports_every_field(teacher):
    res = evaluate(TEACHER_DIR, n=16).to_json()
    for key in [
        "accuracy",
        "accuracy_sampled",
        "mean_think_tokens",
        "think_tokens_std",
        "overthinking_ratio",
        "slip_rate_sampled",
        "n",
    ]:
        assert key in res
    assert res["n"] == 16 and 0 <= res["accuracy"] <= 1 and res["mean_think_tokens"] > 10


def test_cli_toy_eval_json():
    _, res = run_json(specexit("toy", "eval", "--n", "8", "--json"), timeout=600)
    assert res["n"] == 8 and "overthinking_ratio" in res


def test_builder_runs_end_to_end(tmp_path):
    """A 3-step build of 4 sequences each writes a folder that transformers loads (the full recipe is
    `specexit toy build`; its batch of 64 under bf16 autocast takes ~40 s a step on 2 cores)."""
    small = {"batch_size": 4, "bucket_batches": 1, "log_every": 1, "bf16_autocast": False}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({**BuildConfig().to_json(), **small}))
    out = run(
        specexit("toy", "build", "--config", str(recipe), "--steps", "3", "--out", str(tmp_path / "t")), timeout=600
    )
    assert out.returncode == 0, tail(out)
    assert "step 3/3" in out.stderr + out.stdout  # training progress is logged
    model, tok = load_teacher(tmp_path / "t")
    assert model.config.num_hidden_layers == BuildConfig().arch.num_hidden_layers
    built = json.loads((tmp_path / "t" / "build_config.json").read_text())
    assert built["steps"] == 3 and built["batch_size"] == 4
