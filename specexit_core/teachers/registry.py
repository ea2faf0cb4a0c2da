"""The built-in teachers with real vocabularies, by CLI name (`specexit teacher build|materialize|check NAME`).

The toy (`specexit toy ...`) and the long writer (`specexit long-writer ...`) have their own
commands: their tokenizers are the project's own, not a real model's."""

from __future__ import annotations

from specexit_core.teachers import qwen3_like, r1_llama_like
from specexit_core.teachers.spec import TeacherSpec

TEACHERS: dict[str, TeacherSpec] = {s.name: s for s in (qwen3_like.SPEC, r1_llama_like.SPEC)}


def get_teacher(name: str) -> TeacherSpec:
    """The built-in teacher `name` (`qwen3-like`, `r1-llama-like`); ValueError naming the choices otherwise."""
    try:
        return TEACHERS[name]
    except KeyError:
        raise ValueError(f"unknown teacher {name!r}; choices: {', '.join(TEACHERS)}") from None
