"""Copies between vLLM's paged KV tensors and host blocks, device-agnostic (CPU build and CUDA alike).

vLLM 0.32 hands connectors per-layer KV tensors with blocks at dim 0 (its standardized layout); a
block of the store is every layer's slice of one manager block stacked into one host tensor
[layers, kernel blocks per manager block, ...], whatever the backend's layout inside the block.
"""

from __future__ import annotations

import torch


class BlockLayout:
    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int):
        if not kv_caches:
            raise ValueError("no KV cache tensors")
        self.names = sorted(kv_caches)
        self.caches = [kv_caches[n] for n in self.names]
        first = self.caches[0]
        for n, c in zip(self.names, self.caches):
            if c.shape != first.shape or c.dtype != first.dtype:
                raise ValueError(
                    f"layer {n}: {tuple(c.shape)} {c.dtype} differs from {tuple(first.shape)} {first.dtype}"
                )
        if num_blocks <= 0 or first.shape[0] % num_blocks:
            raise ValueError(f"KV tensors have {first.shape[0]} blocks at dim 0, not a multiple of {num_blocks}")
        self.ratio = first.shape[0] // num_blocks  # kernel blocks per manager block
        self.block_shape = (len(self.caches), self.ratio, *first.shape[1:])
        self.dtype = first.dtype
        self.device = first.device

    def _rows(self, block_id: int) -> slice:
        return slice(block_id * self.ratio, (block_id + 1) * self.ratio)

    def gather(self, block_id: int) -> torch.Tensor:
        """A host copy of one block (a new tensor: the paged block may be reused at once)."""
        rows = self._rows(block_id)
        stacked = torch.stack([c[rows] for c in self.caches])  # a copy, on the KV device
        return stacked if stacked.device.type == "cpu" else stacked.to("cpu")

    def fits(self, block: torch.Tensor) -> bool:
        return tuple(block.shape) == self.block_shape and block.dtype == self.dtype

    def scatter(self, block_id: int, block: torch.Tensor) -> None:
        if not self.fits(block):
            raise ValueError(f"block {tuple(block.shape)} {block.dtype} does not fit {self.block_shape} {self.dtype}")
        src = block.to(self.device, non_blocking=True)
        rows = self._rows(block_id)
        for i, c in enumerate(self.caches):
            c[rows].copy_(src[i])
