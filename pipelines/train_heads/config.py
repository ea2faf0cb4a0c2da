"""Typed config of the TokenSwift head-training job (`python -m pipelines.train_heads --config FILE`).

The optimisation fields (num_heads, steps, lr, batch_positions, seed) and their defaults are the
in-process trainer's `HeadTrainConfig` (specexit_core/longgen/train_heads.py), inherited, not redefined.
"""

from __future__ import annotations

from pydantic import Field

from pipelines.common.config import TrainRunBase
from specexit_core.longgen.train_heads import HeadTrainConfig


class TrainHeadsConfig(HeadTrainConfig, TrainRunBase):
    """input: the traces output folder (Parquet: prompt_token_ids + completion_token_ids of the
    teacher); output: the exported heads (config.json + model.safetensors, `longgen.heads.load_heads`);
    target: the model that wrote the traces. A target_dtype other than float32 runs its LM head under
    autocast in that dtype while the heads' own weights, gradients and AdamW state stay float32."""

    batch_size: int = Field(4, ge=1)  # traces per worker per step; batch_positions positions are drawn from them
    max_seq_len: int | None = Field(None, ge=8)  # truncate prompt + completion (the target's forward memory)
    min_completion_tokens: int = Field(1, ge=1)  # skip traces whose completion is shorter (nothing to learn)
