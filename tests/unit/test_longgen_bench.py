"""`specexit bench longgen`'s pure parts: the config, the model sets, the length check, rows and ratios, the
measuring loop and the JSON line on fake runners, the CLI's options, the plain-vLLM penalty's window."""

import json
import sys
import types

import pytest

from specexit_app.bench import longgen_bench as lb
from specexit_app.bench import longgen_rows as lr
from specexit_app.bench.longgen_bench import LongGenBenchConfig
from specexit_app.bench.longgen_rows import RunResult, shape_row
from specexit_app.cli import build_parser, cmd_bench_longgen, longgen_bench_config
from specexit_core.longgen.penalty import PenaltyConfig
from specexit_core.toy.paths import DRAFT_DIR, TEACHER_DIR
from specexit_core.typed_config import ConfigError
from support.longgen_keys import PUBLIC_ROW_KEYS

KEYS = PUBLIC_ROW_KEYS | {"backend", "speedup_vs_plain", "drafter_kv_positions"}


# ------------------------------------------------------------------ config
def test_config_defaults_and_normalisation():
    cfg = LongGenBenchConfig(lengths=[448, 128, 128], temperatures=[0.0, 0.6, 0.0])
    assert cfg.lengths == [128, 448] and cfg.temperatures == [0.0, 0.6]
    assert cfg.methods == list(lb.METHODS) and cfg.penalties == ["off", "on"]
    assert cfg.penalty_on() == PenaltyConfig(theta=1.2, window=64)  # the toy's W
    assert LongGenBenchConfig(model_set="long-writer").penalty_on() == PenaltyConfig(theta=1.2, window=1024)
    assert LongGenBenchConfig().lengths == [128, 256, 448]
    assert LongGenBenchConfig(model_set="long-writer").lengths == [1024, 4096, 16384]
    assert LongGenBenchConfig(model_set="long-writer", lengths=[64]).lengths == [64]


@pytest.mark.parametrize(
    "bad",
    [
        {"lengths": []},
        {"lengths": [0, 128]},
        {"temperatures": [-0.1]},
        {"penalties": ["maybe"]},
        {"methods": ["medusa"]},
        {"methods": []},
        {"backends": []},
        {"backends": ["jax"]},
        {"prompts": 0},
        {"ngram_min": 5, "ngram_max": 3},
        {"penalty": {"theta": 1.0, "window": 64}},  # "on" that is off
        {"model_set": "gpt"},
        {"lenghts": [128]},  # a typo is an error
    ],
)
def test_config_rejects(bad):
    with pytest.raises(ValueError):
        LongGenBenchConfig(**bad)


def test_lengths_past_the_models_positions_fail_early_with_the_reason():
    lb.check_lengths([128, 448], [29, 25], 512, "toy")
    with pytest.raises(ConfigError, match=r"lengths \[1024, 16384\].*512 positions.*long-writer"):
        lb.check_lengths([448, 1024, 16384], [29], 512, "toy")


# ------------------------------------------------------------------ model sets
def test_toy_model_set():
    ms = lb.resolve_model_set(LongGenBenchConfig())
    assert (ms.target, ms.draft, ms.heads, ms.max_positions) == (TEACHER_DIR, DRAFT_DIR, None, 512)
    assert ms.train_heads and not ms.skipped and ms.partial_kv.budget == 128


def test_missing_draft_skips_the_vllm_draft_rows_with_a_reason(tmp_path):
    ms = lb.resolve_model_set(LongGenBenchConfig(draft=str(tmp_path / "none")))
    assert set(ms.skipped) == {"eagle3", "vllm_long"} and "--draft" in ms.skipped["eagle3"]
    with pytest.raises(ConfigError, match="--heads"):
        lb.resolve_model_set(LongGenBenchConfig(heads=str(tmp_path / "none")))


def test_torch_backend_alone_skips_the_vllm_rows_with_a_reason():
    ms = lb.resolve_model_set(LongGenBenchConfig(backends=["torch"]))
    assert set(ms.skipped) == {"eagle3", "vllm_long"} and "--backends" in ms.skipped["eagle3"]
    ms = lb.resolve_model_set(LongGenBenchConfig(backends=["vllm"]))
    assert set(ms.skipped) == {"tokenswift"}


def test_long_writer_model_set_plugs_in_by_name(monkeypatch, tmp_path):
    fake = types.ModuleType("specexit_core.teachers.long_writer")
    fake.LONG_WRITER_DIR, fake.LONG_WRITER_HEADS_DIR = TEACHER_DIR, tmp_path / "no_heads"
    monkeypatch.setitem(sys.modules, "specexit_core.teachers.long_writer", fake)
    ms = lb.resolve_model_set(LongGenBenchConfig(model_set="long-writer"))
    assert ms.target == TEACHER_DIR and ms.draft is None and not ms.train_heads
    assert set(ms.skipped) == {"eagle3", "vllm_long", "tokenswift"}  # no draft yet, no heads built
    ms = lb.resolve_model_set(LongGenBenchConfig(model_set="long-writer", draft=str(DRAFT_DIR)))
    assert set(ms.skipped) == {"tokenswift"} and ms.partial_kv.budget == 4096


def test_long_writer_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "specexit_core.teachers.long_writer", None)  # import fails
    with pytest.raises(ConfigError, match="long_writer not available"):
        lb.resolve_model_set(LongGenBenchConfig(model_set="long-writer"))


# ------------------------------------------------------------------ rows and ratios
def _r(tokens, wall, cpu=None, steps=0, drafted=0, accepted=0, kv=0, **extra):
    return RunResult(list(tokens), wall, cpu, steps, drafted, accepted, kv, extra)


def test_shape_row_ratios_and_identity():
    plain = [_r([1, 2, 3, 4], 4.0, 4.0), _r([5, 6, 7, 8], 2.0, 2.0)]
    eng = [_r([1, 2, 3, 4], 1.0, 2.0, 2, 8, 2, 100, ngram=1), _r([5, 6, 7, 8], 2.0, 1.0, 2, 8, 4, 120, ngram=2)]
    row = shape_row("tokenswift", "torch", 4, 0.0, "off", eng, plain)
    assert set(row) >= KEYS
    assert row["speedup_vs_plain"] == pytest.approx(6.0 / 3.0)
    assert row["speedup_vs_plain_cpu"] == pytest.approx(6.0 / 3.0)
    assert row["tokens_per_forward"] == pytest.approx((4 + 6) / 4)  # (verify steps + accepted) / steps
    assert row["acceptance"] == pytest.approx(6 / 16)
    assert row["identical_to_plain"] is True and row["drafter_kv_positions"] == 120 and row["ngram"] == 3
    assert row["distinct_n"] == pytest.approx((4 / 4 + 3 / 3 + 2 / 2 + 1 / 1) / 4)
    other = [_r([1, 2, 3, 9], 1.0), _r([5, 6, 7, 8], 1.0)]
    assert shape_row("eagle3", "vllm", 4, 0.0, "on", other, plain)["identical_to_plain"] is False
    sampled = shape_row("eagle3", "vllm", 4, 0.6, "on", other, plain)
    assert sampled["identical_to_plain"] is None and sampled["cpu_s"] is None
    p = shape_row("plain", "torch", 4, 0.0, "off", plain, plain)
    assert (p["speedup_vs_plain"], p["tokens_per_forward"], p["acceptance"], p["identical_to_plain"]) == (
        1.0,
        1.0,
        None,
        True,
    )
    lone = shape_row("eagle3", "vllm", 4, 0.0, "off", other, None)  # no plain of its backend
    assert lone["speedup_vs_plain"] is None and lone["identical_to_plain"] is None


def _fake_runners(calls):
    """plain torch 2 s, tokenswift 1 s (same tokens), plain vllm 3 s, eagle3 2 s, vllm_long 1 s (same tokens
    greedy); sampled rows draw per seed."""

    def make(name, wall, steps=0):
        def run(p, n, t, seed, pen):
            calls.append(name)
            toks = [(x + (seed if t > 0 else 0) + (7 if pen else 0)) % 50 for x in range(n)]
            return _r(toks, wall, wall if name.endswith("torch") else None, steps, 3 * steps, steps, 0)

        return run

    return {
        ("plain", "torch"): make("plain/torch", 2.0),
        ("tokenswift", "torch"): make("tokenswift/torch", 1.0, 2),
        ("plain", "vllm"): make("plain/vllm", 3.0),
        ("eagle3", "vllm"): make("eagle3/vllm", 2.0, 3),
        ("vllm_long", "vllm"): make("vllm_long/vllm", 1.0, 2),
    }


def test_measure_rows_ratios_and_rotation():
    cfg = LongGenBenchConfig(lengths=[16, 32], temperatures=[0.0, 0.6], prompts=2, repeats=2)
    calls: list[str] = []
    rows = lr.measure(cfg, _fake_runners(calls), [[1, 2], [3, 4]])
    assert len(rows) == 2 * 2 * 2 * 5  # lengths x temperatures x penalties x (method, backend)
    assert len(calls) == len(rows) * 2 * 2  # prompts x repeats per row
    firsts = {calls[i * 5] for i in range(5)}  # every runner goes first once in 5 turns
    assert len(firsts) == 5
    for r in rows:
        assert set(r) >= KEYS
        assert (r["identical_to_plain"] is None) == (r["temperature"] > 0)
    by = {(r["method"], r["backend"], r["length"], r["temperature"], r["penalty"]): r for r in rows}
    assert by[("tokenswift", "torch", 32, 0.0, "on")]["speedup_vs_plain"] == pytest.approx(2.0)
    assert by[("eagle3", "vllm", 32, 0.0, "on")]["speedup_vs_plain"] == pytest.approx(1.5)
    long = by[("vllm_long", "vllm", 32, 0.0, "on")]
    assert long["speedup_vs_plain"] == pytest.approx(3.0) and long["speedup_vs_eagle3"] == pytest.approx(2.0)
    assert long["tokens_per_forward"] == pytest.approx(2.0) and long["acceptance"] == pytest.approx(1 / 3)
    assert by[("plain", "vllm", 16, 0.0, "off")]["torch_vllm_plain_agree"] is True
    assert "torch_vllm_plain_agree" not in by[("plain", "vllm", 16, 0.6, "off")]


def test_targets_need_16k():
    cfg = LongGenBenchConfig(lengths=[16], temperatures=[0.0])
    rows = lr.measure(cfg, _fake_runners([]), [[1, 2]])
    t = lr.targets(rows)
    assert t["tokenswift_speedup_vs_plain_greedy_16k"]["pass"] is None  # 16 tokens: not measurable
    assert t["tokenswift_speedup_vs_plain_greedy_16k"]["value"] == pytest.approx(2.0)
    for r in rows:
        r["length"] = 16384
    t = lr.targets(rows)
    assert t["tokenswift_speedup_vs_plain_greedy_16k"]["pass"] is False  # 2.0 < 2.5
    assert t["vllm_long_speedup_vs_eagle3_greedy_16k"]["pass"] is True  # 2.0 >= 1.3
    assert t["distinct_n_penalty_on"]["required"] == 0.4


def test_main_prints_the_table_then_one_json_line(monkeypatch, capsys):
    cfg = LongGenBenchConfig(lengths=[16], temperatures=[0.0, 0.6], penalties=["off"])

    def fake_run_bench(c):
        rows = lr.measure(c, _fake_runners([]), [[1, 2]])
        return {"rows": rows, "targets": lr.targets(rows), "skipped": {"x": "why"}}

    monkeypatch.setattr(lb, "run_bench", fake_run_bench)
    assert lb.main(cfg, as_json=True, extra={"commit": "abc"}) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].split()[:4] == ["length", "T", "pen", "method"] and "x: skipped (why)" in out
    last = json.loads(out[-1])
    assert list(last)[0] == "rows" and last["commit"] == "abc"
    assert {r["method"] for r in last["rows"]} == set(lb.METHODS)
    assert all(set(r) >= KEYS for r in last["rows"])


def test_vllm_extra_args_per_method():
    cfg = LongGenBenchConfig()
    pen = {"theta": 1.2, "window": 64}
    assert lb.vllm_extra_args("plain", cfg, False) is None
    assert lb.vllm_extra_args("plain", cfg, True) == {"plain_penalty": pen}
    assert lb.vllm_extra_args("eagle3", cfg, False) == {"specexit": False}
    assert lb.vllm_extra_args("eagle3", cfg, True) == {"specexit": False, "long": {"ngram": False, "penalty": pen}}
    long = lb.vllm_extra_args("vllm_long", cfg, True)["long"]
    assert long == {"ngram": True, "ngram_min": 2, "ngram_max": 8, "ngram_policy": "adaptive", "penalty": pen}
    assert "penalty" not in lb.vllm_extra_args("vllm_long", cfg, False)["long"]


# ------------------------------------------------------------------ CLI
def test_cli_options_over_the_config():
    args = build_parser().parse_args(
        ["bench", "longgen", "--json", "--lengths", "448,128", "--temperatures", "0", "--theta", "1.5"]
        + ["--methods", "plain,tokenswift", "--tree-widths", "1,2,1,1", "--ngram-branches", "4"]
    )
    assert args.func is cmd_bench_longgen and args.json
    cfg = longgen_bench_config(args)
    assert cfg.lengths == [128, 448] and cfg.temperatures == [0.0] and cfg.methods == ["plain", "tokenswift"]
    assert cfg.penalty == PenaltyConfig(theta=1.5, window=64)  # window: the toy's
    assert cfg.tree.widths == [1, 2, 1, 1] and cfg.tree.ngram_top_k == 4 and cfg.torch_device == "cpu"
    cuda = build_parser().parse_args(["bench", "longgen", "--torch-device", "cuda"])
    assert longgen_bench_config(cuda).torch_device == "cuda"
    assert longgen_bench_config(build_parser().parse_args(["bench", "longgen"])) == LongGenBenchConfig()


def test_cli_bad_options_exit_2_before_loading_anything(capsys):
    args = build_parser().parse_args(["bench", "longgen", "--lengths", "0"])
    assert cmd_bench_longgen(args) == 2
    assert "lengths must be positive" in capsys.readouterr().err


# ------------------------------------------------------------------ plain vLLM's windowed penalty
def test_plain_penalty_window_context():
    from specexit_app.bench.plain_penalty import window_context

    assert window_context([1, 2, 3], [4, 5], 4) == [2, 3, 4, 5]
    assert window_context([1, 2, 3], [4, 5, 6, 7, 8], 4) == [5, 6, 7, 8]
    assert window_context([1, 2], [], 5) == [1, 2]
    assert window_context([1, 2], [3], 0) == []


# ------------------------------------------------------------------ the report's plots
def test_report_from_the_json_line(tmp_path):
    from pipelines.report.job import main as report_main
    from pipelines.report.longgen import ACCEPTANCE_PLOT, SPEEDUP_PLOT, series

    cfg = LongGenBenchConfig(lengths=[16, 32], temperatures=[0.0, 0.6])
    rows = lr.measure(cfg, _fake_runners([]), [[1, 2]])
    f = tmp_path / "longgen.json"
    f.write_text("table line\n" + json.dumps({"rows": rows, "targets": lr.targets(rows), "skipped": {}}) + "\n")
    s = series(rows, "speedup_vs_plain")
    assert s[(0.0, "on", "vllm_long")] == [(16, pytest.approx(3.0)), (32, pytest.approx(3.0))]
    assert not any(m == "plain" for _, _, m in s)
    assert report_main([str(f), "--out", str(tmp_path / "rep")]) == 0  # python -m pipelines.report FILE
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| 32 | 0.6 | on | vllm_long | vllm |" in md and "not measurable here" in md
    for png in (SPEEDUP_PLOT, ACCEPTANCE_PLOT):
        assert (tmp_path / "rep" / png).stat().st_size > 1000
