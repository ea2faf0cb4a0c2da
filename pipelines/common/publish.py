"""Publishing a trained model folder: the folder at `output` may be serving reads (a vLLM engine or
the long-generation engine starting up, a copy in progress), so it is never deleted in place. The
new folder is written to a hidden sibling and swapped in (`replace_dir`): a reader sees the whole old
folder or the whole new one. Used by the training stages' exports (train_draft, train_heads)."""

from __future__ import annotations

import ctypes
import os
import shutil
import uuid
from pathlib import Path

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the
    system or the file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    return renameat2(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0


def replace_dir(staged: str | Path, dst: str | Path) -> Path:
    """Put the finished folder `staged` (a sibling of `dst`, same file system) at `dst`, never
    deleting `dst` while it is the live path. A fresh `dst` is one rename; an existing one is
    swapped atomically where the system can (renameat2), else renamed aside a moment before the new
    one is renamed in. The old folder is deleted afterwards."""
    staged, dst = Path(staged), Path(dst)
    if not dst.exists():
        os.rename(staged, dst)
        return dst
    if _exchange(staged, dst):
        shutil.rmtree(staged)  # now the old folder
        return dst
    old = dst.with_name(f".{dst.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(dst, old)
    os.rename(staged, dst)
    shutil.rmtree(old)
    return dst


def staging_dir(out: str | Path) -> Path:
    """A fresh hidden sibling of `out` to build the new folder in (leftovers of an export that died
    midway are deleted first)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*out.parent.glob(f".{out.name}.tmp-*"), *out.parent.glob(f".{out.name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    return out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
