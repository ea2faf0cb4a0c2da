"""Model references in configs: `toy:teacher`, `teacher:NAME`, local folders, hub ids, URIs.

Every config field that names a model (or a draft) goes through `resolve_model` in its
`resolve_paths()`. The rule lives here, next to the models it names, and not in the config loader
(`specexit_core.typed_config`): the loader is the foundation every config stands on and imports
nothing of the project, while resolving `teacher:NAME` needs the teacher registry and its
materialiser, which build on the toy's training code, itself a user of the loader. With the rule in
the loader, that was an import circle (issue #42).

Why a plain module and not a hook table the loader fills at run time: a config class that resolves
model references imports this module itself, so wherever such a config is loaded -- the CLI,
`python -m pipelines.X`, a Serve replica, a Ray worker -- the rule is there, with no registration
that must have happened first in that process. The loader keeps the path rule
(`base_dir`, `resolve_path`), which this module builds on.

  `toy:teacher` / `toy:draft`   the shipped toy models (inside the package, valid on every node)
  `teacher:NAME`                a built-in teacher's full checkpoint (`registry.TEACHERS`),
                                materialised on first use on each node, then reused while up to date
  a folder that exists          absolute (relative to `base_dir()`, else to the cwd)
  `./x`, `/x`, `~/x`            absolute, existing or not
  anything else                 a hub id (`org/name`) or a URI: passes through for vLLM / transformers

The registry, the materialiser and the toy's paths are imported when a reference needs them, so
loading a config stays as light as the loader itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from specexit_core.typed_config import ConfigError, resolve_path

TOY_PREFIX = "toy:"
TEACHER_PREFIX = "teacher:"


def resolve_model(m: str | None) -> str | None:
    """A model (or draft) reference made usable on this node (see the module docstring)."""
    if m is None or "://" in m:
        return m
    if m.startswith(TOY_PREFIX):
        return toy_model(m)
    if m.startswith(TEACHER_PREFIX):
        return teacher_model(m)
    for local in (Path(resolve_path(m)), Path(m).expanduser().resolve()):
        if local.exists():
            return str(local)
    return resolve_path(m) if m.startswith((".", "/", "~")) else m


def toy_model(name: str) -> str:
    """`toy:teacher` / `toy:draft`: the shipped toy models (inside the package, valid on every node)."""
    from specexit_core.toy import paths

    folders = {"toy:teacher": paths.TEACHER_DIR, "toy:draft": paths.DRAFT_DIR}
    if name not in folders:
        raise ConfigError(f"unknown toy model {name!r}; use toy:teacher or toy:draft")
    return str(folders[name])


# -- built-in teachers -----------------------------------------------------------------------------
def builtin_teachers() -> tuple[str, ...]:
    """The names `teacher:NAME` accepts: the teacher registry's (`specexit_core.teachers.registry`)."""
    from specexit_core.teachers.registry import TEACHERS

    return tuple(TEACHERS)


def builtin_teacher(name: str) -> tuple[Path, Callable[[Path], bool], Callable[[Path], Path]]:
    """(the cached folder, `is_up_to_date(folder)`, `materialize(out) -> out`) of the built-in teacher
    `name`, from the teacher registry; ConfigError for an unknown name. The one place that knows where
    teachers come from."""
    from specexit_core.teachers.materialize import default_dir, is_up_to_date, materialize
    from specexit_core.teachers.registry import get_teacher

    try:
        spec = get_teacher(name)
    except ValueError:
        raise ConfigError(f"unknown built-in teacher {name!r}; known: {', '.join(builtin_teachers())}") from None
    return default_dir(spec.name), lambda out: is_up_to_date(spec, out), lambda out: materialize(spec, out=out)


def teacher_model(ref: str) -> str:
    """`teacher:NAME`: the full checkpoint of a built-in teacher, materialised on first use.

    The cached folder (`specexit teacher materialize NAME` makes the same one) is reused while it was
    made from the shipped weights now in the package. Safe when several processes of one node resolve
    it at once (Ray workers, engine actors, Serve replicas load the config each): an exclusive file
    lock next to the folder, the build in a temporary sibling folder, then a rename into place, so no
    process ever sees a half-written folder."""
    name = ref[len(TEACHER_PREFIX) :]
    if not name:
        raise ConfigError(f"empty teacher name in {ref!r}; known: {', '.join(builtin_teachers())}")
    target, is_up_to_date, build = builtin_teacher(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_up_to_date(target):
            return str(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build(tmp)
            _replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _replace_dir(new: Path, target: Path) -> None:
    """Move the finished folder `new` to `target` (an older `target` is moved aside first, then deleted)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / target.name)
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
