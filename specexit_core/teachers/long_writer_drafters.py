"""The typed settings of the long writer's two drafters, light to import (the CLI builds its options from them):
TokenSwift heads (`long_writer_heads.py`, `specexit long-writer heads`) and the EAGLE-3 draft
(`long_writer_draft.py`, `specexit long-writer draft`). Their defaults made the shipped folders."""

from __future__ import annotations

from pydantic import Field

from specexit_core.typed_config import StrictModel


class LongWriterHeadsConfig(StrictModel):
    seqs: int = Field(32, ge=2, description="train prompts (half sampled with the penalty on)")
    head_len: int = Field(2048, ge=8, description="tokens per continuation")
    steps: int = Field(1000, ge=1, description="optimizer steps")
    batch_positions: int = Field(8192, ge=1, description="positions per optimizer step")
    threads: int = Field(2, ge=1, description="torch threads")


class LongWriterDraftConfig(StrictModel):
    steps: int = Field(240, ge=1, description="optimizer steps")
    seqs: int = Field(48, ge=1, description="train prompts")
    seq_len: int = Field(1024, ge=16, description="tokens per walk (prompt included)")
    batch_size: int = Field(2, ge=1, description="walks per optimizer step")
    lr: float = Field(2e-3, gt=0, description="peak learning rate (warm-up, then cosine to 0)")
    threads: int = Field(1, ge=1, description="torch threads")
    seed: int = Field(0, description="seed of the weights, the data order and the prompts")
    heldout: int = Field(4, ge=1, description="held-out test prompts for the agreement figures")
