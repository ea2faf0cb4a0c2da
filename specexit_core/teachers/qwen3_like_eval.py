"""Greedy check of the qwen3-like teacher with transformers: format, accuracy and think lengths.

On held-out problems (the task's test split): does the completion open `<think>`, close it with
`</think>` and then answer; is the answer right (the toy task's grader, which reads the last integer
after `</think>`); how long is the thinking and how much does it vary.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from specexit_core.teachers import qwen3_like as q3
from specexit_core.toy.hf_generate import generate, load_teacher
from specexit_core.toy.task import grade, problems


@dataclass
class TeacherCheck:
    n: int
    accuracy: float
    well_formed: float  # share opening <think>, closing </think> once, then a non-empty answer
    mean_think_tokens: float
    think_tokens_std: float
    min_think_tokens: int
    max_think_tokens: int
    unfinished: int  # never closed </think> within the token limit
    split: str

    def to_json(self) -> dict:
        return asdict(self)


def well_formed(ids: list[int], tok) -> bool:
    if not ids or ids[0] != q3.THINK_START_ID or ids.count(q3.THINK_END_ID) != 1:
        return False
    return bool(tok.decode(ids[ids.index(q3.THINK_END_ID) + 1 :]).strip())


def prompt_ids(tok, p) -> list[int]:
    return tok(q3.chat_prompt(tok, p), add_special_tokens=False)["input_ids"]


def check(model_dir: str | Path, n: int = 100, *, seed: int = 0, max_new_tokens: int = 700, split: str = "test"):
    """(TeacherCheck, the completions' token ids)."""
    model, tok = load_teacher(model_dir)
    probs = problems(split, n, seed=seed)  # type: ignore[arg-type]
    outs = generate(model, tok, [prompt_ids(tok, p) for p in probs], max_new_tokens=max_new_tokens, batch_size=32)
    lens = [o.index(q3.THINK_END_ID) for o in outs if q3.THINK_END_ID in o]
    return TeacherCheck(
        n=n,
        accuracy=sum(grade(tok.decode(o), p.answer) for o, p in zip(outs, probs)) / n,
        well_formed=sum(well_formed(o, tok) for o in outs) / n,
        mean_think_tokens=statistics.mean(lens) if lens else 0.0,
        think_tokens_std=statistics.pstdev(lens) if len(lens) > 1 else 0.0,
        min_think_tokens=min(lens, default=0),
        max_think_tokens=max(lens, default=0),
        unfinished=n - len(lens),
        split=split,
    ), outs
