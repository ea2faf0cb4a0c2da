"""The directory tier: one file per block (and per model shard) under a root that may be a local disk
or a shared filesystem, so every replica and every restart sees the same blocks.

Writes go to a unique temporary file in the block's own folder and are published with `os.replace`,
which is atomic on POSIX filesystems: a reader (in any process) sees either no file or a whole one,
never half of one, whatever number of replicas write the same block at once. Reads verify the header
checksum (`block_file`); a bad file is removed and reported as a miss.
"""

from __future__ import annotations

import errno
import os
import threading
import uuid
from pathlib import Path

import torch

from specexit_core.kv_cache import block_file

SUFFIX = ".kvb"
# errors that mean "no room": caching to this directory stops, serving goes on
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DirectoryTier:
    def __init__(self, root: str | Path, shard: str = "0", fsync: bool = False):
        self.root = Path(root)
        self.shard = shard
        self.fsync = fsync
        self.corrupt_files = 0  # files found bad (and removed) by read()
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str, shard: str | None = None) -> Path:
        # two-character fan-out keeps folders small on shared filesystems
        return self.root / key[:2] / f"{key}-{self.shard if shard is None else shard}{SUFFIX}"

    def contains(self, key: str, shards: tuple[str, ...] | None = None) -> bool:
        """Whether the block's file exists (for every shard in `shards`, default this one)."""
        return all(self.path(key, s).is_file() for s in (shards or (self.shard,)))

    def read(self, key: str) -> torch.Tensor | None:
        """The block, or None when it is missing, truncated or corrupt (a bad file is removed)."""
        p = self.path(key)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return None
        try:
            return block_file.decode(data)
        except block_file.CorruptBlock:
            self.corrupt_files += 1
            try:
                p.unlink()
            except OSError:
                pass
            return None

    def write(self, key: str, block: torch.Tensor) -> bool:
        """Publish a block atomically; False when it already exists. OSError (ENOSPC among them)
        propagates, after the temporary file is removed."""
        if self.path(key).is_file():
            return False
        return self.write_bytes(key, block_file.encode(block))

    def write_bytes(self, key: str, data: bytes, skip_existing: bool = True) -> bool:
        p = self.path(key)
        if skip_existing and p.is_file():
            return False
        p.parent.mkdir(parents=True, exist_ok=True)
        # unique per process and thread: concurrent writers never share a temporary file
        tmp = p.parent / f".{p.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise
        return True
