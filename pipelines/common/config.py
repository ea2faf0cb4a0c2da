"""Config pieces every pipeline job shares: the Ray connection, the vLLM engine, sampling, and the
base of the stage configs (output folder, resumable parts, think markers) and of the Ray Train
stages (a frozen target, workers, checkpoints under `<storage_path>/<run_name>`).

The stage configs themselves live next to their stage (`pipelines/<stage>/config.py`); all are
`StrictModel`s loaded through `specexit_core.typed_config.load_config` (unknown keys are errors
that name the key; relative paths follow its one path rule).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from specexit_core.teachers.model_ref import resolve_model
from specexit_core.typed_config import ConfigError, StrictModel, resolve_path

__all__ = ["ConfigError", "EngineConfig", "RayConfig", "SamplingConfig", "StageBase", "TrainRunBase"]


class RayConfig(StrictModel):
    # None: RAY_ADDRESS (set by `ray job submit`) if present, else a fresh local cluster.
    # "auto": connect to a cluster already started with `ray start` on this machine.
    address: str | None = None
    # Logical CPUs of a local cluster. ray.data.llm's build_processor needs >= 8 (one actor per
    # stage plus the engine), whatever the number of physical cores.
    num_cpus: int = Field(8, ge=1)


class EngineConfig(StrictModel):
    """One vLLM engine per actor; `concurrency` actors in parallel (data parallel)."""

    model: str
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"  # auto: gpu if the cluster has GPUs
    tensor_parallel_size: int = Field(1, ge=1)
    concurrency: int = Field(1, ge=1)  # engine actors
    batch_size: int = Field(16, ge=1)  # rows per engine call (traces: prompts, labels: traces)
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float | None = None
    cpu_kv_cache_gib: int = Field(1, ge=1)  # VLLM_CPU_KVCACHE_SPACE on CPU
    # where the engine core runs: "process" = its own processes (vLLM's default), "in_process" = in
    # the actor (starts ~7x faster on CPU, specexit_core.vllm_env.in_process_engine_env), "auto" =
    # in_process on CPU with tensor_parallel_size 1, else process
    engine_core: Literal["auto", "process", "in_process"] = "auto"
    seed: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)  # any other vLLM engine argument

    def resolve_paths(self) -> EngineConfig:
        self.model = resolve_model(self.model)
        return self

    def engine_core_in_process(self, gpu: bool) -> bool:
        if self.engine_core != "auto":
            return self.engine_core == "in_process"
        return not gpu and self.tensor_parallel_size == 1

    def engine_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            dtype=self.dtype,
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=self.enable_prefix_caching,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
        )
        for k in ("max_model_len", "max_num_seqs", "gpu_memory_utilization"):
            if getattr(self, k) is not None:
                kw[k] = getattr(self, k)
        kw.update(self.extra)
        return kw


class SamplingConfig(StrictModel):
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = None
    max_tokens: int = Field(400, ge=1)
    # Per-row seed = seed + stable hash of the row id: a rerun samples the same traces.
    seed: int | None = 0


class StageBase(StrictModel):
    """What the traces and labels jobs share: an output folder of resumable Parquet parts."""

    # Keys that change how the job runs, not the rows it writes: a resume may change them
    # (pipelines/common/run_identity.py). The stages add their own.
    RUN_ONLY_KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "output",
            "limit",
            "chunk_rows",
            "ray",
            "retry_errors",
            "max_error_rate",
            "engine.model",  # fingerprinted by content instead
            "engine.accelerator",
            "engine.concurrency",
            "engine.batch_size",
            "engine.max_num_seqs",
            "engine.gpu_memory_utilization",
            "engine.cpu_kv_cache_gib",
        }
    )

    output: str
    limit: int | None = Field(None, ge=1)  # first N input rows
    chunk_rows: int = Field(64, ge=1)  # rows per output part: the unit of atomic writes and resume
    ray: RayConfig = Field(default_factory=RayConfig)
    think_start: str = "<think>"
    think_end: str = "</think>"
    # Resume: redo the ids whose row is an error row (the new row replaces it), not only the
    # missing ones. For errors whose cause was fixed (a longer context, a restored input file).
    retry_errors: bool = False
    # Fail the job (exit 1, after writing every row) when error rows exceed this share of the input
    # rows. None: never fail for error rows.
    max_error_rate: float | None = Field(None, ge=0, le=1)

    def resolve_paths(self):
        self.output = resolve_path(self.output)
        return self


class TrainRunBase(StrictModel):
    """What the Ray Train stages (train_draft, train_heads) share: Parquet in, a frozen target, DDP
    workers, checkpoints under `<storage_path>/<run_name>` that a rerun resumes, a published output."""

    # Keys a rerun of the same run may change (pipelines/common/run_identity.py): where things are,
    # how long and on what it trains, how often it logs and checkpoints. The target is fingerprinted
    # by content, the input by its part files. The stages add their own.
    RUN_ONLY_KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "input",
            "output",
            "limit",
            "target",
            "run_name",
            "storage_path",
            "steps",
            "num_workers",
            "use_gpu",
            "threads_per_worker",
            "cache_data",
            "log_every",
            "checkpoint_every",
            "num_to_keep",
            "max_failures",
            "placement_strategy",
            "ray",
        }
    )

    input: str  # the previous stage's output folder (Parquet parts)
    output: str  # the exported model folder (published whole: pipelines/common/publish.py)
    limit: int | None = Field(None, ge=1)  # first N input rows
    target: str  # the frozen target (teacher) model
    run_name: str
    storage_path: str = "runs/ray_train"  # Ray Train checkpoints: <storage_path>/<run_name>
    num_workers: int = Field(2, ge=1)
    use_gpu: bool | Literal["auto"] = "auto"
    threads_per_worker: int = Field(1, ge=1)  # torch threads per CPU worker
    target_dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the target's weights on the workers
    # Materialize the input's columns in the Ray object store once: epochs then re-split blocks in
    # memory instead of re-reading Parquet (seconds per epoch, which dominates on small sets).
    # Turn off when they do not fit in the object store.
    cache_data: bool = True
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    num_to_keep: int = Field(2, ge=1)
    max_failures: int = Field(2, ge=0)  # worker-group restarts from the last checkpoint
    # Where the workers go (Ray Train's ScalingConfig.placement_strategy). PACK (Ray's default) fills one
    # node first; SPREAD puts them on different nodes, so a lost node takes fewer workers with it. Both are
    # soft: a restart after a lost node packs the workers onto the capacity left.
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    ray: RayConfig = Field(default_factory=RayConfig)

    def resolve_paths(self):
        self.input = resolve_path(self.input)
        self.output = resolve_path(self.output)
        self.storage_path = resolve_path(self.storage_path)
        self.target = resolve_model(self.target)
        return self
