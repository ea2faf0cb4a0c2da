"""Connecting to Ray and placing vLLM engines on CPU or GPU.

`init_ray`: under `ray job submit` RAY_ADDRESS is set and `ray.init()` joins that cluster; run as
a plain script it starts a private local cluster with enough *logical* CPUs (ray.data.llm runs one
actor per stage and waits forever when they do not fit, whatever the physical core count).
"""

from __future__ import annotations

import logging
import os

from pipelines.common.config import EngineConfig, RayConfig
from specexit_core.vllm_env import THREADS_BIND_ENV, all_cores_bind, cpu_engine_env, in_process_engine_env

log = logging.getLogger("specexit.pipelines")


def init_ray(cfg: RayConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        log.info("connected to Ray cluster at %s", address)
    else:
        # address="local": never attach to some other cluster that happens to run on this machine. Keep
        # the dashboard: Ray Train's placement-group cleaner polls the state API it serves.
        ray.init(address="local", num_cpus=max(cfg.num_cpus, os.cpu_count() or 1))
        log.info("started a local Ray cluster with %d logical CPUs", max(cfg.num_cpus, os.cpu_count() or 1))


def use_gpu(accelerator: str) -> bool:
    import ray

    if accelerator == "auto":
        return ray.cluster_resources().get("GPU", 0) > 0
    return accelerator == "gpu"


def engines_that_fit(requested: int, cluster_cpus: float) -> int:
    """CPU engine actors a stage can start on a cluster of `cluster_cpus` logical CPUs: `requested`, at
    most one fewer than the CPUs, at least one. Each CPU engine actor holds one CPU for its lifetime, and
    Ray Data starts a fixed-size actor pool before the tasks that feed it (listing and reading the input
    take a CPU each): with every CPU held by an engine the read never runs and the job waits forever, its
    actors idle. A job resubmitted after a node was lost meets exactly that, on the capacity left (the
    node-loss drill's labels job on one 2-CPU node: two engines, no progress in five minutes)."""
    return max(1, min(requested, int(cluster_cpus) - 1))


def engine_actors(requested: int, gpu: bool, stage: str) -> int:
    """`engines_that_fit` on this cluster (GPU engines hold GPUs, not the CPUs the input tasks need)."""
    if gpu:
        return requested
    import ray

    cpus = ray.cluster_resources().get("CPU", 0)
    n = engines_that_fit(requested, cpus)
    if n < requested:
        log.warning(
            "%s: %d engine actors asked for, %d started: the cluster has %g CPUs, and the tasks that read the "
            "input need one beside the engines (each holds one)",
            stage,
            requested,
            n,
            cpus,
        )
    return n


def engine_env(engine: EngineConfig, gpu: bool) -> dict[str, str]:
    """Environment of the engine actors (they are separate processes, so os.environ of the driver
    does not reach them); on CPU, what `specexit_core.vllm_env.cpu_engine_env` says a CPU engine needs."""
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if os.path.isdir(engine.model):
        env["HF_HUB_OFFLINE"] = "1"
    if not gpu:  # the driver's own binding, if the user set one, else every core
        env.update(cpu_engine_env(engine.cpu_kv_cache_gib, os.environ.get(THREADS_BIND_ENV) or all_cores_bind()))
    # said either way: a worker inherits its raylet's environment, which may say the other
    env.update(in_process_engine_env(engine.engine_core_in_process(gpu)))
    for k in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_PLUGINS", "HF_HOME", "HF_TOKEN"):
        if k in os.environ:  # pass through what the user set for the engines
            env[k] = os.environ[k]
    return env


def engine_placement(engine: EngineConfig, gpu: bool) -> dict:
    """ray.data.llm placement: on CPU one CPU bundle per engine (its default asks for a GPU)."""
    if gpu:
        return {}
    if engine.tensor_parallel_size != 1:
        raise ValueError("tensor_parallel_size > 1 needs GPUs (set engine.accelerator: gpu)")
    return {"placement_group_config": {"bundles": [{"CPU": 1}]}}


def stable_seed(base: int, row_id: str) -> int:
    """Per-row sampling seed that does not depend on batch composition or scheduling."""
    import zlib

    return (base + zlib.crc32(row_id.encode())) % (2**31 - 1)


def stop_ray_quietly() -> None:
    """Stop Ray (and so the stream of actor logs to this stdout) before printing results."""
    import sys

    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:
        pass
    sys.stdout.flush()
