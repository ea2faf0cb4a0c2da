"""The one config style of the project: strict pydantic models, one loader, one path rule.

Every run config (pipeline stages, evaluation, calibration, the demo, the Serve app) and the exit
settings are `StrictModel`s: unknown keys are errors that name the key, so a typo in a YAML file
fails at load time instead of being silently ignored. `load_config` is the only YAML reader: file
(or dict) -> command-line overrides -> validation -> `resolve_paths()`, every failure one
`ConfigError`.

Paths follow one rule (`resolve_path`, `resolve_model`): relative local paths are made absolute
against `$SPECEXIT_ROOT`, else the working directory, in the process that reads the config
(Ray workers and Serve replicas run elsewhere); `toy:teacher` / `toy:draft` name the shipped toy
models, `teacher:NAME` a built-in teacher (`teacher:qwen3-like`: its full checkpoint, materialised on
first use on each node); URIs (`s3://...`) and hub ids (`org/name`) pass through unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

# Relative paths in configs and overrides resolve against this directory when it is set. Under
# `ray job submit --working-dir .` the job runs in an unpacked copy of the working dir, so a
# relative `runs/toy/traces` would land in that copy; set SPECEXIT_ROOT to the real checkout
# (or to shared storage) to keep outputs where the next job finds them.
ROOT_ENV = "SPECEXIT_ROOT"
TOY_PREFIX = "toy:"
TEACHER_PREFIX = "teacher:"


class StrictModel(BaseModel):
    """Base of every typed config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def resolve_paths(self):
        """Called by `load_config` after validation; configs that name files or models override it
        to apply `resolve_path` / `resolve_model` to them. Returns the config."""
        return self


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and every bad key."""


M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (anything else is a ConfigError)."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(
    model: type[M],
    path: str | Path | None = None,
    *,
    raw: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    what: str | None = None,
) -> M:
    """Validate a YAML file (or a dict) as `model`; raises ConfigError naming every problem.

    `raw` is the data itself (when `path` is given too, it only names the source in messages).
    `overrides` are applied before validation: a dotted key sets a nested one (`input.path`,
    `eval.limit`); None values are skipped, so unset command-line flags can be passed as they are.
    Then `resolve_paths()` makes the config's paths absolute (see the module docstring)."""
    data = copy.deepcopy(dict(raw)) if raw is not None else read_yaml(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    name = what or model.__name__
    try:
        cfg = model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid {name} config{f' {path}' if path else ''}:\n{e}") from None
    resolve = getattr(cfg, "resolve_paths", None)
    try:
        return resolve() if resolve is not None else cfg
    except ValidationError as e:  # a resolved path failed a field's check
        raise ConfigError(f"invalid {name} config{f' {path}' if path else ''}:\n{e}") from None


def _set_dotted(data: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for p in parents:
        child = data.get(p)
        data[p] = dict(child) if isinstance(child, Mapping) else {}
        data = data[p]
    data[leaf] = value


# -- the path rule ---------------------------------------------------------------------------------
def base_dir() -> Path:
    """What relative paths are relative to: $SPECEXIT_ROOT, else the working directory."""
    return Path(os.environ.get(ROOT_ENV) or os.getcwd())


def resolve_path(p: str | None) -> str | None:
    """A local path (input, output, checkpoint folder) made absolute against `base_dir()`; URIs
    pass through."""
    if p is None or "://" in p:
        return p
    path = Path(p).expanduser()
    return str(path if path.is_absolute() else (base_dir() / path).resolve())


def resolve_model(m: str | None) -> str | None:
    """A model (or draft) reference: `toy:teacher` / `toy:draft` become the shipped folders,
    `teacher:NAME` the materialised folder of a built-in teacher (`teacher_model`); a folder that exists (relative to `base_dir()`, else to the cwd, e.g. a job's copy of the working
    dir, which holds the shipped toy teacher) becomes absolute, as does anything spelled as a path
    (`./x`, `/x`, `~/x`); anything else is a hub id (`Qwen/Qwen3-4B-Thinking-2507`) or a URI and
    passes through for vLLM / transformers to fetch."""
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
