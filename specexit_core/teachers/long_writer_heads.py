"""`specexit long-writer heads`: TokenSwift draft heads for the long writer, trained in-process.

The same self-distillation as the toy's heads (`longgen.self_distill.train_heads_on_teacher_text`): the teacher's
own sampled continuations (T = 0.7, half with the long writer's penalty on) of `seqs` train prompts, `head_len`
tokens each, top-1 accuracy per head on 4 held-out prompts' continuations. The long writer attends through a
1,024-token window, so continuations a little longer than the window show the heads every context they meet
at 16K. Shipped in `LONG_WRITER_HEADS_DIR` with `heads_build.json` (the settings and what training measured);
`scripts/gpu_longgen.py` calls the same function on a GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from specexit_core.teachers.long_writer_drafters import LongWriterHeadsConfig

BUILD_INFO = "heads_build.json"


def train_long_writer_heads(cfg: LongWriterHeadsConfig, out: Path | None, device: str = "cpu") -> dict:
    """Train, save to `out` (with `heads_build.json`), return what was measured."""
    from specexit_core.longgen.penalty import PenaltyConfig
    from specexit_core.longgen.self_distill import train_heads_on_teacher_text
    from specexit_core.longgen.target import Target
    from specexit_core.teachers import long_writer_task as task
    from specexit_core.teachers.long_writer import LONG_WRITER_DIR, load_long_writer
    from specexit_core.teachers.long_writer_check import prompt_ids

    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    model, tok = load_long_writer(LONG_WRITER_DIR)
    model = model.to(device)
    ps = [prompt_ids(tok, p) for p in task.prompts("train", cfg.seqs + 4, seed=1)]
    _, info = train_heads_on_teacher_text(
        model,
        Target(model),
        ps[: cfg.seqs],
        ps[cfg.seqs :],
        length=cfg.head_len,
        steps=cfg.steps,
        penalty=PenaltyConfig(),  # TokenSwift's theta 1.2 over W = 1024: `bench longgen`'s "on" for the long writer
        out=out,
        batch_positions=cfg.batch_positions,
    )
    info = {**info, "seqs": cfg.seqs, "tokens_per_seq": cfg.head_len, "total_s": round(time.perf_counter() - t0, 1)}
    if out is not None:
        measured = {k: v for k, v in info.items() if k != "saved"}  # the folder itself, not a machine's path
        meta = {"config": cfg.model_dump(), "measured": measured, "device": device, "torch": torch.__version__}
        (Path(out) / BUILD_INFO).write_text(json.dumps(meta, indent=2) + "\n")
    return info
