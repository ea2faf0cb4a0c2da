"""Typed, validated configs of the three Ray jobs (one pydantic model per stage).

Every model forbids unknown keys, so a typo in a YAML file is an error that names the key instead
of a silently ignored setting. `load_stage_config` applies the command-line overrides
(`--input`, `--output`, `--limit`) on top of the file and resolves relative paths (see
`resolve_path`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# Relative paths in configs and overrides resolve against this directory when it is set. Under
# `ray job submit --working-dir .` the job runs in an unpacked copy of the working dir, so a
# relative `runs/toy/traces` would land in that copy; set SPECEXIT_ROOT to the real checkout
# (or to shared storage) to keep outputs where the next job finds them.
ROOT_ENV = "SPECEXIT_ROOT"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def base_dir() -> Path:
    return Path(os.environ.get(ROOT_ENV) or os.getcwd())


def resolve_path(p: str | None) -> str | None:
    """Absolute local path (relative ones against SPECEXIT_ROOT or the cwd); URIs pass through."""
    if p is None or "://" in p:
        return p
    path = Path(p).expanduser()
    return str(path if path.is_absolute() else (base_dir() / path).resolve())


def resolve_model(m: str) -> str:
    """A model folder that exists (relative to the root, else to the cwd, i.e. the job's copy of
    the working dir, which holds the shipped toy teacher) becomes absolute; anything else is taken
    as a hub id (`Qwen/Qwen3-4B-Thinking-2507`) and passed to vLLM / transformers unchanged."""
    if "://" in m:
        return m
    for local in (Path(resolve_path(m)), Path(m).expanduser().resolve()):
        if local.exists():
            return str(local)
    return str(Path(resolve_path(m))) if m.startswith((".", "/", "~")) else m


class RayConfig(_Strict):
    # None: RAY_ADDRESS (set by `ray job submit`) if present, else a fresh local cluster.
    # "auto": connect to a cluster already started with `ray start` on this machine.
    address: str | None = None
    # Logical CPUs of a local cluster. ray.data.llm's build_processor needs >= 8 (one actor per
    # stage plus the engine), whatever the number of physical cores.
    num_cpus: int = Field(8, ge=1)


class InputConfig(_Strict):
    """Where prompts come from (traces stage)."""

    kind: Literal["toy", "jsonl", "parquet", "hf_disk", "hf_hub"] = "toy"
    path: str | None = None  # file / folder / glob (jsonl, parquet), folder (hf_disk), dataset name (hf_hub)
    split: str = "train"  # toy split or HF split
    hf_config_name: str | None = None  # HF hub dataset config, e.g. "main" for gsm8k
    n: int = Field(256, ge=1)  # toy: number of problems
    seed: int = 0  # toy: problem stream seed
    id_column: str | None = "id"  # used when the data has it; otherwise ids are row-<index>
    prompt_column: str = "prompt"
    gold_column: str | None = None  # gold answer column (toy: always filled)
    choices_column: str | None = None  # multiple choice: list of options, appended as "A. ..."

    @model_validator(mode="after")
    def _need_path(self):
        if self.kind != "toy" and not self.path:
            raise ValueError(f"input.kind={self.kind!r} needs input.path")
        return self


class EngineConfig(_Strict):
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
    seed: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)  # any other vLLM engine argument

    def engine_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            dtype=self.dtype, enforce_eager=self.enforce_eager, enable_prefix_caching=self.enable_prefix_caching,
            tensor_parallel_size=self.tensor_parallel_size, seed=self.seed,
        )
        for k in ("max_model_len", "max_num_seqs", "gpu_memory_utilization"):
            if getattr(self, k) is not None:
                kw[k] = getattr(self, k)
        kw.update(self.extra)
        return kw


class SamplingConfig(_Strict):
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = None
    max_tokens: int = Field(400, ge=1)
    # Per-row seed = seed + stable hash of the row id: a rerun samples the same traces.
    seed: int | None = 0


class _Stage(_Strict):
    output: str
    limit: int | None = Field(None, ge=1)  # first N input rows
    chunk_rows: int = Field(64, ge=1)  # rows per output part: the unit of atomic writes and resume
    ray: RayConfig = Field(default_factory=RayConfig)
    think_start: str = "<think>"
    think_end: str = "</think>"


class TracesConfig(_Stage):
    input: InputConfig = Field(default_factory=InputConfig)
    engine: EngineConfig
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)


class LabelsConfig(_Stage):
    input: str  # traces output folder
    engine: EngineConfig  # the teacher that wrote the traces
    grader: Literal["toy", "numeric", "multiple_choice"] = "toy"
    close_text: str = "</think>\n\n"  # forced after the boundary token
    answer_prompt: str = ""  # then this, e.g. "The final answer is " for real models
    probe_max_tokens: int = Field(16, ge=1)
    split_tokens: list[str] | None = None  # None: every single-token paragraph break of the tokenizer
    shift: Literal["next_step", "same_step"] = "next_step"
    initial_confidence: float = Field(0.0, ge=0, le=1)
    chunk_rows: int = Field(32, ge=1)


class TrainDraftConfig(_Strict):
    input: str  # labels output folder
    output: str  # exported SpecExit draft folder
    limit: int | None = Field(None, ge=1)
    target: str  # the frozen target (teacher) model
    run_name: str
    storage_path: str = "runs/ray_train"  # Ray Train checkpoints: <storage_path>/<run_name>
    num_workers: int = Field(2, ge=1)
    use_gpu: bool | Literal["auto"] = "auto"
    threads_per_worker: int = Field(1, ge=1)  # torch threads per CPU worker
    target_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    aux_layer_ids: tuple[int, int, int] | None = None  # None: vLLM's default (2, L//2, L-3)
    draft_vocab_size: int | None = Field(None, ge=1)  # required unless init_draft gives it
    # Start from an existing EAGLE-3 draft of this target (the usual case for real models: a
    # published EAGLE-3 head): a stock one gets zero signal rows (`specexit draft convert
    # --add-signals`), a SpecExit one is fine-tuned as is. Its draft vocab and aux layers are kept.
    init_draft: str | None = None
    include_embed: bool = True  # False: vLLM shares the target's embedding (saves a V x H tensor)
    steps: int = Field(100, ge=1)
    batch_size: int = Field(8, ge=1)  # per worker
    max_seq_len: int | None = Field(None, ge=8)  # truncate prompt + completion
    # Materialize the labeled rows in the Ray object store once: epochs then re-split blocks in
    # memory instead of re-reading Parquet (seconds per epoch, which dominates on small sets).
    # Turn off when the labels do not fit in the object store.
    cache_data: bool = True
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(10, ge=1)
    unroll: int = Field(7, ge=1)
    weighting: Literal["uncertainty", "ratio", "fixed"] = "uncertainty"
    grad_clip: float = Field(1.0, gt=0)
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    num_to_keep: int = Field(2, ge=1)
    max_failures: int = Field(2, ge=0)  # worker-group restarts from the last checkpoint
    seed: int = 0
    think_start: str = "<think>"
    think_end: str = "</think>"
    split_tokens: list[str] | None = None  # always in the draft vocab; None: auto (as labels)
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, v):
        if v is not None and (len(set(v)) != 3 or min(v) < 0):
            raise ValueError(f"aux_layer_ids must be 3 distinct non-negative ids, got {v}")
        return v

    @model_validator(mode="after")
    def _vocab_source(self):
        if self.draft_vocab_size is None and self.init_draft is None:
            raise ValueError("set draft_vocab_size (a new draft) or init_draft (fine-tune an existing one)")
        return self


STAGES: dict[str, type[BaseModel]] = {"traces": TracesConfig, "labels": LabelsConfig, "train_draft": TrainDraftConfig}


class ConfigError(ValueError):
    pass


def infer_input_kind(path: str) -> str:
    """`--input` for the traces stage: pick the reader from the path."""
    p = Path(resolve_path(path))
    if p.suffix in (".jsonl", ".json") or p.name.endswith(".jsonl.gz"):
        return "jsonl"
    if p.suffix == ".parquet":
        return "parquet"
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return "hf_disk"
        if any(p.glob("*.parquet")):
            return "parquet"
        if any(p.glob("*.jsonl")):
            return "jsonl"
    raise ConfigError(f"cannot tell the input kind of {path!r}; set input.kind in the config")


def load_stage_config(stage: str, path: str | None, *, input: str | None = None, output: str | None = None,
                      limit: int | None = None, raw: dict | None = None):
    """Read YAML, apply overrides, validate, resolve paths. Raises ConfigError with every problem."""
    cls = STAGES[stage]
    d: dict = dict(raw or {})
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text())
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        d = loaded
    if output is not None:
        d["output"] = output
    if limit is not None:
        d["limit"] = limit
    if input is not None:
        if stage == "traces":
            inp = dict(d.get("input") or {})
            inp.update(path=input, kind=infer_input_kind(input))
            d["input"] = inp
        else:
            d["input"] = input
    try:
        cfg = cls.model_validate(d)
    except ValidationError as e:
        raise ConfigError(f"invalid {stage} config{f' {path}' if path else ''}:\n{e}") from None
    return _resolve(cfg)


def _resolve(cfg):
    if isinstance(cfg, TracesConfig):
        if cfg.input.path and cfg.input.kind != "hf_hub":
            cfg.input.path = resolve_path(cfg.input.path)
    elif isinstance(cfg, (LabelsConfig, TrainDraftConfig)):
        cfg.input = resolve_path(cfg.input)
    cfg.output = resolve_path(cfg.output)
    if isinstance(cfg, (TracesConfig, LabelsConfig)):
        cfg.engine.model = resolve_model(cfg.engine.model)
    if isinstance(cfg, TrainDraftConfig):
        cfg.target = resolve_model(cfg.target)
        if cfg.init_draft is not None:
            cfg.init_draft = resolve_model(cfg.init_draft)
        cfg.storage_path = resolve_path(cfg.storage_path)
    return cfg
