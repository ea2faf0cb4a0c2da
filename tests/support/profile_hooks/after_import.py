"""Run a function on a module right after it first executes, before anyone imports names from it.

Used by the unit tests' guard (tests/unit/conftest.py: a unit test may not start Ray or vLLM) and by the
suite profiler's hooks (sitecustomize.py here: every process records what it starts). No imports of the
project: sitecustomize loads this in every process a profiled run starts."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
from collections.abc import Callable, Collection
from types import ModuleType


class AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder for the modules in `names`: each loads with its own loader, then `on_loaded(module)`
    runs. Insert it first in `sys.meta_path`; remove it to stop."""

    def __init__(self, names: Collection[str], on_loaded: Callable[[ModuleType], None]):
        self.names = names
        self.on_loaded = on_loaded
        self.loaders: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        self.loaders[name] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        loader = self.loaders.pop(module.__name__)
        module.__spec__.loader = module.__loader__ = loader  # the module keeps its own loader
        loader.exec_module(module)
        self.on_loaded(module)
