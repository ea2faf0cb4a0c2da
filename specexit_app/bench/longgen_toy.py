"""What the TokenSwift demo (`longgen_demo.py`) and `specexit bench longgen` share on the toy teacher: its
partial-KV and penalty settings (scaled to its 512 positions) and draft heads trained on the teacher's own
continuations (`specexit_core/longgen/self_distill.py`). Here, not in `specexit_core/longgen/`: the engine does
not know which model it runs on."""

from __future__ import annotations

from pathlib import Path

from specexit_core.longgen.partial_kv import PartialKVConfig
from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.longgen.self_distill import train_heads_on_teacher_text

TOY_KV = PartialKVConfig(budget=128, sinks=8, room=32)  # the drafter reads <= 128 of up to ~480 positions
DEMO_PENALTY = PenaltyConfig(theta=1.2, window=64)  # W scaled down from TokenSwift's 1024 to the toy's lengths


def train_toy_heads(model, tok, target, *, length: int, seqs: int, steps: int, out: str | Path | None):
    """`train_heads_on_teacher_text` on the toy: `seqs` train-split prompts (half with DEMO_PENALTY on), 8 more
    held out."""
    from specexit_core.toy import task
    from specexit_core.toy.teacher_eval import prompt_ids

    prompts = [prompt_ids(tok, p) for p in task.problems("train", seqs + 8, seed=1)]
    return train_heads_on_teacher_text(
        model, target, prompts[:seqs], prompts[seqs:], length=length, steps=steps, penalty=DEMO_PENALTY, out=out
    )
