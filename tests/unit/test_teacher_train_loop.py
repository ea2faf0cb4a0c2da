"""The built-in teachers' training loop (`specexit_core.toy.train_loop`): the learning-rate schedule and
the warning for bf16 autocast where the CPU can only emulate bf16."""

import logging

import pytest
import torch

from specexit_core.toy.train_loop import TrainRecipe, lr_at, warn_if_bf16_is_emulated


def test_lr_warms_up_then_decays_to_its_floor():
    cfg = TrainRecipe(steps=200, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(cfg, 0) == pytest.approx(1e-4)
    assert lr_at(cfg, 9) == pytest.approx(1e-3)
    assert lr_at(cfg, 199) == pytest.approx(1e-4, rel=1e-3)
    assert all(lr_at(cfg, s) >= lr_at(cfg, s + 1) for s in range(10, 199))


@pytest.mark.parametrize(
    "cap, bf16, warned",
    [("AVX2", True, True), ("DEFAULT", True, True), ("AVX512", True, False), ("AVX2", False, False)],
)
def test_bf16_autocast_warns_only_where_it_is_emulated(monkeypatch, caplog, cap, bf16, warned):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: cap)
    log = logging.getLogger("test.train_loop")
    with caplog.at_level(logging.WARNING, logger=log.name):
        warn_if_bf16_is_emulated(TrainRecipe(bf16_autocast=bf16), log)
    assert ("emulated" in caplog.text) == warned  # the warning says why
    assert (cap in caplog.text) == warned
