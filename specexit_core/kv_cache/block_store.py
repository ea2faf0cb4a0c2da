"""The tiered block store: host memory first, then the directory; saving never blocks the caller.

`put` keeps the block in the host tier at once and hands it to one background writer thread through
a bounded queue; when the queue is full the directory copy is dropped (counted), never waited for.
When the directory runs out of space the writer stops writing to it for the life of the store
(caching to disk stops, serving goes on). `get` reads the host tier, then the directory (promoting
what it reads to the host tier); any failure there is a miss, so the caller recomputes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass

import torch

from specexit_core.kv_cache.directory_tier import NO_SPACE_ERRNOS, DirectoryTier
from specexit_core.kv_cache.host_tier import HostTier

log = logging.getLogger(__name__)

HOST, DIRECTORY = "host", "directory"


@dataclass
class StoreStats:
    host_hits: int = 0  # blocks served from host memory
    directory_hits: int = 0  # blocks served from the directory tier
    misses: int = 0  # blocks asked for and not found (or found bad): recomputed
    corrupt_files: int = 0  # directory files that failed their checksum / length check
    saved: int = 0  # blocks put into the host tier
    written: int = 0  # block files published in the directory
    dropped_writes: int = 0  # directory copies dropped because the writer queue was full
    write_errors: int = 0  # failed directory writes other than "no space"
    disk_full: bool = False  # the directory ran out of space: no more writes to it
    host_evictions: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class TieredBlockStore:
    def __init__(self, host: HostTier, directory: DirectoryTier | None, queue_blocks: int = 256):
        self.host = host
        self.directory = directory
        self.stats = StoreStats()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_blocks))
        self._pending = 0  # queued or being written
        self._cv = threading.Condition()
        self._writer: threading.Thread | None = None
        if directory is not None:
            self._writer = threading.Thread(target=self._write_loop, name="kv-block-writer", daemon=True)
            self._writer.start()

    # -- reads ------------------------------------------------------------------------------------------
    def get(self, key: str) -> tuple[torch.Tensor, str] | None:
        block = self.host.get(key)
        if block is not None:
            self.stats.host_hits += 1
            return block, HOST
        if self.directory is not None:
            before = self.directory.corrupt_files
            block = self.directory.read(key)
            self.stats.corrupt_files += self.directory.corrupt_files - before
            if block is not None:
                self.stats.directory_hits += 1
                self.stats.host_evictions += len(self.host.put(key, block))
                return block, DIRECTORY
        self.stats.misses += 1
        return None

    def on_directory(self, key: str, shards: tuple[str, ...] | None = None) -> bool:
        return self.directory is not None and self.directory.contains(key, shards)

    # -- writes -----------------------------------------------------------------------------------------
    def put(self, key: str, block: torch.Tensor) -> list[str]:
        """Keep a host copy of `block` (the caller's tensor must not be reused) and queue its directory
        copy. Returns the keys the host tier evicted."""
        evicted = self.host.put(key, block)
        self.stats.saved += 1
        self.stats.host_evictions += len(evicted)
        if self._writer is not None and not self.stats.disk_full:
            with self._cv:
                try:
                    self._queue.put_nowait((key, block))
                    self._pending += 1
                except queue.Full:
                    self.stats.dropped_writes += 1
        return evicted

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued directory write has finished; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        if self._writer is None:
            return
        self.flush(timeout)
        self._queue.put(None)
        self._writer.join(timeout)
        self._writer = None

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, block = item
            try:
                if not self.stats.disk_full and self.directory.write(key, block):
                    self.stats.written += 1
            except OSError as e:
                if e.errno in NO_SPACE_ERRNOS:
                    if not self.stats.disk_full:
                        log.warning("KV directory %s is full: caching to it stops", self.directory.root)
                    self.stats.disk_full = True
                else:
                    self.stats.write_errors += 1
                    log.warning("KV block write failed: %s", e)
            except Exception as e:  # never let the writer thread die on a bad block
                self.stats.write_errors += 1
                log.warning("KV block write failed: %s", e)
            finally:
                with self._cv:
                    self._pending -= 1
                    self._cv.notify_all()
