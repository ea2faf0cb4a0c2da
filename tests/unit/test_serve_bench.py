"""`specexit bench serve` row logic with fake measurements: the ratio, the engine time per request, CPU per
request by role (outside the engine = every role but the engine and the client), the CPU the Serve path adds,
the same-work check; process roles from titles; the CLI's options reach the config."""

import pytest

from serve_app.serve_bench import Measured, build_rows, cpu_by_role, role_of, summary_line


def _m(path, c, n, wall, cpu, completion=256):
    return Measured(path, c, wall, [wall / n * c] * n, [20] * n, [completion] * n, cpu, load_average=1.5)


def test_rows_ratio_engine_time_and_cpu():
    direct = _m("direct", 16, 64, 8.0, {"engine": 16.0, "frontend": 0.32})
    serve = _m("serve", 16, 64, 10.0, {"engine": 17.0, "client": 0.64, "proxy": 0.32, "ingress": 0.16, "replica": 0.64})
    rows = build_rows([direct, serve])
    d, s = rows
    assert d["path"] == "direct" and d["requests_per_s"] == 8.0 and d["tokens_per_s"] == 2048.0
    assert d["engine_ms_per_request"] == 125.0 == s["engine_ms_per_request"]  # 8 s / 64 requests
    assert "ratio_vs_direct" not in d
    assert s["ratio_vs_direct"] == 0.8  # 6.4 / 8 req/s
    assert d["outside_engine_cpu_ms_per_request"] == 5.0  # the in-process front end
    assert s["outside_engine_cpu_ms_per_request"] == 17.5  # proxy + ingress + replica, not the client
    assert s["cpu_ms_per_request"]["client"] == 10.0 and s["engine_cpu_ms_per_request"] == 265.62
    assert s["added_cpu_ms_per_request"] == 12.5
    assert s["same_engine_work"] is True
    assert "ratio 0.800" in summary_line(s) and "engine   125.0 ms/req" in summary_line(d)


def test_rows_per_concurrency_and_different_work_flagged():
    rows = build_rows(
        [
            _m("direct", 1, 4, 2.0, {"engine": 4.0}),
            _m("direct", 16, 32, 4.0, {"engine": 8.0}),
            _m("serve", 1, 4, 2.5, {"engine": 4.0}),
            _m("serve", 16, 32, 5.0, {"engine": 8.0}, completion=255),  # a request stopped early
        ]
    )
    by = {(r["path"], r["concurrency"]): r for r in rows}
    assert by["serve", 1]["ratio_vs_direct"] == 0.8 and by["serve", 1]["engine_ms_per_request"] == 500.0
    assert by["serve", 16]["engine_ms_per_request"] == 125.0
    assert by["serve", 1]["same_engine_work"] is True and by["serve", 16]["same_engine_work"] is False


def test_rounds_are_pooled_and_each_round_has_its_ratio():
    ms = []
    for rnd, (dw, sw) in enumerate([(4.0, 5.0), (8.0, 8.0)]):  # round 1 ran under load: both paths slower
        d, s = _m("direct", 16, 32, dw, {"engine": dw}), _m("serve", 16, 32, sw, {"engine": sw, "replica": 0.32})
        d.extra["round"] = rnd
        s.extra.update(round=rnd, variant="default")
        ms += [d, s]
    d, s = build_rows(ms)
    assert (d["rounds"], d["requests"], d["wall_s"], s["requests"], s["wall_s"]) == (2, 64, 12.0, 64, 13.0)
    assert s["ratio_by_round"] == [0.8, 1.0] and s["ratio_vs_direct"] == 0.923  # pooled: 12 s / 13 s
    assert s["cpu_ms_per_request"]["replica"] == 10.0 and s["variant"] == "default" and "round" not in s
    assert d["engine_ms_per_request"] == 187.5 and s["same_engine_work"] is True


def test_serve_rows_without_direct_have_no_ratio():
    (r,) = build_rows([_m("serve", 16, 16, 2.0, {"engine": 1.0})])
    assert "ratio_vs_direct" not in r and "engine_ms_per_request" not in r


def test_cpu_by_role_sums_deltas_and_counts_new_processes_whole():
    before = {1: ("client", 10.0), 2: ("engine", 100.0), 3: ("replica", 5.0)}
    after = {1: ("client", 10.5), 2: ("engine", 130.0), 3: ("replica", 6.0), 4: ("replica", 0.25)}
    assert cpu_by_role(before, after) == {"client": 0.5, "engine": 30.0, "replica": 1.25}


@pytest.mark.parametrize(
    ("title", "role"),
    [
        ("VLLM::EngineCore", "engine"),
        ("VLLM::Worker_TP0", "engine"),
        ("ray::ProxyActor", "proxy"),
        ("ray::ServeReplica:bench:SpecExitIngress", "ingress"),
        ("ray::ServeReplica:bench:SpecExitLLMServer:long-writer", "replica"),
        ("ray::ServeController", "controller"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x", "ray"),
    ],
)
def test_roles_from_process_titles(title, role):
    assert role_of(title, pid=7, me=1, me_role="client") == role
    assert role_of(title, pid=1, me=1, me_role="frontend") == "frontend"  # this process: its own role


def test_cli_options_reach_the_config(monkeypatch):
    import serve_app.serve_bench_run as run
    from specexit_app.cli import main

    seen = {}
    monkeypatch.setattr(run, "main", lambda cfg, **kw: seen.update(cfg=cfg, **kw) or 0)
    argv = ["bench", "serve", "--model-set", "toy", "--concurrency", "1,4", "--requests", "2,8", "--max-tokens", "9"]
    assert main(argv) == 0
    cfg = seen["cfg"]
    assert (cfg.model_set, cfg.concurrency, cfg.requests, cfg.resolved_max_tokens()) == ("toy", (1, 4), (2, 8), 9)
    assert cfg.serve_variants == (("default", ()),) and cfg.rounds == 2  # one Serve run a round, no extra env
    assert {"command", "commit", "machine", "date"} <= set(seen["extra"])
    assert main(["bench", "serve", "--serve-variant", "default:", "--serve-variant", "t:A=1,B=x=y"]) == 0
    assert seen["cfg"].serve_variants == (("default", ()), ("t", (("A", "1"), ("B", "x=y"))))


def test_each_serve_variant_is_compared_with_the_direct_row():
    a, b = _m("serve", 16, 64, 10.0, {"engine": 1.0}), _m("serve", 16, 64, 9.0, {"engine": 1.0})
    a.extra["variant"], b.extra["variant"] = "default", "throughput"
    rows = build_rows([_m("direct", 16, 64, 8.0, {"engine": 1.0}), a, b])
    assert [(r.get("variant"), r.get("ratio_vs_direct")) for r in rows] == [
        (None, None),
        ("default", 0.8),
        ("throughput", 0.889),
    ]
    assert summary_line(rows[2]).count("[throughput]") == 1
