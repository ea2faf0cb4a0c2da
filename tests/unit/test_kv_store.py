"""KV cache: the directory tier and the tiered store under bad conditions (corrupt, truncated and missing
files, a full disk, a full writer queue, several processes writing the same blocks, a writer killed mid-write)."""

import errno
import multiprocessing as mp
import threading

import torch

from specexit_core.kv_cache import block_file
from specexit_core.kv_cache.block_store import DIRECTORY, HOST, TieredBlockStore
from specexit_core.kv_cache.directory_tier import SUFFIX, DirectoryTier
from specexit_core.kv_cache.host_tier import HostTier

KEY = "ab" + "0" * 62


def block(seed=0):
    return torch.randn(4, 1, 2, 32, 128, generator=torch.Generator().manual_seed(seed))


def test_directory_tier_round_trip_and_shards(tmp_path):
    d = DirectoryTier(tmp_path, shard="tp0-pp0")
    assert d.read(KEY) is None and not d.contains(KEY)
    assert d.write(KEY, block()) is True
    assert d.write(KEY, block(1)) is False  # published once; the first writer wins
    assert torch.equal(d.read(KEY), block())
    assert d.contains(KEY) and not d.contains(KEY, ("tp0-pp0", "tp1-pp0"))
    DirectoryTier(tmp_path, shard="tp1-pp0").write(KEY, block())
    assert d.contains(KEY, ("tp0-pp0", "tp1-pp0"))
    assert not list(tmp_path.rglob("*.tmp"))


def test_corrupt_truncated_and_missing_files_are_misses_and_bad_files_go(tmp_path):
    d = DirectoryTier(tmp_path)
    for i, damage in enumerate(["flip", "truncate", "empty", "missing"]):
        key = f"{i:02d}" + "f" * 62
        d.write(key, block(i))
        p = d.path(key)
        data = bytearray(p.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x01
            p.write_bytes(bytes(data))
        elif damage == "truncate":
            p.write_bytes(bytes(data[: len(data) // 3]))
        elif damage == "empty":
            p.write_bytes(b"")
        else:
            p.unlink()
        assert d.read(key) is None
        assert not p.exists()  # a bad file is removed: the next lookup misses instead of failing again
    assert d.corrupt_files == 3


def test_store_serves_host_then_directory_and_promotes(tmp_path):
    store = TieredBlockStore(HostTier(10 << 20), DirectoryTier(tmp_path))
    store.put(KEY, block())
    assert store.flush(10)
    got, tier = store.get(KEY)
    assert tier == HOST and torch.equal(got, block())
    fresh = TieredBlockStore(HostTier(10 << 20), DirectoryTier(tmp_path))  # a restart: empty host tier
    got, tier = fresh.get(KEY)
    assert tier == DIRECTORY and torch.equal(got, block())
    assert fresh.get(KEY)[1] == HOST  # promoted
    assert fresh.get("cd" + "0" * 62) is None
    assert (fresh.stats.directory_hits, fresh.stats.host_hits, fresh.stats.misses) == (1, 1, 1)
    store.close()
    fresh.close()


def test_full_disk_stops_caching_and_serving_goes_on(tmp_path, monkeypatch):
    d = DirectoryTier(tmp_path)

    def no_space(self, key, data, skip_existing=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DirectoryTier, "write_bytes", no_space)
    store = TieredBlockStore(HostTier(100 << 20), d)
    for i in range(5):
        store.put(f"{i:02d}" + "e" * 62, block(i))  # never raises
    assert store.flush(10)
    assert store.stats.disk_full and store.stats.written == 0
    assert not list(tmp_path.rglob("*.kvb")) and not list(tmp_path.rglob("*.tmp"))
    # the host tier still serves, and later puts skip the directory altogether
    assert store.get("00" + "e" * 62)[1] == HOST
    store.put("ff" + "e" * 62, block())
    assert store.flush(1) and store.stats.saved == 6
    store.close()


def test_a_full_writer_queue_drops_instead_of_blocking(tmp_path, monkeypatch):
    gate = threading.Event()
    real = DirectoryTier.write_bytes

    def slow(self, key, data, skip_existing=True):
        gate.wait(10)
        return real(self, key, data, skip_existing)

    monkeypatch.setattr(DirectoryTier, "write_bytes", slow)
    store = TieredBlockStore(HostTier(100 << 20), DirectoryTier(tmp_path), queue_blocks=2)
    for i in range(6):
        store.put(f"{i:02d}" + "d" * 62, block(i))  # returns at once although the writer is stuck
    assert store.stats.dropped_writes >= 3
    gate.set()
    assert store.flush(10)
    assert store.stats.written + store.stats.dropped_writes == 6
    store.close()


def _writer(root, keys, payloads, rounds):
    d = DirectoryTier(root)
    for _ in range(rounds):
        for key, data in zip(keys, payloads):
            d.write_bytes(key, data, skip_existing=False)  # every process rewrites every block


def test_concurrent_writers_in_several_processes_never_expose_half_a_block(tmp_path):
    keys = [f"{i:02d}" + "c" * 62 for i in range(6)]
    blocks = [block(i) for i in range(6)]
    payloads = [block_file.encode(b) for b in blocks]  # ~128 KiB each
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), keys, payloads, 15)) for _ in range(3)]
    for p in procs:
        p.start()
    reader = DirectoryTier(tmp_path)
    seen = 0
    while any(p.is_alive() for p in procs):
        for key, b in zip(keys, blocks):
            got = reader.read(key)
            if got is not None:
                assert torch.equal(got, b)
                seen += 1
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert reader.corrupt_files == 0 and seen > 0
    assert all(torch.equal(reader.read(k), b) for k, b in zip(keys, blocks))
    assert not list(tmp_path.rglob("*.tmp"))


def _dies_mid_write(root, published, payloads, victim, half, marker):
    """Publishes `published`, then starts writing `victim` through DirectoryTier.write_bytes and stops
    with half of its bytes on disk (flushed), until the test kills the process there."""
    import time
    from pathlib import Path

    from specexit_core.kv_cache import directory_tier

    d = DirectoryTier(root)
    for key, data in zip(published, payloads):
        d.write_bytes(key, data)

    class Stalls:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def write(self, data):
            self.f.write(data[:half])
            self.f.flush()
            Path(marker).touch()  # half the block is on disk, the rest never comes
            time.sleep(120)

        def __getattr__(self, name):
            return getattr(self.f, name)

    # the module's own `open` (it opens the temp file), in this process only; Stalls closes what it opens
    directory_tier.open = lambda path, mode: Stalls(open(path, mode))  # noqa: SIM115
    d.write_bytes(victim, payloads[0], skip_existing=False)


def test_a_writer_killed_mid_write_leaves_no_block_that_reads_wrong(tmp_path):
    """A replica that dies while it writes a block (SIGKILL, as when its node is lost): the write is
    provably under way (half its bytes on disk) when the process dies. Every block reads back whole, the
    half-written one is a miss (a temp file no reader looks at), and the next writer publishes it."""
    import os
    import signal

    keys = [f"{i:02d}" + "d" * 62 for i in range(4)]
    blocks = [block(i) for i in range(4)]
    payloads = [block_file.encode(b) for b in blocks]
    victim, half, marker = "ff" + "d" * 62, len(payloads[0]) // 2, tmp_path / "stalled"
    root = tmp_path / "tier"
    p = mp.get_context("fork").Process(target=_dies_mid_write, args=(str(root), keys, payloads, victim, half, marker))
    p.start()
    try:
        for _ in range(600):
            if marker.exists() or not p.is_alive():
                break
            p.join(0.05)
        assert marker.exists(), f"the writer never reached the middle of its write (exit code {p.exitcode})"
        (tmp,) = root.rglob(".*.tmp")
        assert tmp.stat().st_size == half and p.is_alive()  # in flight: half written, not published
    finally:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(30)
    assert p.exitcode == -signal.SIGKILL

    reader = DirectoryTier(root)
    assert all(torch.equal(reader.read(k), b) for k, b in zip(keys, blocks))  # every published block whole
    assert not reader.contains(victim) and reader.read(victim) is None  # the dead write: a miss, nothing wrong
    assert reader.corrupt_files == 0 and tmp.exists()  # its temp file stays (a dot-name ending .tmp)
    assert sorted(f.name for f in root.rglob(f"*{SUFFIX}")) == sorted(reader.path(k).name for k in keys)
    assert reader.write(victim, blocks[0]) and torch.equal(reader.read(victim), blocks[0])  # the next writer
