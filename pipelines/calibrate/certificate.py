"""The certified exit of `specexit calibrate`: Learn then Test (specexit_core/exit/risk_control.py)
over the replayed dev traces.

Per dev prompt, temperature and setting of the grid, the loss of the exit the replay finds
(`accuracy_drop`: the trace's own answer is right and the answer forced at the exit is wrong); the
settings are ordered on one part of the prompts (Pareto front of estimated loss, mean think tokens)
and tested on the other, conservative first. The record says what was certified: ε, δ, the loss,
how many prompts ordered and tested, the chosen setting (the most aggressive certified one) and its
certified upper bound, and how many dev prompts a certificate would need at the rate observed.

`selection: certified` makes this the calibrated exit (none certified: the exit is off, SpecExit then
decodes as EAGLE-3); `selection: tolerance` keeps the point-estimate choice and records this beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from specexit_core.exit.risk_control import accuracy_drop_loss, certify, dev_size_needed

LOSSES = {"accuracy_drop": accuracy_drop_loss}  # the gold-free `disagreement` needs probe answers: not yet stored


def prompt_losses(
    traces_by_t: Mapping[float, Sequence[dict]],
    outcomes_by_t: Mapping[float, Sequence[Sequence[tuple[bool, int]]]],
    loss: str,
) -> dict[str, list[dict[str, float]]]:
    """{temperature label: [setting][prompt id] -> loss}; `outcomes_by_t[t][s][i]` is setting s's
    (answer right, think tokens) on trace i (`replay_outcomes`)."""
    fn = LOSSES[loss]
    return {
        f"{t:g}": [
            {tr["id"]: fn(tr["correct"], ok) for tr, (ok, _) in zip(traces_by_t[t], row)} for row in outcomes_by_t[t]
        ]
        for t in traces_by_t
    }


def certified_choice(
    traces_by_t: Mapping[float, Sequence[dict]],
    outcomes_by_t: Mapping[float, Sequence[Sequence[tuple[bool, int]]]],
    *,
    epsilon: float,
    delta: float,
    loss: str,
    order_share: float,
    seed: int,
    point_choice: int | None = None,
) -> dict:
    """The certificate over the grid (cost: think tokens, mean over temperatures): its record, with
    `chosen` the index of the certified setting (None: not even the most conservative holds).
    `point_choice`: the point-estimate rule's setting, whose observed loss (largest over the
    temperatures, all dev prompts) and the dev size a certificate would need at that rate are added."""
    losses = prompt_losses(traces_by_t, outcomes_by_t, loss)
    temps = list(traces_by_t)
    n_settings = len(outcomes_by_t[temps[0]])
    cost = [
        statistics.mean(statistics.mean(n for _, n in outcomes_by_t[t][s]) for t in temps) for s in range(n_settings)
    ]
    cert = certify(losses, cost, epsilon=epsilon, delta=delta, order_share=order_share, seed=seed)
    rec = cert.to_dict()
    rec.update(loss=loss, n_dev=cert.n_order + cert.n_test, order_share=order_share, seed=seed)
    rec["tested"] = len(cert.p_values)
    rec["p_values"] = [round(p, 6) for p in cert.p_values[:50]]  # the first (conservative) ones
    rec.pop("order")  # grid indices: the tested count and p-values say what was tried
    if cert.chosen is not None:
        rec["observed_loss"] = _worst_rate(losses, cert.chosen)
    rec["dev_size_for_zero_losses"] = dev_size_needed(0.0, epsilon, delta)
    if point_choice is not None:
        rate = _worst_rate(losses, point_choice)
        rec["point_choice"] = {"observed_loss": rate, "dev_size_needed": dev_size_needed(rate, epsilon, delta)}
    return rec


def _worst_rate(losses: Mapping[str, Sequence[Mapping[str, float]]], s: int) -> float:
    """Setting s's mean loss over all dev prompts, the largest over the temperatures."""
    return max(statistics.mean(losses[p][s].values()) for p in losses)
