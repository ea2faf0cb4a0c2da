"""`specexit toy build`: train the toy reasoning teacher from scratch (fixed seed, CPU, ~14 min).

Data is generated on the fly from the train split (a fresh problem and a fresh sampled trace per
sequence), so the model sees slips, corrections and a problem-dependent amount of re-checking.
The loss covers the assistant's tokens only. Weights are saved as bfloat16 safetensors (a few MB);
load them in float32 for parity between transformers and vLLM.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch
from pydantic import Field

from specexit_core.toy.task import iter_problems
from specexit_core.toy.teacher_model import TeacherArch
from specexit_core.toy.tokenizer import build_tokenizer
from specexit_core.toy.traces import TraceStyle, make_trace
from specexit_core.toy.train_loop import TrainRecipe, save_teacher, train

log = logging.getLogger("specexit.toy.build")


class BuildConfig(TrainRecipe):
    """The toy teacher's recipe (`specexit toy build --config FILE`, and `build_config.json` next to
    the weights): the optimiser settings of `TrainRecipe`, the model shape and the trace style."""

    arch: TeacherArch = Field(default_factory=TeacherArch)
    style: TraceStyle = Field(default_factory=TraceStyle)
    bf16_autocast: bool = True  # the shipped toy was built with it
    bucket_batches: int = 8  # sort this many batches' worth of sequences by length to cut padding


def chat_prompt(tok, user: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)


def encode_example(tok, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = tok(completion + tok.eos_token, add_special_tokens=False)["input_ids"]
    return p + c, [-100] * len(p) + c


def batches(cfg: BuildConfig, tok):
    """Endless length-bucketed batches of (input_ids, labels, attention_mask)."""
    rng = random.Random(cfg.seed)
    probs = iter_problems("train", seed=cfg.seed)
    pad = tok.pad_token_id
    while True:
        exs = []
        for _ in range(cfg.batch_size * cfg.bucket_batches):
            p = next(probs)
            tr = make_trace(p, rng, cfg.style)
            exs.append(encode_example(tok, chat_prompt(tok, p.prompt), tr.completion))
        exs.sort(key=lambda e: len(e[0]))
        chunks = [exs[i : i + cfg.batch_size] for i in range(0, len(exs), cfg.batch_size)]
        rng.shuffle(chunks)
        for ch in chunks:
            n = max(len(e[0]) for e in ch)
            ids = torch.full((len(ch), n), pad, dtype=torch.long)
            lab = torch.full((len(ch), n), -100, dtype=torch.long)
            att = torch.zeros((len(ch), n), dtype=torch.long)
            for i, (x, y) in enumerate(ch):
                ids[i, : len(x)] = torch.tensor(x)
                lab[i, : len(y)] = torch.tensor(y)
                att[i, : len(x)] = 1
            yield ids, lab, att


def _hf_loss(model, ids, lab, att):
    return model(input_ids=ids, attention_mask=att, labels=lab).loss


def build(cfg: BuildConfig, out_dir: Path) -> Path:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = build_tokenizer()
    hf_cfg = cfg.arch.hf_config(
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen3ForCausalLM(hf_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("toy teacher: %.2fM parameters, %d steps x %d sequences", n_params / 1e6, cfg.steps, cfg.batch_size)
    t0 = time.time()
    train(model, batches(cfg, tok), _hf_loss, cfg, log)
    out_dir = save_teacher(model, tok, out_dir)
    (out_dir / "build_config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    log.info("saved toy teacher to %s (%.0fs)", out_dir, time.time() - t0)
    return out_dir
