"""`specexit bench soak`: the Serve app under steady mixed traffic for N minutes, and whether it holds
(issue #43 item 6). The run itself is serve_app/soak_run.py; this module is its config, its traffic mix
and its verdicts, pure (tests/unit/test_soak_verdicts.py drives them with fake samples).

The run is cut into fifths of its traffic time T, by each request's start time; the first fifth is the
warm-up. The verdicts:

* memory: every process of the local cluster (this process's descendants: raylet, GCS, Serve's
  controller, proxy and ingress, both engine replicas, their vLLM engine cores, Ray's other processes)
  has its RSS sampled every few seconds. A process's growth is the mean of its samples in the last fifth
  over its RSS at the end of the warm-up (its last sample at or before T/5), minus 1. `memory_growth` is
  the largest over the processes alive at both points; it passes at <= 5%. This process (the load
  generator, role `client`) is reported, not judged. Too short to judge (`memory_growth` null, each
  process's growth still listed) when the warm-up held fewer than 200 requests, the p99 windows' rule: in
  a run that short the engines are still touching their KV cache for the first time after the warm-up.
* p99: the p99 latency of the requests started in the last fifth over that of the second fifth
  (`p99_ratio`), passes at <= 1.2. Latency counts the requests that ran to the end (status 200, the
  aborting kinds left out: the client chose their length). With fewer than 200 such requests in either
  window the ratio is null and the verdict "too short to judge".
* errors_5xx: HTTP 5xx answers, an error event inside a 200 stream with a 5xx code included; passes at 0.
  The default concurrency keeps the app far from its backpressure limits, so an overload 503 is a failure.
* errors_other: a request that failed otherwise (4xx, a dropped connection, a client timeout on a kind that
  does not abort, an answer without its `usage.specexit` fields); passes at 0. Not in the issue's list:
  a request the server never answered is no pass either.
* telemetry: the SpecExit telemetry folder (every replica's exit, fallback and long-mode event files,
  serve_app/telemetry.py) is measured with the memory. It stays bounded when (a) after the warm-up its size
  never exceeds the design bound, two segments per stream (the one being written and the finished one the
  replica has not read yet; a stream is one engine process's exits, fallbacks or long events) plus 4 KiB,
  and (b) it stops growing: its peak in the last fifth is at most its peak in the second fifth plus one
  segment per stream (a segment filling up). The soak sets a small segment cap (16 KiB) so streams roll
  many times; with no roll seen the run is too short to judge (nothing was ever deleted).

`pass`: false when any verdict fails, null when none fails but one was too short to judge (the
`reasons` say which: "too short to judge"), true when all pass. The command exits 1 when `pass` is false.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from serve_app.bench import percentile
from specexit_core.exit.efforts import EFFORTS
from specexit_core.typed_config import StrictModel

MODEL_ID = "specexit-soak"
APP_NAME = "soak"
MIN_WINDOW_REQUESTS = 200  # each p99 window
MAX_MEMORY_GROWTH = 0.05
MAX_P99_RATIO = 1.2
TOO_SHORT = "too short to judge"
CLIENT_ROLE = "client"

# The traffic mix, one kind after the other (request i is kinds[i % len(kinds)]).
ON, OFF, STREAM_ON, STREAM_OFF = "specexit_on", "specexit_off", "stream_on", "stream_off"
ABORT_STREAM, ABORT_TIMEOUT, LONG, EFFORT = "abort_stream", "abort_timeout", "long", "effort"
KINDS = (ON, OFF, STREAM_ON, STREAM_OFF, ABORT_STREAM, ABORT_TIMEOUT, LONG, EFFORT)
ABORTING = (ABORT_STREAM, ABORT_TIMEOUT)  # the client hangs up: not in the latency windows
SPECEXIT_OFF = {"specexit_enabled": 0}
LONG_XARGS = {"specexit_enabled": 0, "long": 1, "long_penalty_theta": 1.2, "long_penalty_window": 64}


class SoakConfig(StrictModel):
    minutes: float = Field(gt=0, le=24 * 60)  # traffic time; fractions allowed (0.5 = 30 s)
    concurrency: int = Field(8, ge=1, le=64)  # clients, each sending one request after the other
    replicas: int = Field(2, ge=1, le=8)  # engine replicas (autoscaling min = max)
    max_tokens: int = Field(300, ge=16, le=480)  # per request (the toy's 512 positions)
    long_tokens: int = Field(160, ge=16, le=400)  # the long kind's generation (ignore_eos)
    abort_timeout_s: float = Field(0.1, gt=0, le=10)  # the abort_timeout kind's client read timeout
    request_timeout_s: float = Field(120, gt=0)  # any other request's client timeout
    sample_s: float | None = Field(None, gt=0)  # memory / telemetry sampling (None: T/60 in [0.5, 5] s)
    telemetry_segment_bytes: int = Field(16384, ge=16384)  # the app's event-file segment cap
    num_cpus: int = Field(8, ge=1)  # logical CPUs of the local Ray cluster (each replica's engine takes 1)
    kinds: tuple[str, ...] = KINDS  # the mix, sent in turn (a subset: to find which kind a problem follows)
    seed: int = 7

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [k for k in v if k not in KINDS]
        if bad or not v:
            raise ValueError(f"kinds must be a non-empty subset of {', '.join(KINDS)}; got {list(v)}")
        return tuple(v)

    @property
    def traffic_s(self) -> float:
        return 60 * self.minutes

    def sampling_s(self) -> float:
        return self.sample_s or min(5.0, max(0.5, self.traffic_s / 60))


def app_args(cfg: SoakConfig, telemetry_dir: str) -> dict:
    """serve_app/toy_cpu.yaml's args (auth off), `replicas` engine replicas, the telemetry folder and cap."""
    from serve_app.serve_bench import app_args as toy_args

    args = toy_args("toy")
    args["model"] = {**args["model"], "id": MODEL_ID}
    n = cfg.replicas
    args["autoscaling"] = {**args.get("autoscaling", {}), "min_replicas": n, "max_replicas": n, "initial_replicas": n}
    args["specexit"] = {
        **args.get("specexit", {}),
        "telemetry_dir": telemetry_dir,
        "telemetry_segment_bytes": cfg.telemetry_segment_bytes,
    }
    return args


# -- the traffic --------------------------------------------------------------------------------------------
def request_for(i: int, cfg: SoakConfig, prompts: list[str]) -> tuple[str, str | None, dict]:
    """(kind, effort level or None, chat body) of request i."""
    kind = cfg.kinds[i % len(cfg.kinds)]
    body: dict[str, Any] = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
        "max_tokens": cfg.max_tokens,
        "temperature": 0,
    }
    level = None
    if kind == OFF:
        body["vllm_xargs"] = dict(SPECEXIT_OFF)
    elif kind in (STREAM_ON, STREAM_OFF, ABORT_STREAM):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if kind == STREAM_OFF:
            body["vllm_xargs"] = dict(SPECEXIT_OFF)
        if kind == ABORT_STREAM:  # long enough that the client hangs up mid-generation
            body.update(ignore_eos=True, vllm_xargs=dict(SPECEXIT_OFF))
    elif kind == ABORT_TIMEOUT:
        body["ignore_eos"] = True
    elif kind == LONG:
        body.update(max_tokens=cfg.long_tokens, ignore_eos=True, vllm_xargs=dict(LONG_XARGS))
    elif kind == EFFORT:
        level = EFFORTS[(i // len(cfg.kinds)) % len(EFFORTS)]
        body["reasoning_effort"] = level
    return kind, level, body


def check_usage(kind: str, level: str | None, specexit: dict | None) -> str | None:
    """Why an answer's `usage.specexit` is not what its kind asked for, or None."""
    if not isinstance(specexit, dict):
        return "no usage.specexit"
    want_enabled = {ON: True, OFF: False, STREAM_ON: True, STREAM_OFF: False, LONG: False, EFFORT: True}
    if kind in want_enabled and specexit.get("enabled") is not want_enabled[kind]:
        return f"usage.specexit.enabled {specexit.get('enabled')!r}"
    if kind == LONG and not specexit.get("long"):
        return "no usage.specexit.long"
    if kind == EFFORT and (specexit.get("effort") or {}).get("effort") != level:
        return f"usage.specexit.effort {specexit.get('effort')!r} for {level}"
    return None


@dataclass
class Result:
    """One request: start (s since the traffic began), latency (s), status (HTTP code, or a word:
    `client_timeout`, `error:<exception>`), whether it did what its kind asks (`ok`) and why not."""

    kind: str
    start_s: float
    latency_s: float
    status: int | str
    ok: bool
    level: str | None = None
    problem: str | None = None


def is_5xx(status: int | str) -> bool:
    return isinstance(status, int) and status >= 500


# -- the verdicts ---------------------------------------------------------------------------------------------
def fifth_bounds(traffic_s: float) -> list[tuple[float, float]]:
    step = traffic_s / 5
    return [(k * step, (k + 1) * step) for k in range(5)]


def window(results: list[Result], lo: float, hi: float, last: bool = False) -> list[Result]:
    return [r for r in results if lo <= r.start_s < hi or (last and r.start_s >= hi)]


def timed(results: list[Result]) -> list[float]:
    """Latencies that count: requests that ran to the end."""
    return [r.latency_s for r in results if r.kind not in ABORTING and r.status == 200 and r.ok]


def window_rows(results: list[Result], traffic_s: float) -> list[dict]:
    rows = []
    for k, (lo, hi) in enumerate(fifth_bounds(traffic_s)):
        w = window(results, lo, hi, last=k == 4)
        lat = timed(w)
        rows.append(
            {
                "fifth": k + 1,
                "start_s": round(lo, 1),
                "end_s": round(hi, 1),
                "requests": len(w),
                "timed": len(lat),
                "p50_s": round(percentile(lat, 0.5), 4) if lat else None,
                "p99_s": round(percentile(lat, 0.99), 4) if lat else None,
            }
        )
    return rows


def p99_verdict(results: list[Result], traffic_s: float) -> dict:
    rows = window_rows(results, traffic_s)
    second, last = rows[1], rows[4]
    if min(second["timed"], last["timed"]) < MIN_WINDOW_REQUESTS:
        why = f"{TOO_SHORT}: {second['timed']} / {last['timed']} timed requests in the second / last fifth"
        return {"pass": None, "p99_ratio": None, "reason": f"{why} (at least {MIN_WINDOW_REQUESTS} each)"}
    ratio = last["p99_s"] / second["p99_s"]
    ok = ratio <= MAX_P99_RATIO
    return {
        "pass": ok,
        "p99_ratio": round(ratio, 3),
        "reason": f"p99 last fifth {last['p99_s']:.3f} s / second fifth {second['p99_s']:.3f} s = {ratio:.3f} "
        f"({'<=' if ok else '>'} {MAX_P99_RATIO})",
    }


@dataclass
class MemorySamples:
    """RSS samples: times (s since the traffic began) and per sample {pid: bytes}; each pid's role and title."""

    t: list[float] = field(default_factory=list)
    rss: list[dict[int, int]] = field(default_factory=list)
    roles: dict[int, str] = field(default_factory=dict)
    titles: dict[int, str] = field(default_factory=dict)

    def add(self, t: float, procs: dict[int, tuple[str, str, int]]) -> None:
        """procs: pid -> (role, title, rss bytes)."""
        self.t.append(t)
        self.rss.append({pid: rss for pid, (_, _, rss) in procs.items()})
        for pid, (role, title, _) in procs.items():
            self.roles[pid], self.titles[pid] = role, title


def memory_verdict(mem: MemorySamples, traffic_s: float, warmup_requests: int | None = None) -> dict:
    """Growth per process after the warm-up (module docstring); too short to judge when the warm-up held
    fewer than 200 requests (`warmup_requests`; the p99 windows' rule): the engines are still touching
    their KV cache for the first time then, and a few seconds of a small process's RSS are noise."""
    warm_end, last_start = traffic_s / 5, 4 * traffic_s / 5
    warm = [i for i, t in enumerate(mem.t) if t <= warm_end]
    last = [i for i, t in enumerate(mem.t) if t >= last_start]
    procs, started, exited = [], 0, 0
    for pid in sorted(mem.roles):
        ref = next((mem.rss[i][pid] for i in reversed(warm) if pid in mem.rss[i]), None)
        ends = [mem.rss[i][pid] for i in last if pid in mem.rss[i]]
        if ref is None:
            started += 1 if ends else 0
            continue
        if not ends:
            exited += 1
            continue
        end = statistics.mean(ends)
        procs.append(
            {
                "pid": pid,
                "role": mem.roles[pid],
                "title": mem.titles[pid][:120],
                "rss_warmup_mb": round(ref / 2**20, 1),
                "rss_last_fifth_mb": round(end / 2**20, 1),
                "growth": round(end / ref - 1, 4),
            }
        )
    procs.sort(key=lambda p: -p["growth"])
    judged = [p for p in procs if p["role"] != CLIENT_ROLE]
    out: dict[str, Any] = {
        "processes": procs,
        "started_after_warmup": started,
        "exited_before_last_fifth": exited,
    }
    if not warm or not last or not judged:
        why = f"{TOO_SHORT}: no process sampled both in the warm-up and in the last fifth"
        return {**out, "pass": None, "memory_growth": None, "reason": why}
    if warmup_requests is not None and warmup_requests < MIN_WINDOW_REQUESTS:
        why = f"{TOO_SHORT}: {warmup_requests} requests in the warm-up (at least {MIN_WINDOW_REQUESTS})"
        return {**out, "pass": None, "memory_growth": None, "reason": why}
    worst = judged[0]
    ok = worst["growth"] <= MAX_MEMORY_GROWTH
    return {
        **out,
        "pass": ok,
        "memory_growth": worst["growth"],
        "memory_growth_process": f"{worst['role']} (pid {worst['pid']})",
        "reason": f"largest RSS growth after warm-up {100 * worst['growth']:+.1f}% ({worst['role']}, pid "
        f"{worst['pid']}) {'<=' if ok else '>'} {100 * MAX_MEMORY_GROWTH:.0f}%",
    }


def memory_by_role(mem: MemorySamples) -> dict:
    """RSS summed by role at every sample (MiB): the run's memory over time, compactly."""
    roles = sorted(set(mem.roles.values()))
    return {
        "t_s": [round(t, 1) for t in mem.t],
        "mb": {
            role: [round(sum(v for pid, v in s.items() if mem.roles[pid] == role) / 2**20, 1) for s in mem.rss]
            for role in roles
        },
    }


@dataclass
class TelemetrySamples:
    """The telemetry folder over time: (t, total bytes, files); streams seen; the highest segment number."""

    samples: list[tuple[float, int, int]] = field(default_factory=list)
    streams: set = field(default_factory=set)
    max_segment: int = 0

    def add(self, t: float, size: int, files: int, streams: set, max_segment: int) -> None:
        self.samples.append((t, size, files))
        self.streams |= streams
        self.max_segment = max(self.max_segment, max_segment)


def telemetry_verdict(tel: TelemetrySamples, traffic_s: float, segment_bytes: int) -> dict:
    bounds = fifth_bounds(traffic_s)
    after = [s for t, s, _ in tel.samples if t >= bounds[0][1]]
    second = [s for t, s, _ in tel.samples if bounds[1][0] <= t < bounds[1][1]]
    last = [s for t, s, _ in tel.samples if t >= bounds[4][0]]
    n = len(tel.streams)
    bound = n * (2 * segment_bytes + 4096)
    out: dict[str, Any] = {
        "segment_bytes": segment_bytes,
        "streams": n,
        "max_segment": tel.max_segment,
        "bound_bytes": bound,
        "peak_bytes_after_warmup": max(after, default=None),
        "peak_bytes_second_fifth": max(second, default=None),
        "peak_bytes_last_fifth": max(last, default=None),
        "samples": [[round(t, 1), s, f] for t, s, f in tel.samples],
    }
    if tel.max_segment < 1 or not second or not last:
        why = "no event file reached its segment cap" if tel.max_segment < 1 else "no sample in a window"
        return {**out, "pass": None, "reason": f"{TOO_SHORT}: {why}"}
    within = max(after) <= bound
    flat = max(last) <= max(second) + n * segment_bytes
    ok = within and flat
    return {
        **out,
        "pass": ok,
        "reason": f"telemetry folder peak after warm-up {max(after)} B {'<=' if within else '>'} bound {bound} B "
        f"({n} streams x 2 segments); peak last fifth {max(last)} B vs second fifth {max(second)} B + {n} "
        f"segments: {'flat' if flat else 'still growing'} ({tel.max_segment} segments written by the busiest stream)",
    }


def count_verdict(name: str, n: int) -> dict:
    return {"pass": n == 0, "count": n, "reason": f"{n} {name}"}


def overall(verdicts: dict[str, dict]) -> tuple[bool | None, list[str]]:
    """(pass, reasons): false when any verdict fails, null when none fails but one could not be judged."""
    states = [v["pass"] for v in verdicts.values()]
    reasons = [f"{k}: {v['reason']}" for k, v in verdicts.items() if v["pass"] is not True]
    if any(s is False for s in states):
        return False, reasons
    return (None if any(s is None for s in states) else True), reasons


def kind_rows(results: list[Result]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for k in KINDS:
        rs = [r for r in results if r.kind == k]
        statuses: dict[str, int] = {}
        for r in rs:
            statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
        row = {"sent": len(rs), "ok": sum(r.ok for r in rs), "statuses": statuses}
        problems = sorted({r.problem for r in rs if r.problem})
        if problems:
            row["problems"] = problems[:5]
        if k == EFFORT:
            row["levels"] = {lv: sum(r.level == lv for r in rs) for lv in EFFORTS}
        out[k] = row
    return out


def summarise(
    cfg: SoakConfig,
    results: list[Result],
    mem: MemorySamples,
    tel: TelemetrySamples,
    traffic_s: float,
) -> dict:
    """The result document: the issue's keys first (`pass`, `memory_growth`, `p99_ratio`, `errors_5xx`,
    `requests`, `minutes`), then every verdict with its reason and the figures behind it."""
    errors_5xx = sum(is_5xx(r.status) for r in results)
    errors_other = sum(not r.ok and not is_5xx(r.status) for r in results)
    p99 = p99_verdict(results, traffic_s)
    memory = memory_verdict(mem, traffic_s, len(window(results, *fifth_bounds(traffic_s)[0])))
    telemetry = telemetry_verdict(tel, traffic_s, cfg.telemetry_segment_bytes)
    verdicts = {
        "memory": {"pass": memory["pass"], "reason": memory["reason"]},
        "p99": {"pass": p99["pass"], "reason": p99["reason"]},
        "errors_5xx": count_verdict("5xx answers", errors_5xx),
        "errors_other": count_verdict("requests failed otherwise (4xx, dropped, wrong usage)", errors_other),
        "telemetry": {"pass": telemetry["pass"], "reason": telemetry["reason"]},
    }
    ok, reasons = overall(verdicts)
    return {
        "pass": ok,
        "memory_growth": memory["memory_growth"],
        "p99_ratio": p99["p99_ratio"],
        "errors_5xx": errors_5xx,
        "requests": len(results),
        "minutes": cfg.minutes,
        "errors_other": errors_other,
        "verdicts": verdicts,
        "reasons": reasons,
        "traffic_s": round(traffic_s, 1),
        "requests_per_s": round(len(results) / traffic_s, 2) if traffic_s > 0 else None,
        "kinds": kind_rows(results),
        "windows": window_rows(results, traffic_s),
        "memory": {**{k: v for k, v in memory.items() if k not in ("pass", "reason")}, "by_role": memory_by_role(mem)},
        "telemetry": {k: v for k, v in telemetry.items() if k not in ("pass", "reason")},
    }


def summary_lines(res: dict) -> list[str]:
    lines = [
        f"soak {res['minutes']:g} min: {res['requests']} requests ({res['requests_per_s']} req/s), "
        f"{res['errors_5xx']} 5xx, {res['errors_other']} other failures"
    ]
    for w in res["windows"]:
        p99 = f"{w['p99_s']:.3f} s" if w["p99_s"] is not None else "-"
        lines.append(f"  fifth {w['fifth']}: {w['requests']:5d} requests, {w['timed']:5d} timed, p99 {p99}")
    for name, v in res["verdicts"].items():
        state = {True: "pass", False: "FAIL", None: "not judged"}[v["pass"]]
        lines.append(f"  {name:12s} {state:10s} {v['reason']}")
    lines.append(f"pass: {res['pass']}")
    return lines
