"""`specexit bench soak`'s traffic mix and verdicts (serve_app/soak.py) on fake requests and samples: the
fifths, p99 drift and "too short to judge", memory growth after warm-up, the telemetry bound, `pass`."""

import pytest

from serve_app.soak import (
    ABORT_STREAM,
    ABORT_TIMEOUT,
    EFFORT,
    KINDS,
    LONG,
    OFF,
    ON,
    STREAM_OFF,
    TOO_SHORT,
    MemorySamples,
    Result,
    SoakConfig,
    TelemetrySamples,
    check_usage,
    memory_verdict,
    overall,
    p99_verdict,
    request_for,
    summarise,
    telemetry_verdict,
    window_rows,
)
from serve_app.soak_run import role_of
from specexit_core.exit.efforts import EFFORTS

T = 100.0  # traffic seconds: fifths of 20 s
CFG = SoakConfig(minutes=T / 60)


def spread(n: int, lo: float, hi: float, latency, kind: str = ON, status=200) -> list[Result]:
    """n requests started evenly over [lo, hi); latency(i) seconds each."""
    return [Result(kind, lo + (hi - lo) * i / n, latency(i), status, status == 200) for i in range(n)]


def steady(n_per_fifth: int, p99_second: float = 1.0, p99_last: float = 1.0) -> list[Result]:
    """n requests a fifth, latency 0.5 s but for the slowest 2% (the p99) of the second and last fifths."""
    out = []
    for k in range(5):
        tail = {1: p99_second, 4: p99_last}.get(k, 1.0)
        out += spread(n_per_fifth, 20 * k, 20 * (k + 1), lambda i, t=tail: t if i % 50 == 0 else 0.5)
    return out


# -- the traffic ----------------------------------------------------------------------------------------------
def test_every_kind_in_turn_and_every_effort_level():
    reqs = [request_for(i, CFG, ["p1", "p2", "p3"]) for i in range(len(KINDS) * len(EFFORTS))]
    assert [k for k, _, _ in reqs[: len(KINDS)]] == list(KINDS)
    assert [lv for k, lv, _ in reqs if k == EFFORT] == list(EFFORTS)
    body = {k: b for k, _, b in reqs}
    assert body[OFF]["vllm_xargs"] == {"specexit_enabled": 0} and "vllm_xargs" not in body[ON]
    assert body[STREAM_OFF]["stream"] and body[STREAM_OFF]["stream_options"] == {"include_usage": True}
    assert body[ABORT_STREAM]["stream"] and body[ABORT_STREAM]["ignore_eos"]
    assert body[LONG]["vllm_xargs"]["long"] == 1 and body[LONG]["max_tokens"] == CFG.long_tokens
    assert body[EFFORT]["reasoning_effort"] in EFFORTS and not body[ABORT_TIMEOUT].get("stream")


def test_usage_is_checked_per_kind():
    assert check_usage(ON, None, {"enabled": True}) is None
    assert "enabled" in check_usage(OFF, None, {"enabled": True})
    assert check_usage(LONG, None, {"enabled": False, "long": None}) == "no usage.specexit.long"
    assert check_usage(EFFORT, "low", {"enabled": True, "effort": {"effort": "low"}}) is None
    assert "effort" in check_usage(EFFORT, "low", {"enabled": True, "effort": {"effort": "max"}})
    assert check_usage(ON, None, None) == "no usage.specexit"


def test_config_is_validated_before_anything_starts():
    for bad in (
        {"minutes": 0},
        {"minutes": 1, "concurrency": 0},
        {"minutes": 1, "telemetry_segment_bytes": 10},
        {"minutes": 1, "kinds": ("long", "nope")},
        {"minutes": 1, "kinds": ()},
    ):
        with pytest.raises(ValueError):
            SoakConfig(**bad)
    some = SoakConfig(minutes=1, kinds=(LONG, EFFORT))
    assert [request_for(i, some, ["p"])[:2] for i in range(4)] == [
        (LONG, None),
        (EFFORT, "none"),
        (LONG, None),
        (EFFORT, "minimal"),
    ]
    assert SoakConfig(minutes=0.5).traffic_s == 30 and SoakConfig(minutes=0.5).sampling_s() == 0.5
    assert SoakConfig(minutes=20).sampling_s() == 5


# -- p99 ------------------------------------------------------------------------------------------------------
def test_p99_within_and_beyond_1_2x():
    ok = p99_verdict(steady(250, 1.0, 1.15), T)
    assert ok["pass"] is True and ok["p99_ratio"] == pytest.approx(1.15)
    bad = p99_verdict(steady(250, 1.0, 1.3), T)
    assert bad["pass"] is False and bad["p99_ratio"] == pytest.approx(1.3) and "> 1.2" in bad["reason"]


def test_fewer_than_200_timed_requests_in_a_window_is_too_short_to_judge():
    short = p99_verdict(steady(199, 1.0, 5.0), T)
    assert short["pass"] is None and short["p99_ratio"] is None and TOO_SHORT in short["reason"]
    # aborting kinds and failed requests are sent but not timed: 250 requests, 150 timed
    rs = steady(150) + spread(50, 20, 40, lambda i: 0.1, ABORT_STREAM) + spread(50, 20, 40, lambda i: 9, ON, 503)
    rows = window_rows(rs, T)
    assert rows[1]["requests"] == 250 and rows[1]["timed"] == 150
    assert p99_verdict(rs, T)["pass"] is None


def test_windows_by_start_time_and_the_last_fifth_keeps_late_starters():
    rs = [Result(ON, t, 1.0, 200, True) for t in (0.0, 19.99, 20.0, 79.99, 80.0, 99.99, 100.0)]
    assert [w["requests"] for w in window_rows(rs, T)] == [2, 1, 0, 1, 3]


# -- memory ---------------------------------------------------------------------------------------------------
def memory(series: dict[int, tuple[str, list[int | None]]], times: list[float]) -> MemorySamples:
    m = MemorySamples()
    for i, t in enumerate(times):
        m.add(t, {pid: (role, role, s[i]) for pid, (role, s) in series.items() if s[i] is not None})
    return m


def test_memory_growth_is_the_last_fifth_mean_over_the_warmup_end():
    times = [0, 10, 20, 50, 85, 95]
    mb = 2**20
    m = memory(
        {
            1: ("engine", [90 * mb, 100 * mb, 100 * mb, 101 * mb, 103 * mb, 105 * mb]),  # warm-up end 100 -> 104: +4%
            2: ("raylet", [10 * mb, 30 * mb, 30 * mb, 30 * mb, 31 * mb, 31 * mb]),  # +3.3%
            3: ("client", [1 * mb, 1 * mb, 1 * mb, 2 * mb, 2 * mb, 2 * mb]),  # +100%, not judged
            4: ("idle_worker", [None, None, None, 5 * mb, 50 * mb, 50 * mb]),  # started after warm-up
            5: ("ray", [5 * mb, 5 * mb, 5 * mb, None, None, None]),  # exited
        },
        times,
    )
    v = memory_verdict(m, T)
    assert v["pass"] is True and v["memory_growth"] == pytest.approx(0.04)
    assert v["memory_growth_process"] == "engine (pid 1)"
    assert v["started_after_warmup"] == 1 and v["exited_before_last_fifth"] == 1
    assert {p["role"] for p in v["processes"]} == {"engine", "raylet", "client"}
    m.add(99, {1: ("engine", "engine", 120 * mb)})  # last fifth mean (103 + 105 + 120) / 3 = 109.3: +9.3%
    v = memory_verdict(m, T)
    assert v["pass"] is False and v["memory_growth"] == pytest.approx(0.0933, abs=1e-4) and "> 5%" in v["reason"]


def test_memory_without_samples_in_both_spans_or_a_200_request_warmup_is_too_short():
    v = memory_verdict(memory({1: ("engine", [100, 100])}, [30, 50]), T)
    assert v["pass"] is None and v["memory_growth"] is None and TOO_SHORT in v["reason"]
    grown = memory({1: ("engine", [100, 200])}, [10, 90])
    assert memory_verdict(grown, T, warmup_requests=200)["pass"] is False
    short = memory_verdict(grown, T, warmup_requests=199)
    assert short["pass"] is None and "199 requests in the warm-up" in short["reason"]
    assert short["processes"][0]["growth"] == 1.0  # still listed


# -- telemetry ------------------------------------------------------------------------------------------------
def telemetry(sizes: list[int], max_segment: int = 3, streams: int = 2) -> TelemetrySamples:
    tel = TelemetrySamples()
    for i, size in enumerate(sizes):
        tel.add(i * T / len(sizes), size, 2, {("r", "exits", s) for s in range(streams)}, max_segment)
    return tel


def test_telemetry_sawtooth_is_bounded_and_linear_growth_is_not():
    cap = 16384
    saw = [(i % 10) * 2 * cap // 10 for i in range(50)]  # 2 streams, each filling and rolling
    ok = telemetry_verdict(telemetry(saw), T, cap)
    assert ok["pass"] is True and ok["bound_bytes"] == 2 * (2 * cap + 4096)
    assert ok["peak_bytes_last_fifth"] <= ok["peak_bytes_second_fifth"] + 2 * cap
    grows = [i * 2000 for i in range(50)]  # appending forever: past the bound
    bad = telemetry_verdict(telemetry(grows), T, cap)
    assert bad["pass"] is False and "still growing" in bad["reason"]
    slow = [i * 1400 for i in range(50)]  # within two segments a stream, but still growing
    v = telemetry_verdict(telemetry(slow), T, cap)
    assert v["pass"] is False and "still growing" in v["reason"] and max(slow) <= v["bound_bytes"]
    big = [5 * cap] * 50  # flat but above two segments a stream
    assert telemetry_verdict(telemetry(big, streams=1), T, cap)["pass"] is False


def test_telemetry_without_a_roll_is_too_short():
    v = telemetry_verdict(telemetry([100 * i for i in range(50)], max_segment=0), T, 16384)
    assert v["pass"] is None and "segment cap" in v["reason"]


# -- pass -----------------------------------------------------------------------------------------------------
def test_pass_is_false_on_any_failure_null_when_only_unjudged_true_when_all_pass():
    p, f, n = {"pass": True, "reason": "ok"}, {"pass": False, "reason": "bad"}, {"pass": None, "reason": TOO_SHORT}
    assert overall({"a": p, "b": p}) == (True, [])
    assert overall({"a": p, "b": n}) == (None, [f"b: {TOO_SHORT}"])
    assert overall({"a": f, "b": n})[0] is False


def test_summary_keys_and_a_short_run():
    rs = steady(50) + [Result(ON, 30, 0.2, 503, False), Result(STREAM_OFF, 40, 0.1, "error:ReadError", False)]
    mem = memory({1: ("engine", [100, 100, 100])}, [10, 50, 90])
    res = summarise(CFG, rs, mem, telemetry([1000] * 50, max_segment=0), T)
    assert list(res)[:6] == ["pass", "memory_growth", "p99_ratio", "errors_5xx", "requests", "minutes"]
    assert res["errors_5xx"] == 1 and res["errors_other"] == 1 and res["requests"] == 252
    assert res["pass"] is False and res["p99_ratio"] is None and res["memory_growth"] is None  # 50 in warm-up
    assert summarise(CFG, steady(200), mem, telemetry([1000] * 50), T)["memory_growth"] == 0
    assert res["verdicts"]["p99"]["pass"] is None and any(TOO_SHORT in r for r in res["reasons"])
    clean = summarise(CFG, steady(50), mem, telemetry([1000] * 50, max_segment=0), T)
    assert clean["pass"] is None and clean["errors_5xx"] == 0  # nothing failed, but too short: no pass claimed
    assert clean["kinds"][ON]["sent"] == 250 and clean["kinds"][EFFORT]["levels"]["max"] == 0


def test_process_roles_by_title():
    assert role_of(7, 7, ["python", "-m", "specexit_app.cli"]) == "client"
    assert role_of(8, 7, ["VLLM::EngineCore"]) == "engine"
    assert role_of(8, 7, ["ray::ServeReplica:soak:SpecExitLLMServer:specexit-soak"]) == "replica"
    assert role_of(8, 7, ["ray::ServeReplica:soak:SpecExitIngress"]) == "ingress"
    assert role_of(8, 7, ["/x/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/x"]) == "raylet"
    assert role_of(8, 7, ["/x/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp"]) == "gcs"
    assert role_of(8, 7, ["python", "-u", "agent.py", "--raylet-name=x"]) == "ray"  # not the raylet
    assert role_of(8, 7, ["ray::IDLE"]) == "idle_worker"


def test_the_progress_line_counts_5xx_apart_from_other_failures():
    from serve_app.soak import Result
    from serve_app.soak_run import progress_line

    rs = [
        Result("specexit_on", 1.0, 0.5, 200, True),
        Result("stream_on", 2.0, 0.5, 503, False, problem="5xx"),
        Result("long", 3.0, 0.5, 400, False, problem="4xx"),
    ]
    assert progress_line(rs, 60.0, 1200.0) == "soak: 1.0 / 20 min, 3 requests (0.1/s), 1 5xx, 1 failed otherwise"
