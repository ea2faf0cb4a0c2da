"""Self-distillation of TokenSwift draft heads: the teacher's own sampled continuations (EOS ignored) as the
training data, top-1 accuracy per head on held-out continuations. Any teacher: the toy's heads
(`specexit_app/bench/longgen_toy.py`), the long writer's (`teachers/long_writer_heads.py`)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specexit_core.longgen.heads import save_heads
from specexit_core.longgen.penalty import PenaltyConfig, penalise
from specexit_core.longgen.plain import NO_PENALTY
from specexit_core.longgen.train_heads import HeadTrainConfig, head_accuracy, train_heads


@torch.inference_mode()
def teacher_continuations(model, prompts: list[list[int]], length: int, temperature: float, seed: int, penalty):
    """Batched sampling from the teacher on its device, EOS ignored (left padding); returns prompt + continuation
    per row."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    n = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), n, dtype=torch.long, device=dev)
    att = torch.zeros(len(prompts), n, dtype=torch.long, device=dev)
    for r, p in enumerate(prompts):
        ids[r, n - len(p) :], att[r, n - len(p) :] = torch.tensor(p, device=dev), 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    out = [list(p) for p in prompts]
    cur, cur_pos, past = ids, pos, None
    for _ in range(length):
        o = model(input_ids=cur, attention_mask=att, position_ids=cur_pos, past_key_values=past, use_cache=True)
        past, logits = o.past_key_values, o.logits[:, -1].float()
        if penalty.enabled:
            present = torch.zeros_like(logits, dtype=torch.bool)
            for r, seq in enumerate(out):
                present[r, seq[-penalty.window :]] = True
            logits = penalise(logits, present, penalty.theta)
        nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
        for r, t in enumerate(nxt[:, 0].tolist()):
            out[r].append(t)
        cur, cur_pos = nxt, cur_pos[:, -1:] + 1
        att = torch.cat([att, torch.ones(len(prompts), 1, dtype=att.dtype, device=dev)], -1)
    return out


def train_heads_on_teacher_text(
    model,
    target,
    prompts: list[list[int]],
    held_prompts: list[list[int]],
    *,
    length: int,
    steps: int,
    penalty: PenaltyConfig,
    out: str | Path | None,
    batch_positions: int | None = None,
):
    """Heads trained on the teacher's own sampled continuations of `length` tokens (T = 0.7, the second half
    of `prompts` with `penalty` on), top-1 accuracy per head on continuations of `held_prompts`. Saved to `out`
    when given. Returns (heads, info). The toy's (`specexit_app/bench/longgen_toy.train_toy_heads`) and the long
    writer's (`teachers/long_writer_heads.py`; on a GPU: scripts/gpu_longgen.py)."""
    t0 = time.perf_counter()
    half = len(prompts) // 2
    data = teacher_continuations(model, prompts[:half], length, 0.7, 0, NO_PENALTY) if half else []
    data += teacher_continuations(model, prompts[half:], length, 0.7, 1, penalty)
    held = teacher_continuations(model, held_prompts, length, 0.7, 2, NO_PENALTY)
    gen_s = time.perf_counter() - t0
    cfg = HeadTrainConfig(steps=steps, **({"batch_positions": batch_positions} if batch_positions else {}))
    heads, info = train_heads(target, data, cfg)
    info.update(data_s=gen_s, head_top1=head_accuracy(heads, target, held), saved=str(out) if out else None)
    if out:
        save_heads(heads, out)
    return heads, info
