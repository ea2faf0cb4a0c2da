"""Learn then Test for the exit (specexit_core/exit/risk_control.py): exact p-values, the Pareto
order, fixed-sequence testing, and the guarantee itself in simulation -- over many simulated dev
sets, the chosen setting's true loss exceeds ε in at most a δ share of them."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexit_core.exit.risk_control import (
    accuracy_drop_loss,
    binom_cdf,
    binomial_p_value,
    certify,
    dev_size_needed,
    disagreement_loss,
    fixed_sequence,
    hoeffding_bentkus_p_value,
    p_value,
    pareto_order,
    upper_bound,
)


@given(st.integers(0, 40), st.integers(1, 40), st.floats(0.001, 0.999))
def test_binom_cdf_is_the_sum_of_the_pmf(k, n, p):
    want = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(min(k, n) + 1))
    assert binom_cdf(k, n, p) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_no_losses_in_230_prompts_certify_one_point_at_delta_0_1():
    # 0.99^229 = 0.1003 > 0.1 >= 0.99^230 = 0.0993: the rule of thumb n >= ln(1/δ)/ε, exactly
    assert binomial_p_value(0, 229, 0.01) > 0.1 >= binomial_p_value(0, 230, 0.01)
    assert dev_size_needed(0.0, 0.01, 0.1) == 230
    assert dev_size_needed(0.003, 0.01, 0.1) > 230  # a 0.3% loss rate needs more
    assert dev_size_needed(0.01, 0.01, 0.1) is None  # at ε nothing certifies


def test_p_value_picks_the_exact_test_for_0_1_losses_and_hoeffding_bentkus_otherwise():
    assert p_value([0, 1, 0, 0], 0.2) == binomial_p_value(1, 4, 0.2)
    assert p_value([0.5, 0, 0, 0], 0.2) == hoeffding_bentkus_p_value(0.125, 4, 0.2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        p_value([1.5], 0.2)


@pytest.mark.parametrize("kind", ["binary", "fractional"])
def test_p_values_are_valid_at_the_null_boundary(kind):
    """R = ε exactly: P(p <= δ) <= δ (sampling slack: three binomial standard deviations)."""
    rng = random.Random(0)
    eps, delta, n, sims = 0.1, 0.1, 80, 1500
    hits = 0
    for _ in range(sims):
        if kind == "binary":
            losses = [float(rng.random() < eps) for _ in range(n)]
        else:  # a prompt's mean over 4 samples
            losses = [sum(rng.random() < eps for _ in range(4)) / 4 for _ in range(n)]
        hits += p_value(losses, eps) <= delta
    assert hits / sims <= delta + 3 * math.sqrt(delta * (1 - delta) / sims)


def test_upper_bound_is_clopper_pearson_for_0_1_losses():
    assert upper_bound([0] * 50, 0.1) == pytest.approx(1 - 0.1 ** (1 / 50), rel=1e-6)
    b = upper_bound([1, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.1)
    assert binomial_p_value(1, 10, b) == pytest.approx(0.1, rel=1e-6)
    assert upper_bound([1, 1], 0.1) == 1.0


def test_pareto_order_by_hand():
    loss = [0.00, 0.01, 0.01, 0.05, 0.02, 0.30]
    cost = [100, 80, 90, 40, 60, 10]
    # 2 is dominated by 1 (cheaper, same loss); 3 is not dominated (cheapest but 5): conservative first
    assert pareto_order(loss, cost) == [0, 1, 4, 3, 5]
    assert pareto_order([0.1, 0.1], [5, 5]) == [0]  # equal in both: the first index


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=30))
def test_pareto_order_is_the_non_dominated_set_from_conservative_to_aggressive(points):
    loss = [p[0] / 20 for p in points]
    cost = [float(p[1]) for p in points]
    order = pareto_order(loss, cost)
    for a, b in zip(order, order[1:]):
        assert cost[a] > cost[b] and loss[a] < loss[b]
    kept = {(loss[i], cost[i]) for i in order}
    for i in range(len(points)):
        dominated = any(
            loss[j] <= loss[i] and cost[j] <= cost[i] and (loss[j], cost[j]) != (loss[i], cost[i])
            for j in range(len(points))
        )
        assert dominated != ((loss[i], cost[i]) in kept)


def test_fixed_sequence_stops_at_the_first_that_is_not_rejected():
    assert fixed_sequence([0.01, 0.05, 0.2, 0.01], 0.1) == 2
    assert fixed_sequence([0.5], 0.1) == 0 and fixed_sequence([], 0.1) == 0


def _simulated_dev(rng, true_risk, n):
    """Per prompt 0/1 losses of each setting, nested (a more aggressive setting loses where a more
    conservative one does, and more), as exits along one trace do."""
    u = [rng.random() for _ in range(n)]
    return {"0": [{f"p{j}": float(u[j] < r) for j in range(n)} for r in true_risk]}


@pytest.mark.parametrize("order", ["pareto", "loss"])
def test_the_chosen_setting_holds_its_bound_on_new_prompts_in_all_but_a_delta_share(order):
    """The guarantee: P(R(chosen) > ε) <= δ over dev sets. Settings from no loss to 8% loss; the
    cheaper the setting the riskier. The naive rule (fewest think tokens with dev loss <= ε) fails it."""
    rng = random.Random(1)
    true_risk = [0.0, 0.002, 0.005, 0.008, 0.01, 0.012, 0.015, 0.02, 0.04, 0.08]
    cost = [100 - 9 * i for i in range(len(true_risk))]
    eps, delta, n, sims = 0.01, 0.1, 600, 300
    over = naive_over = 0
    for s in range(sims):
        dev = _simulated_dev(rng, true_risk, n)
        cert = certify(dev, cost, epsilon=eps, delta=delta, seed=s, order=order)
        over += cert.chosen is not None and true_risk[cert.chosen] > eps
        naive = max(i for i in range(len(true_risk)) if sum(dev["0"][i].values()) / n <= eps)
        naive_over += true_risk[naive] > eps
    assert over / sims <= delta + 3 * math.sqrt(delta * (1 - delta) / sims)
    assert naive_over / sims > 0.3  # the winner's curse the certificate removes


def test_certify_reports_its_evidence_and_every_profile_must_hold():
    n = 400
    safe = {f"p{j}": 0.0 for j in range(n)}
    risky = {f"p{j}": float(j % 10 == 0) for j in range(n)}  # 10% loss
    one = certify({"0": [safe, safe, risky]}, [100, 50, 10], epsilon=0.05, delta=0.1)
    # setting 0 is as safe as 1 and dearer: off the front; 1 holds, 2 (10% loss) does not
    assert one.order == [1, 2] and one.chosen == 1 and one.certified == [1] and one.n_order + one.n_test == n
    assert one.p_values[-1] > 0.1 and one.bound < 0.05 and one.to_dict()["epsilon"] == 0.05
    # the same settings at a second temperature where setting 1 is risky: only setting 0 holds
    two = certify({"0": [safe, safe, risky], "0.6": [safe, risky, risky]}, [100, 50, 10], epsilon=0.05, delta=0.1)
    assert two.chosen == 0
    none = certify({"0": [risky]}, [100], epsilon=0.05, delta=0.1)
    assert none.chosen is None and none.certified == [] and none.bound is None


def test_losses():
    assert accuracy_drop_loss(True, False) == 1.0
    assert accuracy_drop_loss(False, True) == accuracy_drop_loss(True, True) == accuracy_drop_loss(False, False) == 0.0
    assert disagreement_loss("7", "7") == 0.0 and disagreement_loss("7", "8") == 1.0
    assert disagreement_loss(None, "7") == 1.0 and disagreement_loss(None, None) == 0.0


def test_loss_order_keeps_ties_conservative_first_and_certifies_where_the_front_gives_up():
    """On a small ordering part many settings tie at no loss: the front keeps the cheapest (here a
    risky one that fails the test, so nothing is certified); the loss order tests the safe, dearer
    ones first and chooses the cheapest that holds."""
    from specexit_core.exit.risk_control import loss_order

    assert loss_order([0.0, 0.0, 0.1, 0.0], [50, 90, 10, 20]) == [1, 0, 3, 2]
    n = 200
    safe = {f"p{j}": 0.0 for j in range(n)}
    # lucky on the ordering part, 10% loss on the testing one (split seed 0, order_share 0.5)
    from specexit_core.exit.risk_control import split_prompts

    _, test_part = split_prompts(list(safe), 0.5, 0)
    lucky = {p: float(p in set(test_part[::10])) for p in safe}
    losses, cost = {"0": [safe, safe, lucky]}, [100, 60, 10]
    front = certify(losses, cost, epsilon=0.05, delta=0.1)
    assert front.order[0] == 2 and front.chosen is None  # the cheapest zero-estimate setting fails
    by_loss = certify(losses, cost, epsilon=0.05, delta=0.1, order="loss")
    assert by_loss.order == [0, 1, 2] and by_loss.certified == [0, 1] and by_loss.chosen == 1
    with pytest.raises(ValueError, match="unknown order"):
        certify(losses, cost, epsilon=0.05, delta=0.1, order="random")
