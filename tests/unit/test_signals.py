"""The signals' activation: `activate` (torch, training and the reference engine) and `activate_value`
(one value, compiled into the vLLM hook's per-row loop on CPU) are the same functions: equal to
within an ulp or two (libm's exp/expm1 against torch's vectorised ones), with the same edges
(0 -> 0.5, the clamp at REMAINING_RAW_MAX, nothing below 0, infinities, NaN kept)."""

import math

import numpy as np
import torch

from specexit_core.signals import REMAINING_RAW_MAX, activate, activate_value
from specexit_core.vllm_plugin.step_kernels import _activate_value


def test_activate_value_is_activate_to_the_last_places():
    rng = np.random.default_rng(0)
    raw = np.concatenate([rng.normal(0, 4, (4000, 3)), rng.uniform(-40, 40, (1000, 3))])
    want = activate(torch.from_numpy(raw)).numpy()
    for compiled in (False, True):
        f = _activate_value if compiled else activate_value
        got = np.array([[f(i, float(v)) for i, v in enumerate(row)] for row in raw])
        np.testing.assert_allclose(got, want, rtol=4e-16, atol=0)


def test_activate_value_edges():
    for f in (activate_value, _activate_value):
        assert f(0, 0.0) == 0.5 and f(1, 0.0) == 0.5
        assert f(0, math.inf) == 1.0 and f(1, -math.inf) == 0.0
        assert f(2, -5.0) == 0.0 and f(2, -math.inf) == 0.0
        assert f(2, 1e6) == f(2, REMAINING_RAW_MAX) == math.expm1(REMAINING_RAW_MAX)
        assert all(math.isnan(f(i, math.nan)) for i in range(3))  # the hook's finite check sees it
    t = activate(torch.tensor([[math.nan, math.inf, 1e6]], dtype=torch.float64))[0].tolist()
    assert math.isnan(t[0]) and t[1] == 1.0 and t[2] == math.expm1(REMAINING_RAW_MAX)
