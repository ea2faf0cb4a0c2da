"""Tests of the engine-independent SpecExit exit policy (pure Python, fast)."""

import math
import random

import pytest

from specexit_core.exit import SIGNALS, ExitConfig, ExitDecision, ExitTracker, decide

START, END, SPLIT = 100, 101, frozenset({5, 6})
IDS = dict(split_token_ids=SPLIT, think_start_id=START, think_end_id=END)
PASS = (0.95, 0.9, 10.0)  # passes every default threshold
FAIL = (0.1, 0.05, 900.0)  # fails every default threshold


def run(tokens, signals, in_think=True, **cfg):
    return decide(tokens, signals, ExitConfig(**cfg), in_think=in_think, **IDS)


# -- config ------------------------------------------------------------------


def test_defaults_match_the_paper():
    cfg = ExitConfig()
    assert (cfg.confidence_threshold, cfg.progress_threshold, cfg.remaining_threshold) == (0.8, 0.3, 200.0)
    assert cfg.alpha == 0.1 and cfg.enabled and cfg.min_think_tokens == 0 and cfg.max_think_tokens is None
    assert cfg.signals_used == SIGNALS == ("confidence", "progress", "remaining")


@pytest.mark.parametrize(
    "method,used",
    [
        ("confidence", ("confidence",)),
        ("progress", ("progress",)),
        ("remain", ("remaining",)),
        ("remaining", ("remaining",)),
        ("remain_confidence", ("confidence", "remaining")),
        ("progress_confidence", ("confidence", "progress")),
        ("remaining_progress_confidence", SIGNALS),
        ("confidence_progress_remain", SIGNALS),
    ],
)
def test_method_parsing(method, used):
    assert ExitConfig(method=method).signals_used == used


@pytest.mark.parametrize(
    "method,needle",
    [
        ("confidense", "'confidense'"),
        ("confidence_foo", "'foo'"),
        ("", "non-empty"),
        ("confidence__progress", "''"),
        ("progress_progress", "twice"),
        ("remain_remaining", "twice"),
        ("Confidence", "'Confidence'"),
    ],
)
def test_method_errors(method, needle):
    with pytest.raises(ValueError) as e:
        ExitConfig(method=method)
    msg = str(e.value)
    assert needle in msg and "method" in msg
    if needle != "twice":  # says what would have been accepted
        assert "confidence, progress, remain (alias: remaining)" in msg


@pytest.mark.parametrize(
    "field,value",
    [
        ("confidence_threshold", 1.5),
        ("confidence_threshold", -0.1),
        ("confidence_threshold", math.nan),
        ("progress_threshold", 2),
        ("remaining_threshold", 0),
        ("remaining_threshold", -5.0),
        ("remaining_threshold", math.nan),
        ("alpha", 0),
        ("alpha", 1.01),
        ("alpha", -0.5),
        ("min_think_tokens", -1),
        ("max_think_tokens", 0),
        # wrong types, bools included (bool is an int subclass)
        ("confidence_threshold", "0.8"),
        ("confidence_threshold", True),
        ("progress_threshold", None),
        ("remaining_threshold", [200]),
        ("alpha", False),
        ("min_think_tokens", 1.5),
        ("min_think_tokens", True),
        ("max_think_tokens", "10"),
        ("max_think_tokens", 3.0),
        ("max_think_tokens", True),
        ("enabled", "yes"),
        ("enabled", 1),
        ("method", 3),
        ("method", None),
    ],
)
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ExitConfig(**{field: value})


def test_max_below_min_is_rejected():
    with pytest.raises(ValueError, match="max_think_tokens .* min_think_tokens"):
        ExitConfig(min_think_tokens=10, max_think_tokens=5)
    assert ExitConfig(min_think_tokens=5, max_think_tokens=5).max_think_tokens == 5


def test_overrides_and_round_trip():
    base = ExitConfig()
    assert base.with_overrides(None) is base and base.with_overrides({}) == base
    cfg = base.with_overrides({"method": "progress", "remaining_threshold": 100, "max_think_tokens": 50})
    assert base == ExitConfig()  # not mutated
    assert cfg.remaining_threshold == 100.0 and isinstance(cfg.remaining_threshold, float)
    assert ExitConfig.from_dict(cfg.to_dict()) == cfg
    assert ExitConfig.from_dict({}) == base
    assert cfg.to_dict()["max_think_tokens"] == 50 and cfg.to_dict()["method"] == "progress"
    with pytest.raises(ValueError, match="alpha"):  # overrides are validated too
        base.with_overrides({"alpha": 2})


def test_unknown_override_keys_are_listed_with_the_known_ones():
    with pytest.raises(ValueError) as e:
        ExitConfig().with_overrides({"thresold": 0.5, "alpha": 0.2, "zeta": 1})
    msg = str(e.value)
    assert "thresold" in msg and "zeta" in msg
    for known in ExitConfig().to_dict():
        assert known in msg.split("known keys")[1]
    with pytest.raises(ValueError, match="unknown"):
        ExitConfig.from_dict({"confidence": 0.9})
    with pytest.raises(ValueError, match="object"):
        ExitConfig().with_overrides([("alpha", 0.2)])


# -- tracker: EWMA and rules --------------------------------------------------


def test_smoothing_hand_computed():
    tr = ExitTracker(ExitConfig(alpha=0.5), **IDS)
    assert tr.smoothed() == {}
    seen = []
    for x in (1.0, 0.0, 0.0):
        tr.append(7)
        tr.add_signal((x, 2 * x, 100 * x))
        seen.append(tr.smoothed())
    assert [s["confidence"] for s in seen] == [1.0, 0.5, 0.25]
    assert [s["progress"] for s in seen] == [2.0, 1.0, 0.5]
    assert [s["remaining"] for s in seen] == [100.0, 50.0, 25.0]


def test_exit_at_first_split_token_where_signals_pass():
    d = run([7, 7, 7, 5, 7, 6], [PASS] * 6)
    assert d == ExitDecision(3, "signals", 4, dict(zip(SIGNALS, PASS)))
    # signals still failing at the first split, passing by the second: every split is checked
    conf = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    d = run([7, 5, 7, 5, 7, 7, 6], [(c, 0.9, 10.0) for c in conf], alpha=0.5)
    assert d.index == 6 and d.smoothed["confidence"] == 0.875  # three 1s after 0s: 1 - 1/8
    # no split token, no exit
    assert run([7] * 20, [PASS] * 20) is None


@pytest.mark.parametrize("sig", [(0.8, 0.9, 10.0), (0.95, 0.3, 10.0), (0.95, 0.9, 200.0)])
def test_thresholds_are_strict(sig):
    assert run([7, 5], [sig, sig], alpha=1.0) is None
    nudged = (sig[0] + 1e-9, sig[1] + 1e-9, sig[2] - 1e-6)
    assert run([7, 5], [nudged, nudged], alpha=1.0).index == 1


def test_only_selected_signals_matter():
    sig = (0.0, 0.9, 1e6)  # only progress passes
    assert run([7, 5], [sig, sig], method="progress").index == 1
    assert run([7, 5], [sig, sig], method="progress_confidence") is None
    assert run([7, 5], [sig, sig], method="remain") is None
    sig = (0.0, 0.0, 3.0)  # only remaining passes
    assert run([7, 5], [sig, sig], method="remaining").index == 1


def test_split_tokens_own_signal_is_not_used():
    # the split token's own signal would pass ...
    assert run([7, 7, 5], [FAIL, FAIL, PASS], alpha=1.0) is None
    # ... or would fail: neither changes the outcome
    d = run([7, 7, 5], [FAIL, PASS, FAIL], alpha=1.0)
    assert d.index == 2 and d.smoothed == dict(zip(SIGNALS, PASS))
    # a split token as the very first think token has nothing to judge on
    assert run([5, 7], [PASS, PASS]) is None


def test_no_checks_after_think_end():
    assert run([7, END, 5, 6, 5], [PASS] * 5) is None
    tr = ExitTracker(ExitConfig(max_think_tokens=3), **IDS)
    for tok in (7, END, START, 7, 7, 7, 5):  # <think> after </think> does not reopen thinking
        tr.add_signal(PASS)
        assert tr.append(tok) is None
    assert tr.think_tokens == 1 and not tr.in_think and not tr.exited


def test_checks_start_after_think_start():
    # before <think>: no checks, no counting, no smoothing of signals
    toks = [5, 7, START, 7, 5]
    sigs = [FAIL, FAIL, FAIL, PASS, FAIL]
    tr = ExitTracker(ExitConfig(alpha=0.5), in_think=False, **IDS)
    out = []
    for tok, sig in zip(toks, sigs):
        tr.add_signal(sig)
        out.append(tr.append(tok))
    assert out[:4] == [None] * 4 and tr.in_think
    assert out[4] == ExitDecision(4, "signals", 2, dict(zip(SIGNALS, PASS)))
    assert run(toks, sigs, in_think=False, alpha=0.5) == out[4]


def test_min_think_tokens_delays_exit():
    toks = [7, 5, 7, 5, 7, 5]
    assert run(toks, [PASS] * 6).index == 1
    assert run(toks, [PASS] * 6, min_think_tokens=4).index == 3
    assert run(toks, [PASS] * 6, min_think_tokens=7) is None


def test_max_think_tokens_forces_exit():
    d = run([START, 7, 7, 5], [FAIL] * 4, in_think=False, max_think_tokens=3)
    assert d == ExitDecision(3, "max_think_tokens", 3, {})
    # the budget wins over a signal exit at the same token, and exits at non-split tokens too
    assert run([7, 5], [PASS, PASS], max_think_tokens=2).reason == "max_think_tokens"
    assert run([7, 7, 7], [PASS] * 3, max_think_tokens=2).index == 1
    assert run([7] * 5, [FAIL] * 5, max_think_tokens=6) is None


def test_disabled_never_exits():
    assert run([7, 5, 7, 6] * 5, [PASS] * 20, enabled=False, max_think_tokens=2) is None
    tr = ExitTracker(ExitConfig(enabled=False), **IDS)
    for _ in range(3):
        tr.add_signal(PASS)
        tr.append(5)
    assert tr.think_tokens == 3 and tr.smoothed() == {}


def test_frozen_after_exit():
    tr = ExitTracker(ExitConfig(), **IDS)
    tr.add_signal(PASS)
    tr.append(7)
    tr.add_signal(PASS)
    d = tr.append(5)
    assert tr.exited and tr.decision is d and d.index == 1
    for tok in (5, 7, END, 5):
        tr.add_signal(PASS)
        assert tr.append(tok) is None
    assert tr.decision is d and tr.think_tokens == 2


def test_bad_signals_and_lengths():
    tr = ExitTracker(ExitConfig(), **IDS)
    with pytest.raises(ValueError, match="3 finite"):
        tr.add_signal((0.5, 0.5))
    tr = ExitTracker(ExitConfig(), **IDS)
    with pytest.raises(ValueError, match="3 finite"):
        tr.add_signal((0.5, math.nan, 3.0))
    with pytest.raises(ValueError, match="one signal triple per token"):
        decide([7, 5], [PASS], ExitConfig(), **IDS)


def test_contract_violation_raises_only_when_a_check_needs_the_signals():
    tr = ExitTracker(ExitConfig(), **IDS)
    tr.add_signal(PASS)
    tr.append(7)
    tr.append(7)  # signal of index 0 present; index 1 missing, but nothing is checked yet
    with pytest.raises(RuntimeError, match="token 1"):
        tr.append(5)  # split token 2 needs signals 0 and 1
    # not eligible (min_think_tokens not reached): no error
    tr = ExitTracker(ExitConfig(min_think_tokens=5), **IDS)
    assert tr.append(7) is None and tr.append(5) is None


# -- key property: the decision depends only on the token sequence -----------


def naive_decide(tokens, signals, cfg, in_think=True):
    """Independent eager re-implementation of the rules, as a cross-check of decide()."""
    ewma, think, over = None, 0, False
    for i, (tok, sig) in enumerate(zip(tokens, signals)):
        if over or tok in (START, END):
            in_think = in_think or tok == START
            over = over or tok == END
            continue
        if not in_think or not cfg.enabled:
            continue
        think += 1
        if think == cfg.max_think_tokens:
            return ExitDecision(i, "max_think_tokens", think, {})
        if tok in SPLIT and think >= cfg.min_think_tokens and ewma is not None:
            s = dict(zip(SIGNALS, ewma))
            ok = {
                "confidence": s["confidence"] > cfg.confidence_threshold,
                "progress": s["progress"] > cfg.progress_threshold,
                "remaining": s["remaining"] < cfg.remaining_threshold,
            }
            if all(ok[n] for n in cfg.signals_used):
                return ExitDecision(i, "signals", think, s)
        a = cfg.alpha
        ewma = list(sig) if ewma is None else [a * x + (1 - a) * e for x, e in zip(sig, ewma)]
    return None


def random_case(rng):
    n = rng.randint(10, 80)
    tokens = [rng.choice((5, 6)) if rng.random() < 0.25 else rng.randint(7, 20) for _ in range(n)]
    in_think = rng.random() < 0.8
    if not in_think:
        tokens.insert(rng.randint(0, n // 3), START)
    if rng.random() < 0.3:
        tokens.insert(rng.randint(n // 2, len(tokens)), END)
    conf, rem, signals = rng.random(), rng.uniform(200, 800), []
    for i in range(len(tokens)):  # random walks that drift across the thresholds
        conf = min(1.0, max(0.0, conf + rng.uniform(-0.15, 0.2)))
        rem = max(0.0, rem + rng.uniform(-60, 20))
        signals.append((conf, min(1.0, i / len(tokens) + rng.uniform(-0.2, 0.2)), rem))
    methods = [
        "confidence",
        "progress",
        "remain",
        "confidence_progress",
        "remaining_confidence",
        "confidence_progress_remain",
    ]
    min_think = rng.choice([0, 0, rng.randint(1, 15)])
    cfg = ExitConfig(
        method=rng.choice(methods),
        alpha=rng.choice([0.1, 0.3, 0.5, 1.0]),
        confidence_threshold=rng.uniform(0.3, 0.9),
        progress_threshold=rng.uniform(0.1, 0.7),
        remaining_threshold=rng.uniform(50, 400),
        min_think_tokens=min_think,
        max_think_tokens=rng.choice([None, rng.randint(max(min_think, 5), 60)]),
        enabled=rng.random() < 0.95,
    )
    return tokens, signals, cfg, in_think


def feed_in_rounds(tokens, signals, cfg, in_think, rng):
    """Feed like a speculative engine: rounds of 1..5 accepted tokens; per round the signals
    arrive all up front (with some lookahead), or as late as the contract allows (the last
    one of a round arrives in the next round), or a random mix."""
    tr = ExitTracker(cfg, in_think=in_think, **IDS)
    sent, n, i = 0, len(tokens), 0

    def send_until(k):  # add_signal for every index < k
        nonlocal sent
        while sent < min(k, n):
            tr.add_signal(signals[sent])
            sent += 1

    while i < n:
        end = min(n, i + rng.randint(1, 5))
        mode = rng.choice(("early", "late", "mixed"))
        if mode == "early":
            send_until(end + rng.randint(0, 3))
        for t in range(i, end):
            send_until(t)  # the contract: signals of all indices < t
            if mode == "mixed" and rng.random() < 0.5:
                send_until(t + rng.randint(1, 3))
            d = tr.append(tokens[t])
            if d is not None:
                return d, tr
        i = end
    send_until(n)
    return None, tr


def test_decision_is_independent_of_rounds_and_signal_timing():
    rng = random.Random(1234)
    reasons = {"signals": 0, "max_think_tokens": 0, None: 0}
    for _ in range(400):
        tokens, signals, cfg, in_think = random_case(rng)
        expected = decide(tokens, signals, cfg, in_think=in_think, **IDS)
        assert expected == naive_decide(tokens, signals, cfg, in_think)
        reasons[expected.reason if expected else None] += 1
        for _ in range(5):
            got, tr = feed_in_rounds(tokens, signals, cfg, in_think, rng)
            assert got == expected, (tokens, signals, cfg)
            if got is None:  # same final state too once everything has arrived
                ref = ExitTracker(cfg, in_think=in_think, **IDS)
                for tok, sig in zip(tokens, signals):
                    ref.add_signal(sig)
                    ref.append(tok)
                assert tr.smoothed() == ref.smoothed() and tr.think_tokens == ref.think_tokens
    # the random cases exercise every outcome, and often
    assert min(reasons.values()) >= 40, reasons


def test_fork_is_independent():
    cfg = ExitConfig(method="progress", progress_threshold=0.5)
    tr = ExitTracker(cfg, split_token_ids={5}, think_start_id=1, think_end_id=2)
    for t, v in [(7, (0, 0.9, 0)), (8, (0, 0.9, 0))]:
        tr.add_signal(v)
        assert tr.append(t) is None
    f = tr.fork()
    assert f.append(5) is not None and f.exited
    assert not tr.exited and tr.think_tokens == 2 and tr.smoothed() == f.smoothed()
    assert tr.append(5) is not None  # the original still decides the same way on its own
