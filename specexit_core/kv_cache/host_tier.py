"""The host-memory tier: blocks in CPU memory under a bytes budget, least recently used out first."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch


class HostTier:
    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._blocks: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

    def put(self, key: str, block: torch.Tensor) -> list[str]:
        """Insert (or refresh) a block; returns the keys evicted to make room. A block larger than
        the whole budget is not kept."""
        size = block.numel() * block.element_size()
        evicted = []
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self.used_bytes -= old.numel() * old.element_size()
            if size > self.budget_bytes:
                return [key] if old is not None else []
            while self.used_bytes + size > self.budget_bytes and self._blocks:
                k, b = self._blocks.popitem(last=False)
                self.used_bytes -= b.numel() * b.element_size()
                evicted.append(k)
            self._blocks[key] = block
            self.used_bytes += size
        return evicted
