"""The certified exit of `specexit calibrate`: Learn then Test (specexit_core/exit/risk_control.py)
over the replayed dev traces.

Per dev prompt, temperature and setting of the grid, the loss of the exit the replay finds
(`disagreement`, no gold needed: the answer forced at the exit differs from the one the same trace
reaches at its natural end; `accuracy_drop`: the trace's own answer is right and the one forced at
the exit is wrong; either mean bounds the accuracy drop from above); the
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
from typing import Literal, get_args

from specexit_core.exit.risk_control import accuracy_drop_loss, certify, dev_size_needed, disagreement_loss

LossName = Literal["disagreement", "accuracy_drop"]  # `CalibrateConfig.loss`; the first is its default
LOSSES: tuple[str, ...] = get_args(LossName)


def prompt_losses(
    traces_by_t: Mapping[float, Sequence[dict]],
    results_by_t: Mapping[float, Sequence[Sequence[tuple]]],
    loss: str,
) -> dict[str, list[dict[str, float]]]:
    """{temperature label: [setting][prompt id] -> loss}; `results_by_t[t][s][i]` is setting s's
    (answer right, think tokens, answer given) on trace i (`replay_outcomes` with `exit_result`).
    With several samples per prompt (`EvalConfig.samples`) a prompt's loss is its samples' mean: the
    prompt, not the sample, is what the certificate counts (its samples are not independent)."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; one of {LOSSES}")
    if loss == "disagreement":
        missing = [tr["id"] for trs in traces_by_t.values() for tr in trs if tr.get("answers") is None]
        if missing:
            raise ValueError(
                f"loss 'disagreement' needs the probes' answers, which {len(missing)} dev traces lack "
                f"(e.g. {missing[0]!r}: an evaluation run from before they were recorded); rerun the dev "
                "evaluation into a fresh output folder, or use loss: accuracy_drop"
            )

    def one(tr: dict, res: tuple) -> float:
        if loss == "disagreement":
            return disagreement_loss(tr["final_answer"], res[2])
        return accuracy_drop_loss(tr["correct"], res[0])

    def per_prompt(traces: Sequence[dict], row: Sequence[tuple]) -> dict[str, float]:
        by: dict[str, list[float]] = {}
        for tr, r in zip(traces, row):
            by.setdefault(tr.get("problem", tr["id"]), []).append(one(tr, r))
        return {p: sum(x) / len(x) for p, x in by.items()}

    return {f"{t:g}": [per_prompt(traces_by_t[t], row) for row in results_by_t[t]] for t in traces_by_t}


def certified_choice(
    traces_by_t: Mapping[float, Sequence[dict]],
    results_by_t: Mapping[float, Sequence[Sequence[tuple]]],
    *,
    epsilon: float,
    delta: float,
    loss: str,
    order_share: float,
    seed: int,
    point_choice: int | None = None,
    losses: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
) -> dict:
    """The certificate over the grid (cost: think tokens, mean over temperatures): its record, with
    `chosen` the index of the certified setting (None: not even the most conservative holds).
    `point_choice`: the point-estimate rule's setting, whose observed loss (largest over the
    temperatures, all dev prompts) and the dev size a certificate would need at that rate are added.
    `losses`: `prompt_losses` of these traces, when the caller has them (several epsilons, one replay)."""
    if losses is None:
        losses = prompt_losses(traces_by_t, results_by_t, loss)
    losses = {f"{t:g}": losses[f"{t:g}"] for t in traces_by_t}
    temps = list(traces_by_t)
    n_settings = len(results_by_t[temps[0]])
    cost = [statistics.mean(int_mean([r[1] for r in results_by_t[t][s]]) for t in temps) for s in range(n_settings)]
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


def int_mean(xs: Sequence[int]) -> float:
    """The mean of integers (or bools) as `statistics.mean` gives it, the same float (an exact integer
    sum, one correctly rounded division), without its exact-fraction machinery: the replay summarises
    thousands of settings over thousands of traces."""
    return sum(xs) / len(xs)


def _worst_rate(losses: Mapping[str, Sequence[Mapping[str, float]]], s: int) -> float:
    """Setting s's mean loss over all dev prompts, the largest over the temperatures."""
    return max(statistics.mean(losses[p][s].values()) for p in losses)
