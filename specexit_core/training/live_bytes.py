"""Peak bytes of tensors allocated while a block runs, on any device (CPU included).

CPU has no `torch.cuda.max_memory_allocated`, and process RSS mixes in the allocator's caching and
Python. This counts tensor storages instead: a dispatch mode sees every op's outputs (forward,
autograd's backward, optimizer), counts each new storage once, and a weak reference on the storage
takes it off when the last tensor using it dies (PyTorch keeps a storage's Python object alive as
long as the storage, so the callback fires exactly then). Outputs the op's schema marks as
aliasing an input (views, in-place results) share that storage and are not counted. Kernel-internal
workspaces are invisible here.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorBytes(TorchDispatchMode):
    """`with LiveTensorBytes() as m: ...` -> m.peak: the most bytes of storages created inside the
    block alive at once; m.live: those still alive."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._refs:
            return
        n = st.nbytes()

        def gone(_ref, key=key, n=n):
            self._refs.pop(key, None)
            self.live -= n

        self._refs[key] = weakref.ref(st, gone)
        self.live += n
        self.peak = max(self.peak, self.live)
