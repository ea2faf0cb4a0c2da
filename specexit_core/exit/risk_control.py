"""Choosing an exit setting with a guarantee instead of a point estimate: Learn then Test
(Angelopoulos, Bates, Candès, Jordan, Lei, 2021) with fixed-sequence testing along a Pareto order
(Pareto Testing: Laufer-Goldshtein, Fisch, Barzilay, Jaakkola, 2023).

Why: the fewest think tokens among thousands of settings whose dev accuracy is "within 1 point" is
the minimum over many noisy estimates, biased toward settings that were lucky on dev (the winner's
curse); under sampling that exit lost 2-5 points on test. Here a setting λ is *certified* when the
null hypothesis H_λ: R(λ) > ε (R: the expected loss on new prompts) is rejected at level δ.

1. Split the dev prompts in two. On the first part, estimate each setting's loss and cost (think
   tokens) and keep the Pareto front, ordered from conservative (most think tokens) to aggressive.
2. On the second part, test the settings in that order, each at level δ, and stop at the first that
   is not rejected (fixed-sequence testing: the order is fixed before the second part is looked at,
   so no correction for multiplicity is needed). Every setting before the stop is certified, all
   together, with probability >= 1 - δ; the chosen one is the cheapest of them (along the front: the
   last, the most aggressive). `order="loss"` tests every setting by estimated loss instead (`loss_order`).

The unit is the prompt: with k samples per prompt, its loss is the mean over its samples (samples of
one prompt are not independent). Losses lie in [0, 1]; 0/1 losses get the exact binomial p-value,
others Hoeffding-Bentkus. Several sampling profiles (temperatures) must all hold: a setting's
p-value is the largest over them (an intersection-union test, valid at level δ without correction).

Pure Python (math only): the calibration job calls it on losses it replayed, tests call it on
simulated ones."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# -- p-values ------------------------------------------------------------------------------------


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (exact for the n a dev split has)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq for i in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def binomial_p_value(k: int, n: int, epsilon: float) -> float:
    """p-value of H: R > ε after k losses of 1 in n (0/1 losses): P(Binomial(n, ε) <= k)."""
    return binom_cdf(k, n, epsilon)


def _kl(a: float, b: float) -> float:
    """Bernoulli KL divergence h(a, b) = a log(a/b) + (1-a) log((1-a)/(1-b))."""
    out = 0.0
    if a > 0:
        out += a * math.log(a / b)
    if a < 1:
        out += (1 - a) * math.log((1 - a) / (1 - b))
    return out


def hoeffding_bentkus_p_value(mean: float, n: int, epsilon: float) -> float:
    """p-value of H: R > ε for n losses in [0, 1] with this mean (Bates et al. 2021, RCPS):
    min(exp(-n h(min(mean, ε), ε)), e P(Binomial(n, ε) <= ceil(n mean)))."""
    if n == 0:
        return 1.0
    hoeffding = math.exp(-n * _kl(min(mean, epsilon), epsilon))
    bentkus = math.e * binom_cdf(math.ceil(n * mean - 1e-9), n, epsilon)
    return min(1.0, hoeffding, bentkus)


def p_value(losses: Sequence[float], epsilon: float) -> float:
    """The p-value of H: R > ε for per-prompt losses in [0, 1]: exact binomial when every loss is 0
    or 1, Hoeffding-Bentkus otherwise (e.g. the mean over a prompt's k samples)."""
    n = len(losses)
    if n == 0:
        return 1.0
    if any(x < 0 or x > 1 for x in losses):
        raise ValueError("losses must lie in [0, 1]")
    if all(x in (0, 1) for x in losses):
        return binomial_p_value(int(sum(losses)), n, epsilon)
    return hoeffding_bentkus_p_value(sum(losses) / n, n, epsilon)


def upper_bound(losses: Sequence[float], delta: float) -> float:
    """The certified bound: the smallest ε whose p-value is <= δ (for 0/1 losses the one-sided
    Clopper-Pearson upper bound at 1 - δ). 1.0 when even ε = 1 is not rejected."""
    lo, hi = 0.0, 1.0
    if p_value(losses, 1.0 - 1e-12) > delta:
        return 1.0
    for _ in range(60):  # the p-value falls as ε grows: bisection
        mid = (lo + hi) / 2
        if p_value(losses, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def dev_size_needed(rate: float, epsilon: float, delta: float, *, max_n: int = 1_000_000) -> int | None:
    """About how many prompts certify R <= ε at level δ when a share `rate` of them lose (0/1
    losses, ceil(rate n) losses in n): None when not below `max_n`, e.g. at a rate at or above ε.
    With no losses: ln(1/δ)/ε (230 at ε = 1%, δ = 0.1). The p-value jumps up at each further loss,
    so this is the first crossing found by bisection, not a monotone threshold."""
    if rate >= epsilon:
        return None

    def holds(n: int) -> bool:
        return binomial_p_value(math.ceil(rate * n - 1e-12), n, epsilon) <= delta

    lo, hi = 1, 1
    while not holds(hi):
        lo, hi = hi, hi * 2
        if hi > max_n:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


# -- the order and the test ------------------------------------------------------------------------


def pareto_order(loss: Sequence[float], cost: Sequence[float]) -> list[int]:
    """Indices of the settings on the Pareto front of (estimated loss, cost), both minimised,
    ordered from conservative (highest cost, lowest loss) to aggressive (lowest cost). Ties in both
    keep the first index."""
    front: list[int] = []
    best = math.inf
    for i in sorted(range(len(cost)), key=lambda i: (cost[i], loss[i], i)):  # cheapest first
        if loss[i] < best:  # on the front: a lower loss than every cheaper (or equally cheap) setting
            front.append(i)
            best = loss[i]
    return list(reversed(front))


def loss_order(loss: Sequence[float], cost: Sequence[float]) -> list[int]:
    """Every setting, by estimated loss (lowest first), ties by cost (dearest first). Unlike the Pareto
    front, settings tied in estimated loss stay, the most conservative first: on a small ordering part
    many settings tie at no loss, the front keeps only the cheapest of them (the luckiest, an
    aggressive one), which then fails the test and leaves nothing certified."""
    return sorted(range(len(cost)), key=lambda i: (loss[i], -cost[i], i))


ORDERS = {"pareto": pareto_order, "loss": loss_order}


def fixed_sequence(p_values: Sequence[float], delta: float) -> int:
    """How many settings, tested in this order, are rejected before the first that is not."""
    for i, p in enumerate(p_values):
        if p > delta:
            return i
    return len(p_values)


@dataclass(frozen=True)
class Certificate:
    chosen: int | None  # index into the settings; None: not even the most conservative is certified
    certified: list[int]  # every certified setting, conservative first (the chosen one last)
    order: list[int]  # the tested sequence (the Pareto front of the ordering part)
    p_values: list[float]  # along `order`, as far as tested (the first > δ ends it)
    bound: float | None  # the chosen setting's certified upper bound on the loss (largest over profiles)
    n_order: int  # prompts used to order the settings
    n_test: int  # prompts the test ran on
    epsilon: float
    delta: float

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def split_prompts(prompts: Sequence[str], order_share: float, seed: int) -> tuple[list[str], list[str]]:
    """The prompts (ids) split at random into the ordering part and the testing part."""
    ids = sorted(prompts)
    random.Random(seed).shuffle(ids)
    k = max(1, min(len(ids) - 1, round(order_share * len(ids)))) if len(ids) > 1 else 0
    return ids[:k], ids[k:]


def certify(
    losses: Mapping[str, Sequence[Mapping[str, float]]],
    cost: Sequence[float],
    *,
    epsilon: float,
    delta: float,
    order_share: float = 0.5,
    seed: int = 0,
    order: str = "pareto",
) -> Certificate:
    """Learn then Test over settings 0..S-1. `losses[profile][s][prompt]`: setting s's loss on each
    prompt at one sampling profile (a prompt's mean over its samples, in [0, 1]); `cost[s]`: what
    to minimise (mean think tokens). A prompt counts where every profile has it. `order`: the tested
    sequence, `pareto` (the front) or `loss` (every setting, `loss_order`); the chosen setting is the
    cheapest certified one (all of them hold together)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; one of {sorted(ORDERS)}")
    profiles = list(losses)
    if not profiles or not cost:
        raise ValueError("need at least one profile and one setting")
    common = set.intersection(*(set(losses[p][0]) for p in profiles))
    part1, part2 = split_prompts(list(common), order_share, seed)

    def mean(p: str, s: int, ids: list[str]) -> float:
        return sum(losses[p][s][i] for i in ids) / len(ids) if ids else 0.0

    est = [max(mean(p, s, part1) for p in profiles) for s in range(len(cost))]
    seq = ORDERS[order](est, cost)
    pv: list[float] = []
    for s in seq:
        pv.append(max(p_value([losses[p][s][i] for i in part2], epsilon) for p in profiles))
        if pv[-1] > delta:
            break
    n_ok = fixed_sequence(pv, delta)
    certified = seq[:n_ok]
    chosen = min(certified, key=lambda s: (cost[s], -certified.index(s))) if certified else None
    bound = (
        max(upper_bound([losses[p][chosen][i] for i in part2], delta) for p in profiles) if chosen is not None else None
    )
    return Certificate(chosen, certified, seq, pv, bound, len(part1), len(part2), epsilon, delta)


# -- losses ---------------------------------------------------------------------------------------


def accuracy_drop_loss(full_correct: bool, exit_correct: bool) -> float:
    """Needs gold: 1 when the trace's own answer at its natural end is right and the answer forced
    at the exit is wrong. Its mean bounds the accuracy drop from above."""
    return float(bool(full_correct) and not bool(exit_correct))


def disagreement_loss(full_answer: str | None, exit_answer: str | None) -> float:
    """Needs no gold: 1 when the answer forced at the exit differs from the answer the same trace
    reaches at its natural end (no answer counts as an answer of its own). Since
    acc(exit) >= acc(full) - P(disagree), its mean bounds the accuracy drop from above too."""
    return float(full_answer != exit_answer)
