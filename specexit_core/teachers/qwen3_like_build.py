"""`specexit teacher build qwen3-like`: train the qwen3-like teacher from scratch (fixed seed, CPU).

The training set is sampled up front (fresh problem, fresh realistic trace per sequence, rendered by
Qwen3's chat template), so the used vocabulary is known before the model exists. The model is the
compact `Qwen3ForCausalLM` (embedding rows for the used ids only) trained with the exact restricted
softmax of `restricted_vocab.py`; the loss covers the assistant's tokens only. What is saved is the
compact model in bf16 plus `teacher.json` (used ids, full vocabulary size); `materialize.py` turns
that into the full checkpoint.
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

from specexit_core.teachers import qwen3_like as q3
from specexit_core.teachers.realistic_traces import RealisticStyle
from specexit_core.teachers.restricted_vocab import RestrictedVocab
from specexit_core.toy.task import iter_problems
from specexit_core.toy.teacher_model import TeacherArch
from specexit_core.toy.train_loop import TrainRecipe, train

log = logging.getLogger("specexit.teachers.build")

COMPACT_WEIGHTS = "model.safetensors"
TEACHER_META = "teacher.json"
BUILD_CONFIG = "build_config.json"


class Qwen3LikeBuildConfig(TrainRecipe):
    """The qwen3-like teacher's recipe (`--config FILE`, and `build_config.json` beside the weights):
    the optimiser settings of `TrainRecipe` with this teacher's defaults, the model shape and style."""

    # arch.vocab_size is the *full* vocabulary of the materialised checkpoint
    arch: TeacherArch = Field(
        default_factory=lambda: TeacherArch(vocab_size=q3.FULL_VOCAB_SIZE, max_position_embeddings=1024)
    )
    style: RealisticStyle = Field(default_factory=RealisticStyle)
    steps: int = 170  # ~20 min on 2 shared cores
    batch_size: int = 32
    warmup_steps: int = 15
    log_every: int = 10


def sample_examples(cfg: Qwen3LikeBuildConfig, tok, n: int) -> list[tuple[list[int], int]]:
    rng = random.Random(cfg.seed)
    probs = iter_problems("train", seed=cfg.seed)
    return [q3.encode_example(tok, *q3.render_example(tok, next(probs), rng, cfg.style)) for _ in range(n)]


def used_vocab(tok, examples: list[tuple[list[int], int]]) -> RestrictedVocab:
    """Every id the training text uses, plus the ids the template and the parsers rely on."""
    ids = {t for x, _ in examples for t in x}
    ids |= {q3.THINK_START_ID, q3.THINK_END_ID, *tok.convert_tokens_to_ids([q3.EOS_TOKEN, q3.PAD_TOKEN])}
    ids |= {tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    return RestrictedVocab(tuple(sorted(ids)), q3.FULL_VOCAB_SIZE)


def hf_config(arch: TeacherArch, tok, vocab: RestrictedVocab | None = None):
    """The full config (vocab None) or the compact one (ids renumbered into the used set)."""
    ids = [tok.convert_tokens_to_ids(t) for t in (q3.BOS_TOKEN, q3.EOS_TOKEN, q3.PAD_TOKEN)]
    if vocab is not None:
        ids = vocab.to_compact(torch.tensor(ids)).tolist()
        arch = replace(arch, vocab_size=vocab.n_used)
    bos, eos, pad = ids
    return arch.hf_config(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)


def batches(examples, vocab: RestrictedVocab, cfg: Qwen3LikeBuildConfig, pad: int):
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


def build(cfg: Qwen3LikeBuildConfig, out_dir: Path) -> Path:
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.time()
    tok = q3.load_tokenizer()
    examples = sample_examples(cfg, tok, cfg.steps * cfg.batch_size)
    vocab = used_vocab(tok, examples)
    log.info(
        "%d sequences rendered (%.0fs); %d used ids of %d",
        len(examples),
        time.time() - t0,
        vocab.n_used,
        vocab.full_size,
    )
    compact_cfg = hf_config(cfg.arch, tok, vocab)
    model = Qwen3ForCausalLM(compact_cfg)
    log.info(
        "qwen3-like teacher: %.2fM parameters (compact), %d steps x %d sequences",
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
    meta = {"name": q3.NAME, "used_ids": list(vocab.used_ids), "full_vocab_size": vocab.full_size}
    (out_dir / TEACHER_META).write_text(json.dumps(meta) + "\n")
    (out_dir / BUILD_CONFIG).write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    log.info("saved the compact qwen3-like teacher to %s (%.0fs)", out_dir, time.time() - t0)
    return out_dir
