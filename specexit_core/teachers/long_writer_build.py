"""`specexit long-writer build`: train the long writer from scratch (fixed seed, CPU) on short PoSE windows.

Training at 16K on 2 cores is out of reach, so every training sequence is a short window (~500 tokens)
whose *position ids* are those the same tokens would have in a 20K-token output (positional skip-wise
training, PoSE, Zhu et al. 2023): the prompt at positions 0..10, then 1-3 chunks of consecutive walk lines,
each chunk at its true place (line j starts at prompt + 13 j) anywhere up to `MAX_OUTPUT_TOKENS`, with gaps
in between. The walk can be written from a line index alone, so any chunk is synthesised without generating
what precedes it. RoPE only sees relative distances, so this shows the model every distance it meets in a
16K output: chunk -> prompt and chunk -> earlier chunk up to 20K, next to the local distances inside a chunk.
That is what must hold at 16K: the local step reads the previous line at a fixed short distance, and the
thousands of older tokens, at distances never seen in a plain 512-token window, must not pull attention
away from it (line 0's lookups of the prompt's parameters are trained in the windows that start there). A chunk's first line has no loss (its previous line is
not in the window), except for a chunk that starts at line 0 (its previous "line" is the prompt).

Position ids travel to the loss as a second channel of the ids tensor (`train_loop.train` passes the batch
through untouched). The attention mask is passed explicitly: without one, transformers reads position-id
jumps as packed sequences and would cut the chunks off from the prompt.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from specexit_core.teachers.long_writer import MAX_OUTPUT_TOKENS, LongWriterArch
from specexit_core.teachers.long_writer_task import LINE_TOKENS, WalkPrompt, sample_prompt
from specexit_core.teachers.long_writer_tokenizer import BOS, build_tokenizer
from specexit_core.toy.train_loop import TrainRecipe, save_teacher, train
from specexit_core.typed_config import StrictModel

log = logging.getLogger("specexit.teachers.long_writer")
BUILD_CONFIG = "build_config.json"


class PoseWindows(StrictModel):
    """How training windows are cut and placed (see the module docstring)."""

    window_tokens: int = 512  # prompt + chain tokens per training sequence (at most)
    max_chunks: int = 3  # chain chunks per window, 1..max_chunks, each at its true position
    min_chunk_lines: int = 4
    start_at_zero: float = 0.4  # share of windows whose first chunk is the walk's beginning (line 0 reads the prompt)
    max_output_tokens: int = MAX_OUTPUT_TOKENS  # positions trained: a chunk ends before this output token
    # "always": the prompt heads every window (PoSE: chunks see it at their true distance); "at_line_0": a
    # window is one run of consecutive tokens, the prompt only where the run starts at line 0 -- for a
    # sliding-window model, whose far lines cannot see the prompt (a gap would put it inside the window)
    prompt: Literal["always", "at_line_0"] = "always"

    @model_validator(mode="after")
    def _one_run(self):
        if self.prompt == "at_line_0" and self.max_chunks != 1:
            raise ValueError("pose.prompt 'at_line_0' cuts one run of consecutive lines: max_chunks must be 1")
        return self


class ShortWindows(StrictModel):
    """A second window shape mixed into a long-window stage: a stage on long windows alone raises the far
    buckets but forgets the near ones within ~60 steps (docs/longgen.md, r3-r5), so a share of its steps
    trains short windows again. A short step holds `batch_size` windows (keep its tokens near a long
    step's, so every step costs about the same)."""

    share: float = Field(0.5, ge=0.0, le=1.0)  # of the steps (drawn per step, seeded)
    batch_size: int = Field(16, ge=1)
    pose: PoseWindows = Field(default_factory=PoseWindows)


class LongWriterBuildConfig(TrainRecipe):
    """The long writer's recipe (`--config FILE`, and `build_config.json` beside the weights)."""

    arch: LongWriterArch = Field(default_factory=LongWriterArch)
    pose: PoseWindows = Field(default_factory=PoseWindows)
    short: ShortWindows | None = None  # None: every step is `batch_size` windows of `pose`
    steps: int = 547  # the shipped build: ~16 min on 2 cores (set from the measured time per step)
    batch_size: int = 16  # more, smaller steps: the budget is minutes, the lookup tables want updates
    lr: float = 3e-3
    warmup_steps: int = 36
    log_every: int = 25
    # a folder this build continues from (its weights, and its build_config.json kept as "previous"):
    # a second stage with a fresh learning-rate schedule, for when one stage's budget stops short
    init_from: str | None = None

    @model_validator(mode="after")
    def _windows_fit_the_mask(self):
        # transformers masks a sliding window by index within the sequence: a window with a gap (PoSE's
        # prompt, then a chunk far away) would let the chunk see tokens its true distance hides
        shapes = [self.pose] + ([self.short.pose] if self.short is not None else [])
        if self.arch.sliding_window is not None and any(p.prompt != "at_line_0" for p in shapes):
            raise ValueError(
                "a sliding-window long writer trains on runs of consecutive tokens: pose.prompt 'at_line_0'"
            )
        return self


class LineIds:
    """Token ids of walk lines without running the tokenizer per line (batch making stays ~1% of a step)."""

    def __init__(self, tok):
        self.tok = tok
        ids = tok.convert_tokens_to_ids
        self.step, self.colon, self.plus, self.comma, self.dot, self.nl = ids(["Step", " :", " +", " ,", " .", "\n"])
        self.num = ids([f" {v}" for v in range(100)])

    def __call__(self, prompt: WalkPrompt, i: int) -> list[int]:
        h, lo, x, a, y, b = prompt.state(i)
        n = self.num
        return [
            self.step,
            n[h],
            n[lo],
            self.colon,
            n[x],
            self.plus,
            n[a],
            self.comma,
            n[y],
            self.plus,
            n[b],
            self.dot,
            self.nl,
        ]


def window(
    prompt: WalkPrompt, rng: random.Random, cfg: PoseWindows, lines: LineIds
) -> tuple[list[int], list[int], list[int]]:
    """(ids, labels, position ids) of one PoSE window of `prompt`'s walk."""
    p_ids = lines.tok(prompt.text, add_special_tokens=False)["input_ids"]
    n_lines = (cfg.window_tokens - len(p_ids)) // LINE_TOKENS
    k = rng.randint(1, cfg.max_chunks)
    cuts = sorted(rng.sample(range(cfg.min_chunk_lines, n_lines - cfg.min_chunk_lines + 1), k - 1)) if k > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n_lines])]
    if any(s < cfg.min_chunk_lines for s in sizes):  # two cuts too close: one chunk
        sizes = [n_lines]
    # gaps: sorted uniform points over the free lines, so chunks are ordered and never overlap
    free = cfg.max_output_tokens // LINE_TOKENS - n_lines
    points = sorted(rng.randint(0, free) for _ in sizes)
    if rng.random() < cfg.start_at_zero:
        points[0] = 0
    ids, labels, pos = list(p_ids), [-100] * len(p_ids), list(range(len(p_ids)))
    if cfg.prompt == "at_line_0" and points[0] != 0:
        ids, labels, pos = [], [], []
    before = 0
    for size, point in zip(sizes, points):
        start = point + before  # first line index of the chunk
        before += size
        for i in range(start, start + size):
            line = lines(prompt, i)
            ids += line
            labels += line if (i > start or i == 0) else [-100] * len(line)
            pos += range(len(p_ids) + i * LINE_TOKENS, len(p_ids) + (i + 1) * LINE_TOKENS)
    return ids, labels, pos


def batches(cfg: LongWriterBuildConfig, tok):
    """Endless batches of (ids and position ids stacked [B, 2, T], labels [B, T], attention [B, T]); with
    `cfg.short`, each step draws its window shape."""
    rng = random.Random(cfg.seed)
    lines = LineIds(tok)
    while True:
        pose, size = cfg.pose, cfg.batch_size
        if cfg.short is not None and rng.random() < cfg.short.share:
            pose, size = cfg.short.pose, cfg.short.batch_size
        rows = [window(sample_prompt(rng, "train"), rng, pose, lines) for _ in range(size)]
        n = max(len(r[0]) for r in rows)
        x = torch.zeros(len(rows), 2, n, dtype=torch.long)
        lab = torch.full((len(rows), n), -100, dtype=torch.long)
        att = torch.zeros(len(rows), n, dtype=torch.long)
        for r, (ids, labels, pos) in enumerate(rows):
            x[r, 0, : len(ids)], x[r, 1, : len(ids)] = torch.tensor(ids), torch.tensor(pos)
            lab[r, : len(ids)], att[r, : len(ids)] = torch.tensor(labels), 1
        yield x, lab, att


def pose_loss(model, x: torch.Tensor, lab: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x[:, 0], position_ids=x[:, 1], attention_mask=att, labels=lab).loss


# The shipped model's later stages (`build_shipped`), each continuing the one before with a fresh schedule.
# Stage 2: the first stage's weights under a sliding window of 1,024 positions in every layer, trained on runs
# of ~84 consecutive lines (1,100 tokens: a full window and then some) anywhere up to 20K, 30% of them from
# line 0 and its prompt; 420 steps of 8, 749 s on the 2 cores. It taught what no full-attention stage did in
# 2-8K windows (docs/longgen.md): >= 99.8% of 16K, but the walk's first lines, the only ones that read the
# prompt, were right 61-92% of the time. Stages 3 and 4 keep stage 2's windows for half the steps and spend the
# other half on the walk's beginning: 24 runs of 300 tokens, then 64 of 115 (line 0 right 84%, then 95%).
_WINDOWED = {"window_tokens": 1100, "max_chunks": 1, "start_at_zero": 0.3, "prompt": "at_line_0"}
WINDOWED_STAGE = {
    "seed": 11,
    "steps": 420,
    "batch_size": 8,
    "lr": 1e-3,
    "warmup_steps": 10,
    "log_every": 10,
    "arch": {"sliding_window": 1024},
    "pose": _WINDOWED,
}


def _early_lines_stage(seed: int, batch: int, tokens: int) -> dict:
    begin = {"window_tokens": tokens, "max_chunks": 1, "start_at_zero": 1.0, "prompt": "at_line_0"}
    return {
        **WINDOWED_STAGE,
        "seed": seed,
        "steps": 200,
        "lr": 5e-4,
        "short": {"share": 0.5, "batch_size": batch, "pose": begin},
    }


SHIPPED_STAGES = (WINDOWED_STAGE, _early_lines_stage(12, 24, 300), _early_lines_stage(13, 64, 115))


def stage_recipe(stage: dict, init_from: str | Path) -> LongWriterBuildConfig:
    return LongWriterBuildConfig.from_json({**stage, "init_from": str(init_from)})


def build_shipped(out_dir: Path) -> Path:
    """The shipped long writer from scratch: stage 1 (the default recipe: PoSE windows, full attention), then
    each of `SHIPPED_STAGES` from the one before; stages 1-3 go to `out_dir/stageN`, the last to `out_dir`
    (~37 min on 2 cores)."""
    out_dir = Path(out_dir)
    prev = build(LongWriterBuildConfig(), out_dir / "stage1")
    for n, stage in enumerate(SHIPPED_STAGES, start=2):
        last = n == len(SHIPPED_STAGES) + 1
        prev = build(stage_recipe(stage, prev), out_dir if last else out_dir / f"stage{n}")
    return prev


def load_recipe(d: dict) -> LongWriterBuildConfig:
    """A recipe from a JSON dict: a bare `LongWriterBuildConfig`, or a shipped `build_config.json`."""
    return LongWriterBuildConfig.from_json(d.get("recipe", d))


def machine() -> str:
    import os
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"


def build(cfg: LongWriterBuildConfig, out_dir: Path) -> Path:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = build_tokenizer()
    hf_cfg = cfg.arch.hf_config(
        bos_token_id=tok.convert_tokens_to_ids(BOS), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    previous = None
    if cfg.init_from:
        model = Qwen3ForCausalLM.from_pretrained(cfg.init_from, config=hf_cfg, dtype=torch.float32)
        prev_meta = Path(cfg.init_from) / BUILD_CONFIG
        previous = json.loads(prev_meta.read_text()) if prev_meta.exists() else None
    else:
        model = Qwen3ForCausalLM(hf_cfg)
    log.info(
        "long writer: %.2fM parameters, %d steps x %d windows of <= %d tokens",
        sum(p.numel() for p in model.parameters()) / 1e6,
        cfg.steps,
        cfg.batch_size,
        cfg.pose.window_tokens,
    )
    t0 = time.time()
    train(model, batches(cfg, tok), pose_loss, cfg, log)
    train_s = time.time() - t0
    # EOS is never trained: the walk does not end, generation stops at the length asked for
    out_dir = save_teacher(model, tok, out_dir)
    # the recipe (`--config` accepts this file as it is), the training time; `long-writer check --record` adds
    # the measured check next to them
    meta = {"recipe": cfg.to_json(), "train_s": round(train_s, 1), "machine": machine(), "previous": previous}
    (out_dir / BUILD_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    log.info("saved the long writer to %s (%.0fs of training)", out_dir, train_s)
    return out_dir
