"""Typed config of the TokenSwift head-training job (`python -m pipelines.train_heads --config FILE`).

The optimisation fields (num_heads, steps, lr, batch_positions, seed) and their defaults are the
in-process trainer's `HeadTrainConfig` (specexit_core/longgen/train_heads.py), inherited, not redefined.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipelines.common.config import RayConfig
from specexit_core.longgen.train_heads import HeadTrainConfig
from specexit_core.typed_config import resolve_model, resolve_path


class TrainHeadsConfig(HeadTrainConfig):
    # Keys a rerun of the same run may change (pipelines/common/run_identity.py): where things are,
    # how long and on what it trains, how often it logs and checkpoints. The target is fingerprinted
    # by content, the traces by their part files.
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
            "ray",
        }
    )

    input: str  # traces output folder (Parquet: prompt_token_ids + completion_token_ids of the teacher)
    output: str  # exported heads folder (config.json + model.safetensors, `longgen.heads.load_heads`)
    limit: int | None = Field(None, ge=1)  # first N trace rows
    target: str  # the frozen target: the model that wrote the traces
    run_name: str
    storage_path: str = "runs/ray_train"  # Ray Train checkpoints: <storage_path>/<run_name>
    num_workers: int = Field(2, ge=1)
    use_gpu: bool | Literal["auto"] = "auto"
    threads_per_worker: int = Field(1, ge=1)  # torch threads per CPU worker
    # The target's weights on the workers. Not float32: its LM head runs under autocast in that dtype
    # while the heads' own weights, gradients and AdamW state stay float32.
    target_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: int = Field(4, ge=1)  # traces per worker per step; batch_positions positions are drawn from them
    max_seq_len: int | None = Field(None, ge=8)  # truncate prompt + completion (the target's forward memory)
    min_completion_tokens: int = Field(1, ge=1)  # skip traces whose completion is shorter (nothing to learn)
    # Materialize the traces' token columns in the Ray object store once: epochs then re-split blocks
    # in memory instead of re-reading Parquet. Turn off when they do not fit in the object store.
    cache_data: bool = True
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    num_to_keep: int = Field(2, ge=1)
    max_failures: int = Field(2, ge=0)  # worker-group restarts from the last checkpoint
    ray: RayConfig = Field(default_factory=RayConfig)

    def resolve_paths(self) -> TrainHeadsConfig:
        self.input = resolve_path(self.input)
        self.output = resolve_path(self.output)
        self.storage_path = resolve_path(self.storage_path)
        self.target = resolve_model(self.target)
        return self
