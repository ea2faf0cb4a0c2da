"""numba's on-disk cache, kept honest: numba keys a file's cached machine code on that file alone,
but a compiled function inlines the compiled functions it calls from other files. A module of
compiled loops calls `drop_stale_cache(__file__, deps)` before defining them: when a file in `deps`
has changed since the last run, this module's cache entries go (rebuilt at first use, seconds), so
an edit there never runs from a stale cache (tests/unit/test_compiled_imports.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def drop_stale_cache(module_file: str, deps: list[str], cache: Path | None = None) -> None:
    """`cache`: the module's numba cache folder (default: its `__pycache__`)."""
    stem = Path(module_file).stem
    cache = cache or Path(module_file).parent / "__pycache__"
    stamp = cache / f"{stem}.deps"
    digest = hashlib.sha1(b"".join(Path(f).read_bytes() for f in deps)).hexdigest()
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        for f in cache.glob(f"{stem}.*.nb[ic]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: numba caches elsewhere, and nothing here changes
        pass
