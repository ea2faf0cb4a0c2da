"""Prefix-block keys: the name under which one block of KV is stored in every tier.

A block's key is a chained hash: sha256(parent key, the block's token ids), and the first block's
parent is the namespace (the model's identity, the KV layout, the request's cache salt). So the
key of block i depends on every token before it and on the model, like vLLM's own prefix-cache
hashes; but unlike those (seeded per process unless PYTHONHASHSEED is set) it is the same in every
process, replica and restart, which is what a shared directory tier needs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

KEY_HEX_LEN = 64  # sha256 hex digest


def namespace(identity: dict) -> str:
    """The root of every chain: a hash of the model identity and KV layout fields (any JSON dict;
    keys sorted, so field order does not matter)."""
    blob = json.dumps(identity, sort_keys=True, default=str).encode()
    return hashlib.sha256(b"specexit-kv-ns\0" + blob).hexdigest()


def chain_root(ns: str, salt: str | None = None) -> str:
    """The parent of a sequence's first block: the namespace, or the namespace and the cache salt."""
    return ns if salt is None else hashlib.sha256(f"{ns}\0salt\0{salt}".encode()).hexdigest()


def next_block_key(parent: str, block_token_ids: Sequence[int]) -> str:
    """The key of one full block after the block keyed `parent` (or `chain_root` for the first)."""
    h = hashlib.sha256(parent.encode())
    # fixed-width little-endian ids: no two token sequences serialize the same
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in block_token_ids))
    return h.hexdigest()


def extend_block_keys(
    keys: list[str], ns: str, token_ids: Sequence[int], block_size: int, salt: str | None = None
) -> list[str]:
    """Append to `keys` (the keys of `token_ids`' first len(keys) blocks) the keys of its further full blocks."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    parent = keys[-1] if keys else chain_root(ns, salt)
    for start in range(len(keys) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = next_block_key(parent, token_ids[start : start + block_size])
        keys.append(parent)
    return keys


def prefix_block_keys(ns: str, token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[str]:
    """Keys of the full blocks of `token_ids` (a trailing partial block has none)."""
    return extend_block_keys([], ns, token_ids, block_size, salt)


def model_fingerprint(model: str) -> str:
    """A path-independent identity of a model: a local folder is named by its config.json and its
    weight files' names and sizes (so replicas that mount the same checkpoint at different paths
    share blocks); anything else (a hub id) is its own name."""
    path = Path(model)
    if not path.is_dir():
        return model
    h = hashlib.sha256()
    cfg = path / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for f in sorted(path.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".pt"):
            h.update(f"{f.name}:{f.stat().st_size}\n".encode())
    return "dir:" + h.hexdigest()
