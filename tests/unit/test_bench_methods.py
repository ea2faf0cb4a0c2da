"""The benches' shared parts (bench/methods.py) and the reference bench's loop on a fake engine."""

import json

import pytest

from specexit_app.bench.methods import METHODS, method_row, print_table, ratios, rotated
from specexit_app.bench.reference_bench import generated_tokens, measure, method_exit_configs
from specexit_app.cli import build_parser
from specexit_core.engine.types import AcceptanceStats, GenerationResult
from specexit_core.exit import NEVER_FIRES, ExitConfig


def test_rotation_gives_every_method_every_slot():
    orders = [rotated(METHODS, i) for i in range(3)]
    assert orders[0] == list(METHODS)
    for slot in range(3):
        assert {o[slot] for o in orders} == set(METHODS)


def _row(lat, think, acc_texts=("answer is 3",), c16=(1.0,)):
    return method_row(acc_texts, [3], [think], [think + 5], [lat], list(c16), 2.5)


def test_ratios_from_rows():
    methods = {"eagle3": _row(2.0, 90), "specexit_never_fires": _row(2.2, 90), "specexit": _row(1.0, 30, c16=(0.5,))}
    r = ratios(methods)
    assert r["speedup_c1_specexit_vs_eagle3"] == pytest.approx(2.0)
    assert r["speedup_c16_specexit_vs_eagle3"] == pytest.approx(2.0)
    assert r["think_tokens_specexit_vs_eagle3"] == pytest.approx(1 / 3)
    assert r["overhead_never_fires_vs_eagle3_c1"] == pytest.approx(0.1)
    assert r["accuracy_delta_points"] == 0
    no_waves = {m: _row(1.0, 10, c16=()) for m in METHODS}
    assert no_waves["eagle3"]["latency_s_c16"] is None
    assert ratios(no_waves)["speedup_c16_specexit_vs_eagle3"] is None


def test_print_table_handles_missing_figures(capsys):
    methods = {m: _row(1.0, 10, c16=()) for m in METHODS}
    print_table({"methods": methods, "ratios": ratios(methods)})
    out = capsys.readouterr().out
    assert "specexit_never_fires" in out and "speedup_c16_specexit_vs_eagle3" in out


class FakeEngine:
    """Answers every prompt with `think` think tokens; an exit config with a threshold below 1
    halves them. Records the exit settings it was asked for."""

    def __init__(self, k=3):
        self.k, self.seen = k, []

    def generate(self, reqs):
        out = []
        for r in reqs:
            self.seen.append(r.exit)
            think = 40 if r.exit is not None and r.exit.confidence_threshold < 1 else 80
            ids = [7] * think + [269, 1, 2]
            out.append(
                GenerationResult(
                    token_ids=ids,
                    text=f"The answer is {r.prompt_ids[0]} .",
                    think_tokens=think,
                    exit=None,
                    stats=AcceptanceStats(rounds=10, drafted=30, accepted=15),
                    finish_reason="stop",
                )
            )
        return out


def test_reference_measure_rows_and_counts():
    stock, spec = FakeEngine(), FakeEngine()
    cfgs = method_exit_configs(None, None)
    engines = {"eagle3": (stock, None), **{m: (spec, cfgs[m]) for m in ("specexit_never_fires", "specexit")}}
    res = measure(engines, [[3], [4]], [3, 5], max_tokens=100)
    assert list(res) == ["eagle3", "specexit_never_fires", "specexit"]
    for m in res.values():
        assert set(m) == {"accuracy", "think_tokens", "latency_s", "latency_s_c16", "tokens", "acceptance_length"}
        assert m["accuracy"] == 0.5 and m["latency_s_c16"] is None
        assert m["acceptance_length"] == pytest.approx(1 + 15 / 10)  # 30 drafted / k=3 = 10 drafting rounds
    assert res["eagle3"]["think_tokens"] == res["specexit_never_fires"]["think_tokens"] == 80
    assert res["specexit"]["think_tokens"] == 40  # the paper's thresholds < 1: the fake exits
    assert res["eagle3"]["tokens"] == 80 + 3 + 1  # EOS counted, as vLLM counts it
    assert len(stock.seen) == 1 + 2 and len(spec.seen) == 2 * (1 + 2)  # a warm-up + every prompt


def test_exit_configs_resolve_like_the_plugin(tmp_path):
    draft_defaults = {"method": "confidence", "confidence_threshold": 0.6}
    cfgs = method_exit_configs(draft_defaults, None)
    assert cfgs["specexit"] == ExitConfig(method="confidence", confidence_threshold=0.6)
    assert cfgs["specexit_never_fires"] == ExitConfig(**NEVER_FIRES)
    cal = tmp_path / "calibrated.json"
    cal.write_text(json.dumps({"exit": {"confidence_threshold": 0.5, "alpha": 0.3}, "calibration": {}}))
    assert method_exit_configs(draft_defaults, str(cal))["specexit"] == ExitConfig(
        method="confidence", confidence_threshold=0.5, alpha=0.3
    )
    assert generated_tokens(GenerationResult([1, 2], "", 0, None, finish_reason="length")) == 2


def test_bench_reference_cli_flags():
    args = build_parser().parse_args(["bench", "reference", "--n", "7", "--json", "--exit-config", "x.json"])
    assert (args.n, args.json, args.exit_config) == (7, True, "x.json")
    assert args.func.__name__ == "cmd_bench_reference"
