"""`specexit teacher build NAME`: train a built-in teacher from scratch (fixed seed, CPU), for any
`TeacherSpec` (`spec.py`, `registry.py`).

The training set is sampled up front (fresh problem, fresh realistic trace per sequence, rendered by
the teacher's chat template), so the used vocabulary is known before the model exists. The model is
the teacher's HF class, compact (embedding rows for the used ids only), trained with the exact
restricted softmax of `restricted_vocab.py`; the loss covers the assistant's tokens only. What is
saved is the compact model in bf16 plus `teacher.json` (used ids, full vocabulary size) and
`build_config.json`; `materialize.py` turns that into the full checkpoint.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
from pydantic import Field

from specexit_core.teachers.realistic_traces import RealisticStyle
from specexit_core.teachers.restricted_vocab import RestrictedVocab
from specexit_core.teachers.spec import TeacherSpec
from specexit_core.toy.task import iter_problems
from specexit_core.toy.teacher_model import TeacherArch
from specexit_core.toy.train_loop import TrainRecipe, train

log = logging.getLogger("specexit.teachers.build")

COMPACT_WEIGHTS = "model.safetensors"
TEACHER_META = "teacher.json"
BUILD_CONFIG = "build_config.json"


class TeacherBuildConfig(TrainRecipe):
    """A built-in teacher's recipe (`--config FILE`, and `build_config.json` beside the weights): the
    optimiser settings of `TrainRecipe` with the built-in teachers' defaults, the model shape and the
    trace style. The same fields for every teacher; only `arch.vocab_size` (the *full* vocabulary of
    the materialised checkpoint) differs, so read configs with `load_build_config(spec, ...)`."""

    arch: TeacherArch = Field(default_factory=TeacherArch)
    style: RealisticStyle = Field(default_factory=RealisticStyle)
    # 1200 x 64 sequences in float32: 33-38 min of 2 AVX2 cores (~5,000 tokens/s on these models)
    steps: int = 1200
    batch_size: int = 64
    warmup_steps: int = 100
    log_every: int = 50


def default_config(spec: TeacherSpec) -> TeacherBuildConfig:
    lr = {} if spec.build_lr is None else {"lr": spec.build_lr}
    return TeacherBuildConfig(arch=spec.default_arch(), style=spec.build_style, **lr)


def load_build_config(spec: TeacherSpec, d: dict | None = None) -> TeacherBuildConfig:
    """`d` over the teacher's defaults, one level deep (a partial `arch` keeps the teacher's
    vocabulary); unknown keys are errors (ConfigError)."""
    base = default_config(spec).to_json()
    for k, v in (d or {}).items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    cfg = TeacherBuildConfig.from_json(base)
    if cfg.arch.vocab_size != spec.full_vocab_size:
        raise ValueError(f"arch.vocab_size {cfg.arch.vocab_size} is not {spec.name}'s {spec.full_vocab_size} rows")
    return cfg


def sample_examples(spec: TeacherSpec, cfg: TeacherBuildConfig, tok, n: int) -> list[tuple[list[int], int]]:
    rng = random.Random(cfg.seed)
    probs = iter_problems("train", seed=cfg.seed)
    return [spec.encode_example(tok, *spec.render_example(tok, next(probs), rng, cfg.style)) for _ in range(n)]


def used_vocab(spec: TeacherSpec, tok, examples: list[tuple[list[int], int]]) -> RestrictedVocab:
    """Every id the training text uses, plus the ids the template and the parsers rely on, and every
    number token up to the tokenizer's digit group (so held-out numbers are never outside it)."""
    ids = {t for x, _ in examples for t in x}
    special = [spec.bos_token, spec.eos_token, spec.pad_token]
    ids |= {spec.think_start_id, spec.think_end_id, *tok.convert_tokens_to_ids(special)}
    ids |= {tok.convert_tokens_to_ids(str(d)) for d in range(10**spec.digits_per_token)}
    return RestrictedVocab(tuple(sorted(ids)), spec.full_vocab_size)


def hf_config(spec: TeacherSpec, arch: TeacherArch, tok, vocab: RestrictedVocab | None = None):
    """The full config (vocab None) or the compact one (ids renumbered into the used set)."""
    ids = [tok.convert_tokens_to_ids(t) for t in (spec.bos_token, spec.eos_token, spec.pad_token)]
    if vocab is not None:
        ids = vocab.to_compact(torch.tensor(ids)).tolist()
        arch = replace(arch, vocab_size=vocab.n_used)
    bos, eos, pad = ids
    return spec.hf_config(arch, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)


def batches(examples, vocab: RestrictedVocab, cfg: TeacherBuildConfig, pad: int):
    """Length-bucketed batches of (compact ids, compact labels, attention mask), in a seeded order."""
    rng = random.Random(cfg.seed + 1)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    chunks = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    rng.shuffle(chunks)
    for ch in chunks:
        n = max(len(examples[i][0]) for i in ch)
        ids = torch.full((len(ch), n), pad, dtype=torch.long)
        lab = torch.full((len(ch), n), -100, dtype=torch.long)
        att = torch.zeros((len(ch), n), dtype=torch.long)
        for r, i in enumerate(ch):
            x, plen = examples[i]
            cx = vocab.to_compact(torch.tensor(x))
            ids[r, : len(x)] = cx
            lab[r, plen : len(x)] = cx[plen:]
            att[r, : len(x)] = 1
        yield ids, lab, att


def restricted_loss(model, vocab: RestrictedVocab, ids, lab, att) -> torch.Tensor:
    """Next-token cross-entropy of the *full* vocabulary, computed over the used ids + one class."""
    h = model.model(input_ids=ids, attention_mask=att).last_hidden_state[:, :-1]
    tgt = lab[:, 1:]
    keep = tgt != -100
    logits = model.lm_head(h[keep])
    return -vocab.log_probs(logits).gather(-1, tgt[keep].unsqueeze(-1)).mean()


def build(spec: TeacherSpec, cfg: TeacherBuildConfig, out_dir: Path) -> Path:
    from safetensors.torch import save_file

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.time()
    tok = spec.load_tokenizer()
    examples = sample_examples(spec, cfg, tok, cfg.steps * cfg.batch_size)
    vocab = used_vocab(spec, tok, examples)
    log.info(
        "%d sequences rendered (%.0fs); %d used ids of %d",
        len(examples),
        time.time() - t0,
        vocab.n_used,
        vocab.full_size,
    )
    compact_cfg = hf_config(spec, cfg.arch, tok, vocab)
    model = spec.model_class()(compact_cfg)
    log.info(
        "%s teacher: %.2fM parameters (compact), %d steps x %d sequences",
        spec.name,
        sum(p.numel() for p in model.parameters()) / 1e6,
        cfg.steps,
        cfg.batch_size,
    )
    train(
        model,
        batches(examples, vocab, cfg, compact_cfg.pad_token_id),
        lambda m, ids, lab, att: restricted_loss(m, vocab, ids, lab, att),
        cfg,
        log,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
    }
    save_file(state, str(out_dir / COMPACT_WEIGHTS))
    meta = {"name": spec.name, "used_ids": list(vocab.used_ids), "full_vocab_size": vocab.full_size}
    (out_dir / TEACHER_META).write_text(json.dumps(meta) + "\n")
    (out_dir / BUILD_CONFIG).write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    log.info("saved the compact %s teacher to %s (%.0fs)", spec.name, out_dir, time.time() - t0)
    return out_dir
