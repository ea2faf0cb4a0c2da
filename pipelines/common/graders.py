"""Graders for probe answers: extract a canonical answer from text and compare it to a reference.

- toy: the last integer (specexit_core.toy.task.extract_answer);
- numeric: GSM8K-style; a gold like "... #### 1,234" counts from "####"; the last number of a
  probe answer (or the content of \\boxed{...}) counts; commas and trailing ".0" are ignored;
- multiple_choice: the last standalone capital letter A-J (also inside \\boxed{}).
"""

from __future__ import annotations

import re
from collections.abc import Callable

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_LETTER = re.compile(r"\b([A-J])\b")


def _after_think(text: str) -> str:
    return text.rsplit("</think>", 1)[1] if "</think>" in text else text


def extract_toy(text: str) -> str | None:
    from specexit_core.toy.task import extract_answer

    a = extract_answer(text)
    return None if a is None else str(a)


def _canon_number(s: str) -> str | None:
    s = s.replace(",", "").strip().rstrip(".")
    try:
        x = float(s)
    except ValueError:
        return None
    return str(int(x)) if x == int(x) else repr(x)


def extract_numeric(text: str) -> str | None:
    text = _after_think(text)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    nums = _NUM.findall(text)
    return _canon_number(nums[-1]) if nums else None


def extract_choice(text: str) -> str | None:
    text = _after_think(text)
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    letters = _LETTER.findall(text)
    return letters[-1] if letters else None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "toy": extract_toy,
    "numeric": extract_numeric,
    "multiple_choice": extract_choice,
}


def reference_answer(kind: str, gold: str | None, trace_answer: str | None) -> str | None:
    """The gold answer (canonicalized) if given, else the trace's own final answer."""
    ex = EXTRACTORS[kind]
    if gold is not None and gold != "":
        return ex(gold) if kind != "multiple_choice" else (ex(gold) or gold.strip().upper()[:1] or None)
    return ex(trace_answer) if trace_answer else None


def grade(kind: str, text: str, reference: str) -> float:
    return float(EXTRACTORS[kind](text) == reference)
