"""The on-disk format of one KV block: a fixed header (magic, version, dtype, shape, payload length,
payload checksum) and the raw tensor bytes.

Reading checks everything the header promises: a truncated, corrupt or foreign file raises
`CorruptBlock`, which callers turn into a cache miss (the block is recomputed), never into KV.
"""

from __future__ import annotations

import hashlib
import struct

import torch

MAGIC = b"SXKVBLK1"
# magic, header version, dtype name length, ndim, payload bytes, blake2b-128 of the payload
_FIXED = struct.Struct("<8sHHHQ16s")
_DIGEST = 16


class CorruptBlock(ValueError):
    """A block file that cannot be trusted (truncated, checksum mismatch, wrong format)."""


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=_DIGEST).digest()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode(block: torch.Tensor) -> bytes:
    """Header + payload of a host (CPU) tensor."""
    t = block.detach().contiguous()
    if t.device.type != "cpu":
        raise ValueError("encode() takes host tensors; copy device blocks to the host first")
    # view as bytes: works for every dtype (bfloat16 and fp8 have no numpy equivalent)
    payload = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    name = _dtype_name(t.dtype).encode()
    head = _FIXED.pack(MAGIC, 1, len(name), t.dim(), len(payload), _digest(payload))
    dims = struct.pack(f"<{t.dim()}Q", *t.shape)
    return head + name + dims + payload


def decode(data: bytes) -> torch.Tensor:
    """The tensor in `data`, or CorruptBlock."""
    if len(data) < _FIXED.size:
        raise CorruptBlock("truncated header")
    magic, version, name_len, ndim, nbytes, digest = _FIXED.unpack_from(data, 0)
    if magic != MAGIC or version != 1:
        raise CorruptBlock("not a block file")
    off = _FIXED.size
    dims_end = off + name_len + 8 * ndim
    if len(data) != dims_end + nbytes:
        raise CorruptBlock(f"length {len(data)} != header's {dims_end + nbytes}")
    payload = memoryview(data)[dims_end:]
    if _digest(payload) != digest:
        raise CorruptBlock("checksum mismatch")
    try:
        dtype = getattr(torch, data[off : off + name_len].decode())
        shape = struct.unpack_from(f"<{ndim}Q", data, off + name_len)
    except (AttributeError, UnicodeDecodeError, struct.error) as e:
        raise CorruptBlock(f"bad header: {e}") from e
    if not isinstance(dtype, torch.dtype):
        raise CorruptBlock("bad dtype")
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    try:
        return flat.view(dtype).reshape(shape)
    except RuntimeError as e:
        raise CorruptBlock(f"payload does not fit {dtype} {tuple(shape)}: {e}") from e
