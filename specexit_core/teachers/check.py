"""Greedy check of a built-in teacher with transformers: format, accuracy and think lengths.

On held-out problems (the task's test split): is the completion well formed for the teacher's
template (`well_formed`), is the answer right (the toy task's grader, which reads the last integer
after `</think>`), how long is the thinking and how much does it vary.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from specexit_core.teachers.spec import TeacherSpec
from specexit_core.toy.hf_generate import generate, load_teacher
from specexit_core.toy.task import grade, problems


@dataclass
class TeacherCheck:
    n: int
    accuracy: float
    well_formed: float  # share with the thinking opened and closed once, then a non-empty answer
    mean_think_tokens: float
    think_tokens_std: float
    min_think_tokens: int
    max_think_tokens: int
    unfinished: int  # never closed </think> within the token limit
    split: str

    def to_json(self) -> dict:
        return asdict(self)


def well_formed(spec: TeacherSpec, ids: list[int], tok) -> bool:
    """Qwen3's shape: the completion opens `<think>` itself. R1's: the prompt opened it, so the
    completion starts with thinking text and must not open a second block. Both: `</think>` once,
    then a non-empty answer."""
    if not ids:
        return False
    if spec.think_in_prompt:
        if spec.think_start_id in ids:
            return False
    elif ids[0] != spec.think_start_id:
        return False
    if ids.count(spec.think_end_id) != 1:
        return False
    return bool(tok.decode(ids[ids.index(spec.think_end_id) + 1 :]).strip())


def check(
    spec: TeacherSpec,
    model_dir: str | Path,
    n: int = 100,
    *,
    seed: int = 0,
    max_new_tokens: int = 700,
    split: str = "test",
):
    """(TeacherCheck, the completions' token ids). Think tokens: those before `</think>` in the
    completion (Qwen3's count includes its own `<think>`)."""
    model, tok = load_teacher(model_dir)
    probs = problems(split, n, seed=seed)  # type: ignore[arg-type]
    prompts = [spec.prompt_ids(tok, p) for p in probs]
    outs = generate(model, tok, prompts, max_new_tokens=max_new_tokens, batch_size=32)
    lens = [o.index(spec.think_end_id) for o in outs if spec.think_end_id in o]
    return TeacherCheck(
        n=n,
        accuracy=sum(grade(tok.decode(o), p.answer) for o, p in zip(outs, probs)) / n,
        well_formed=sum(well_formed(spec, o, tok) for o in outs) / n,
        mean_think_tokens=statistics.mean(lens) if lens else 0.0,
        think_tokens_std=statistics.pstdev(lens) if len(lens) > 1 else 0.0,
        min_think_tokens=min(lens, default=0),
        max_think_tokens=max(lens, default=0),
        unfinished=n - len(lens),
        split=split,
    ), outs
