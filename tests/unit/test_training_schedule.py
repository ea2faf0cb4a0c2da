"""The drafts' learning-rate schedule: linear warm-up, then cosine to 0 (pipelines/train_draft, the toy's and the
long writer's in-process drafts all read it)."""

import math

import pytest

from pipelines.train_draft.config import TrainDraftConfig
from pipelines.train_draft.loop import lr_at
from specexit_core.training.schedule import warmup_cosine


def test_warm_up_then_cosine_to_zero():
    assert warmup_cosine(1e-3, 0, 100, 10) == pytest.approx(1e-4 * 1.0)  # step 1 of 10, cosine ~1
    assert warmup_cosine(1e-3, 9, 100, 10) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 9 / 100)))
    assert warmup_cosine(1e-3, 50, 100, 10) == pytest.approx(0.5e-3)
    assert warmup_cosine(1e-3, 99, 100, 10) < 1e-6


def test_the_ray_stage_uses_it():
    cfg = TrainDraftConfig.model_construct(lr=2e-3, steps=40, warmup_steps=5)
    assert [lr_at(cfg, s) for s in range(40)] == [warmup_cosine(2e-3, s, 40, 5) for s in range(40)]
