"""`specexit bench soak` as a user runs it, at CI's size (15 s of traffic): its own Ray cluster and Serve with
the toy app on two engine replicas, every traffic kind sent and answered, no 5xx, the RSS of every process
role and the telemetry folder's size sampled, the JSON line last. Too short to judge the p99 (and the
memory): `pass` is null, never a claimed pass, and the command exits 0. The verdicts' math is in
tests/unit/test_soak_verdicts.py; the telemetry bound in tests/unit/test_telemetry_segments.py."""

import json

import pytest

from serve_app.soak import KINDS, TOO_SHORT
from specexit_core.exit.efforts import EFFORTS
from support.cli import run_json, specexit

pytestmark = [pytest.mark.vllm, pytest.mark.slow(minutes=2)]

ROLES = {"client", "engine", "replica", "ingress", "proxy", "controller", "raylet", "gcs"}


def test_a_short_soak_runs_every_kind_and_says_it_is_too_short():
    p, res = run_json(specexit("bench", "soak", "--minutes", "0.25", "--json"), timeout=600)
    assert json.loads(p.stdout.strip().splitlines()[-1]) == res  # the last line is the JSON
    assert list(res)[:6] == ["pass", "memory_growth", "p99_ratio", "errors_5xx", "requests", "minutes"]
    assert res["minutes"] == 0.25 and res["requests"] >= 2 * len(KINDS)
    assert res["setup"]["replicas"] == res["setup"]["replicas_running_at_end"] == 2
    # every kind sent and answered as it asks (aborts: hung up after the first chunk / the client timeout)
    for kind in KINDS:
        row = res["kinds"][kind]
        assert row["sent"] > 0 and row["ok"] == row["sent"], (kind, row)
    # the effort requests take the levels in turn: on a slow machine 15 s may send fewer than there are levels
    effort = res["kinds"]["effort"]
    assert [lv for lv in EFFORTS if effort["levels"].get(lv)] == list(EFFORTS[: min(effort["sent"], len(EFFORTS))]), (
        effort
    )
    assert res["errors_5xx"] == 0 and res["errors_other"] == 0
    assert res["verdicts"]["errors_5xx"]["pass"] is True
    # too short to judge: no pass claimed
    assert res["p99_ratio"] is None and res["verdicts"]["p99"]["pass"] is None
    assert TOO_SHORT in res["verdicts"]["p99"]["reason"] and res["pass"] is None
    assert any(TOO_SHORT in r for r in res["reasons"])
    # memory sampled for every role, both replicas and both engines
    mem = res["memory"]
    assert set(mem["by_role"]["mb"]) >= ROLES and len(mem["by_role"]["t_s"]) >= 10
    roles = [p["role"] for p in mem["processes"]]
    assert set(roles) >= ROLES and roles.count("engine") == 2 and roles.count("replica") == 2
    assert all(p["rss_warmup_mb"] > 0 for p in mem["processes"])
    # the telemetry folder measured: one exits stream per replica at least, its size over time
    tel = res["telemetry"]
    assert tel["streams"] >= 2 and tel["segment_bytes"] == 16384 and tel["bound_bytes"] > 0
    assert len(tel["samples"]) >= 10 and max(s[1] for s in tel["samples"]) > 0
