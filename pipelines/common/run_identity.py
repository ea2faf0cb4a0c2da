"""What a stage's output was made from, and the refusal to resume into something else.

A resumed job appends to the rows already written, so they must come from the same run: the same
content-affecting config, the same model weights (and draft), the same input rows. Each stage
writes `_run.json` (its *identity*; `meta_files.RUN_FILE`, `run.json` in folders written before issue 45)
into its output folder and, on a rerun over existing output,
compares:

- `config`: the stage config minus the keys that only change how the job runs (paths, `limit`,
  chunk and batch sizes, engine counts, Ray); dotted names in the message (`config.sampling.temperature`).
- `models`: a fingerprint of each model folder (file names, sizes, small files whole, the head and
  tail of weight files), so retrained weights at the same path count as a change; a hub id is its name.
- `input`: stage-specific; for the row stages every id already written is checked against the row
  the input now has under that id (`changed_rows`), so positional ids (`row-<index>`) that shifted
  because lines were inserted are refused instead of silently mislabeling rows.

A mismatch raises `RunIdentityMismatch` naming every field that changed (old -> new); the command
line prints it and exits 2. An output written before the identity file existed is adopted (its identity
written now). Every stage uses it: traces, labels, train_draft and evaluate.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from pipelines.common.meta_files import RUN_FILE, meta_path, write_meta

log = logging.getLogger("specexit.pipelines")
_WHOLE = 1 << 20  # files up to 1 MiB are hashed whole, bigger ones by their head and tail
_EDGE = 1 << 20


class RunIdentityMismatch(ValueError):
    """Resuming into output that another run (config, model, input) wrote."""


def model_fingerprint(path: str | None) -> str | None:
    """A short content fingerprint of a model folder (None for none; a hub id is its own name)."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_dir():
        return f"hub:{path}"
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file() and not x.name.startswith(".")):
        size = f.stat().st_size
        h.update(f"{f.relative_to(p)}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if size <= _WHOLE:
                h.update(fh.read())
            else:
                h.update(fh.read(_EDGE))
                fh.seek(size - _EDGE)
                h.update(fh.read(_EDGE))
    return h.hexdigest()[:16]


def config_identity(cfg, ignore: set[str]) -> dict:
    """The config as JSON without the dotted keys in `ignore` (those that do not change the rows), nor the
    keys a stage added after its outputs were first written while they hold the default they were added
    with (`cfg.ADDED_KEYS`, key -> default): a folder written before such a key existed made its rows as
    that default does, so it still resumes; a resume with another value is refused, naming the key."""
    d = cfg.model_dump(mode="json")
    added = getattr(cfg, "ADDED_KEYS", {})
    ignore = set(ignore) | {k for k, default in added.items() if k in d and d[k] == default}
    for key in ignore:
        *parents, last = key.split(".")
        node = d
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return d


def _flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every leaf that differs (dotted keys)."""
    a, b = _flat(old), _flat(new)
    return [
        f"{k}: {json.dumps(a.get(k, '<unset>'))} -> {json.dumps(b.get(k, '<unset>'))}"
        for k in sorted(set(a) | set(b))
        if a.get(k, "<unset>") != b.get(k, "<unset>")
    ]


def read_identity(folder: str | Path) -> dict | None:
    p = meta_path(folder, RUN_FILE)
    return json.loads(p.read_text()) if p.exists() else None


def check_identity(folder: str | Path, identity: dict, *, resuming: bool, what: str) -> None:
    """Raise RunIdentityMismatch if `folder` holds output of a run with another identity."""
    old = read_identity(folder)
    if not resuming or old is None:
        if resuming:
            log.warning("%s: %s has output but no %s (older version); adopting it", what, folder, RUN_FILE)
        return
    diff = differences(old, json.loads(json.dumps(identity)))
    if diff:
        raise RunIdentityMismatch(
            f"{what}: {folder} holds output of another run, refusing to resume into it. Changed: "
            + "; ".join(diff)
            + ". Use a new output folder (or delete this one) to start over."
        )


def write_identity(folder: str | Path, identity: dict) -> None:
    write_meta(folder, RUN_FILE, json.dumps(identity, indent=2, sort_keys=True) + "\n")


def changed_rows(written: dict[str, object], current: dict[str, object]) -> list[str]:
    """Ids already written whose input row is now different (ids the input no longer has are fine:
    a smaller `limit`)."""
    return sorted(i for i, v in written.items() if i in current and current[i] != v)


def refuse_changed_rows(what: str, folder: str | Path, ids: list[str], hint: str) -> None:
    if ids:
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        raise RunIdentityMismatch(
            f"{what}: the input changed under {len(ids)} id(s) already written to {folder} ({shown}); "
            f"refusing to resume into it. {hint}"
        )
