"""The engine replica: Ray Serve LLM's `LLMServer` with the SpecExit engine injected.

The SpecExit vLLM plugin itself needs no loading here: it is a `vllm.general_plugins` entry point,
so vLLM registers it in this process and in every engine/worker process it spawns. What the
replica adds is its environment (CPU defaults, a private exit-event folder) set before the
engine starts, because the engine processes inherit it.
"""

from __future__ import annotations

import os
import tempfile

from ray.serve.llm.deployment import LLMServer

from serve_app.engine import SpecExitVLLMEngine
from serve_app.replica import replica_tag
from specexit_core.vllm_env import apply_cpu_defaults, is_cpu_build
from specexit_core.vllm_plugin.telemetry import TELEMETRY_DIR_ENV


class SpecExitLLMServer(LLMServer):
    _default_engine_cls = SpecExitVLLMEngine

    async def __init__(self, llm_config, **kwargs):
        if is_cpu_build():
            apply_cpu_defaults()  # setdefault only: the config's env vars win
        # One exit-event folder per replica: each replica joins only its own engine's events.
        base = os.environ.get(TELEMETRY_DIR_ENV) or os.path.join(tempfile.gettempdir(), "specexit-telemetry")
        os.environ[TELEMETRY_DIR_ENV] = os.path.join(base, replica_tag())
        await super().__init__(llm_config, **kwargs)

    async def specexit_stats(self) -> dict:
        """Engine aborts and whether SpecExit is active (tests, debugging)."""
        return self.engine.specexit_stats() if self.engine is not None else {}

    async def specexit_engine_pids(self) -> dict:
        """This replica's pid and its engine processes (the fault-injection tests kill them)."""
        import psutil

        me = psutil.Process()
        named = []
        for p in me.children(recursive=True):
            try:
                named.append((p.pid, " ".join(p.cmdline()) or p.name()))
            except psutil.Error:
                pass
        return {"replica": me.pid, "named": named}
