"""`python -m pipelines.evaluate --config FILE`: SpecExit against its peers on one engine, as a Ray Data job.

problems (toy split, JSONL, Parquet, HF) -> skip problems already written -> EvalWorker actors (vLLM
EAGLE-3 + SpecExit draft engine, plain engine; every method, one request at a time) -> Parquet parts
(one row per problem x temperature x method x setting, schema `eval_worker.EVAL`) -> per-method
aggregates + target checks in `_summary.json` (`meta_files.SUMMARY_FILE`). Python API: `run_evaluation(cfg) -> dict`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections import defaultdict, deque
from pathlib import Path

from pipelines.common.config import StageBase
from pipelines.common.meta_files import SUMMARY_FILE, write_meta
from pipelines.common.parts import clean_tmp, part_files, read_all
from pipelines.common.run_identity import (
    RunIdentityMismatch,
    changed_rows,
    check_identity,
    config_identity,
    model_fingerprint,
    read_identity,
    refuse_changed_rows,
    write_identity,
)
from pipelines.evaluate.certificate_check import COLUMNS as CHECK_COLUMNS
from pipelines.evaluate.config import SWEEPS, EvalConfig, TargetsConfig
from pipelines.evaluate.intervals import accuracy_ci95, paired_diff_ci95, paired_ratio_ci95, within_points
from pipelines.evaluate.rules import best_setting
from pipelines.evaluate.samples import sample_key
from specexit_core.typed_config import ConfigError, load_config, read_yaml
from specexit_core.vllm_env import THREADS_BIND_ENV, engine_actor_count

log = logging.getLogger("specexit.pipelines.evaluate")

_AGG_COLUMNS = [
    "id",
    "problem_id",
    "status",
    "error",
    "method",
    "setting",
    "temperature",
    "correct",
    "think_tokens",
    "answer_tokens",
    "latency_s",
    "requests",
    "probe_requests",
    "num_drafts",
    "num_accepted",
    "info",
]


def _timed_latency(r: dict) -> float | None:
    """A row's latency where it counts: an ok row timed at concurrency 1 (batched and replayed rows have
    none; `"timed": false` marks a problem left out of the latency means, the same subset for every method)."""
    if r["status"] != "ok" or r["latency_s"] is None or not json.loads(r["info"] or "{}").get("timed", True):
        return None
    return float(r["latency_s"])


def _aggregate(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict = {"n": len(ok), "errors": len(rows) - len(ok)}
    if not ok:
        return out
    mean = lambda k: statistics.mean(float(r[k]) for r in ok)  # noqa: E731
    infos = [json.loads(r["info"] or "{}") for r in ok]
    # latency: the problems timed at concurrency 1 only (the same subset for every method)
    lat = [x for r in ok if (x := _timed_latency(r)) is not None]
    drafts = sum(r["num_drafts"] or 0 for r in ok)
    acc = sum(r["num_accepted"] or 0 for r in ok)
    out.update(
        accuracy=mean("correct"),
        # problems resampled, each with all its samples (intervals.py)
        accuracy_ci95=accuracy_ci95([bool(r["correct"]) for r in ok], keys=[sample_key(r) for r in ok]),
        think_tokens=mean("think_tokens"),
        answer_tokens=mean("answer_tokens"),
        latency_s=statistics.mean(lat) if lat else None,
        latency_p50_s=statistics.median(lat) if lat else None,
        latency_n=len(lat),
        acceptance_length=(1 + acc / drafts) if drafts else None,
        probe_requests=mean("probe_requests"),
        requests=mean("requests"),
    )
    if any("probe_latency_s" in i for i in infos):  # oracle: the probing is not part of the method's latency
        out["probe_latency_s"] = statistics.mean(i["probe_latency_s"] for i in infos if "probe_latency_s" in i)
    if any("prefix_matches" in i for i in infos):  # oracle replays: same think prefix as the probed trace?
        out["replay_prefix_match_rate"] = sum(bool(i.get("prefix_matches", True)) for i in infos) / len(infos)
    if any("exit" in i for i in infos):
        out["exit_rate"] = sum(i.get("exit") is not None for i in infos) / len(infos)
    return out


def aggregate(rows: list[dict], *, tolerance: float, budget_chosen: int | None = None) -> dict:
    """Per temperature: {"methods": {name: metrics}, "sweeps": {"budget" | "effort": [metrics + setting]}}.
    The `budget` method is the sweep point `budget_chosen` (chosen on the dev split), or else the
    fewest think tokens within `tolerance` of eagle3 on these rows (`chosen_on` says which)."""
    groups: dict = defaultdict(list)
    for r in rows:
        if r["method"] is not None:
            groups[(float(r["temperature"]), r["method"], r["setting"] or "")].append(r)
    by_t: dict = {}
    correct: dict = {}  # (temperature, method, setting) -> {(problem id, sample): correct}
    latency: dict = {}  # (temperature, method, setting) -> {(problem id, sample): latency at concurrency 1}
    for (t, m, s), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], _setting_order(kv[0][2]))):
        d = by_t.setdefault(f"{t:g}", {"methods": {}, "sweeps": {}})
        correct[(f"{t:g}", m, s)] = {sample_key(r): bool(r["correct"]) for r in rs if r["status"] == "ok"}
        latency[(f"{t:g}", m, s)] = {sample_key(r): x for r in rs if (x := _timed_latency(r)) is not None}
        agg = _aggregate(rs)
        if m in SWEEPS:  # one row per setting: a budget (int) or a reasoning effort level (str)
            d["sweeps"].setdefault(m, []).append({"setting": int(s) if m == "budget" else s, **agg})
        else:
            d["methods"][m] = agg
    for t, d in by_t.items():  # paired by problem-sample: accuracy minus eagle3's, with its 95% bootstrap interval
        ref = correct.get((t, "eagle3", ""))
        if ref is None:
            continue
        for m, agg in d["methods"].items():
            if m != "eagle3" and agg.get("n"):
                agg["accuracy_vs_eagle3"] = paired_diff_ci95(correct[(t, m, "")], ref)
                # EAGLE-3's latency over this method's, paired on the timed problems
                agg["speedup_vs_eagle3"] = paired_ratio_ci95(latency[(t, "eagle3", "")], latency[(t, m, "")])
        for m, points in d["sweeps"].items():
            for p in points:
                if p.get("n"):
                    key = (t, m, str(p["setting"]))
                    p["accuracy_vs_eagle3"] = paired_diff_ci95(correct[key], ref)
                    p["speedup_vs_eagle3"] = paired_ratio_ci95(latency[(t, "eagle3", "")], latency[key])
    for d in by_t.values():
        pts = [p for p in d["sweeps"].get("budget", []) if p.get("n")]
        ref = d["methods"].get("eagle3", {}).get("accuracy")
        chosen = [p for p in pts if p["setting"] == budget_chosen]
        if chosen:
            d["methods"]["budget"] = {**chosen[0], "chosen_on": "dev"}
        elif pts:
            best = best_setting(
                pts, ref_accuracy=ref if ref is not None else max(p["accuracy"] for p in pts), tolerance=tolerance
            )
            d["methods"]["budget"] = {**best, "chosen_on": "this run"}
    return by_t


def _setting_order(setting: str) -> tuple:
    """Rows of a sweep in order: budgets by size, effort levels least thinking first."""
    from specexit_core.exit.efforts import EFFORTS

    if setting in EFFORTS:
        return (1, EFFORTS.index(setting))
    return (0, int(setting or 0))


def _check(value, target, ok: bool, miss: str | None, **kw) -> dict:
    return {"value": value, "target": target, "pass": ok, "miss_by": None if ok else miss, **kw}


def target_checks(methods: dict, targets: TargetsConfig | None = None) -> dict:
    """The recipe's targets for one temperature (pass, or by how much they are missed)."""
    tg = targets or TargetsConfig()
    s, e, o = methods.get("specexit"), methods.get("eagle3"), methods.get("oracle")
    out: dict = {}
    if not s or not s.get("n"):
        return out
    if o and o.get("n") and o["think_tokens"] > 0:
        r, mx = s["think_tokens"] / o["think_tokens"], tg.think_vs_oracle_max
        out[f"think_within_{mx:g}x_oracle"] = _check(
            round(r, 3), f"<= {mx:g}", r <= mx, f"{r / mx:.2f}x over ({r:.2f}x the oracle)"
        )
    if e and e.get("n"):
        red = 1 - s["think_tokens"] / e["think_tokens"] if e["think_tokens"] else 0.0
        if tg.think_reduction_vs_eagle3_min is not None:
            mn = tg.think_reduction_vs_eagle3_min
            out["think_reduction_vs_eagle3"] = _check(
                round(red, 3), f">= {mn:g}", red >= mn, f"{100 * (mn - red):.1f} points short"
            )
        sp = e["latency_s"] / s["latency_s"] if s["latency_s"] else 0.0
        if tg.speedup_vs_eagle3_min is not None:
            mn = tg.speedup_vs_eagle3_min
            ci = (s.get("speedup_vs_eagle3") or {}).get("ci95")
            out["speedup_vs_eagle3"] = _check(
                round(sp, 3),
                f">= {mn:g}",
                sp >= mn,
                f"{mn - sp:.2f}x short ({sp:.2f}x)",
                ci95=None if ci is None else [round(x, 3) for x in ci],
            )
        drop = 100 * (e["accuracy"] - s["accuracy"])
        tol = tg.accuracy_drop_max_points
        diff = s.get("accuracy_vs_eagle3")
        held = within_points(diff, tol)  # judged on the paired interval, not the point estimate
        ok = held if held is not None else drop <= tol + 1e-9
        lo = diff["ci95"][0] if diff else -drop
        out["accuracy_within_1_point_of_eagle3"] = _check(
            round(drop, 2),
            f"<= {tol:g} (95% paired bootstrap interval of specexit - eagle3 above -{tol:g} points)",
            ok,
            f"the interval reaches {lo:.1f} points",
            ci95_points=None if not diff else [round(x, 2) for x in diff["ci95"]],
        )
    for peer in ("deer", "dynasor"):
        p = methods.get(peer)
        if p and p.get("n"):
            faster, acc_ok = s["latency_s"] < p["latency_s"], s["accuracy"] >= p["accuracy"] - 1e-9
            out[f"faster_than_{peer}_at_equal_or_better_accuracy"] = _check(
                {
                    "latency_ratio": round(p["latency_s"] / s["latency_s"], 3),
                    "accuracy_delta_points": round(100 * (s["accuracy"] - p["accuracy"]), 2),
                },
                "latency ratio > 1 and accuracy delta >= 0",
                faster and acc_ok,
                ", ".join(
                    x
                    for x in ([] if faster else [f"{s['latency_s'] / p['latency_s']:.2f}x slower"])
                    + ([] if acc_ok else [f"{100 * (p['accuracy'] - s['accuracy']):.1f} points less accurate"])
                ),
            )
    return out


def tally_problems(rows: list[dict], expected: list[str]) -> dict:
    """Every input problem accounted for: ok (all its rows ok) or error (any row failed)."""
    by: dict = defaultdict(list)
    for r in rows:
        by[r["problem_id"]].append(r["status"])
    exp = set(expected)
    ok = sum(1 for p in exp if p in by and all(s == "ok" for s in by[p]))
    err = sum(1 for p in exp if p in by and any(s != "ok" for s in by[p]))
    missing = len(exp - set(by))
    return {"input_rows": len(exp), "ok": ok, "errors": err, "missing": missing, "complete": missing == 0}


# Keys that change how the job runs or only the summary, not the rows it writes: a resume may change
# them (pipelines/common/run_identity.py). The models count by content (`models`; `draft` stays in
# `config` too: the report reads the draft's path from the run identity), the exit setting as resolved
# (`specexit_exit`: a calibrated file is a path), the input row by row (`check_input_rows`).
RUN_ONLY_KEYS = frozenset(
    {
        "output",
        "limit",
        "ray",
        "batch_size",
        "concurrency",
        "accuracy_tolerance",
        "targets",
        "calibrated",
        "specexit_exit",
        "input.path",
        "input.n",
    }
    | {k for k in StageBase.RUN_ONLY_KEYS if k.startswith("engine.")}
)


def identity(cfg: EvalConfig) -> dict:
    """What the evaluation rows depend on: config, target and draft weights, the exit setting used."""
    return {
        "stage": "evaluate",
        "config": config_identity(cfg, RUN_ONLY_KEYS),
        "models": {"engine.model": model_fingerprint(cfg.engine.model), "draft": model_fingerprint(cfg.draft)},
        "specexit_exit": _exit_used(cfg),
        **_exits_by_temperature(cfg),
    }


def _exits_by_temperature(cfg: EvalConfig) -> dict:
    """`{"specexit_exit_by_temperature": {T: setting}}` when a sampling profile runs another exit than
    the headline temperature's, else nothing (so the identity of a run without profiles is unchanged)."""
    exits = {f"{t:g}": _exit_used(cfg, t) for t in cfg.temperatures}
    head = exits[f"{cfg.temperatures[0]:g}"]
    return {} if all(e == head for e in exits.values()) else {"specexit_exit_by_temperature": exits}


def check_input_rows(cfg: EvalConfig, problems: list[dict]) -> None:
    """Every problem already written must still have the prompt and gold it was evaluated on."""
    if not part_files(cfg.output):
        return
    t = read_all(cfg.output, ["problem_id", "prompt", "gold"])
    cols = (t.column(c).to_pylist() for c in ("problem_id", "prompt", "gold"))
    written = {i: (p, g) for i, p, g in zip(*cols)}
    refuse_changed_rows(
        "evaluate",
        cfg.output,
        changed_rows(written, {r["id"]: (r.get("prompt"), r.get("gold")) for r in problems}),
        "Ids without an id column are positions (row-<index>): inserting or removing input lines shifts "
        "them. Give the input an id column (input.id_column) or use a new output folder.",
    )


def check_run_identity(cfg: EvalConfig, problems: list[dict] | None = None) -> dict:
    """Refuse to resume into output of another run (RunIdentityMismatch, a ValueError); returns the
    identity for `write_identity`. An output whose identity file predates the shared format is adopted."""
    ident = identity(cfg)
    old = read_identity(cfg.output)
    if old is not None and "stage" not in old:
        log.warning("evaluate: %s has a run identity of an older format; adopting the output", cfg.output)
    else:
        check_identity(cfg.output, ident, resuming=bool(part_files(cfg.output)), what="evaluate")
    if problems is not None:
        check_input_rows(cfg, problems)
    return ident


def timed_ids(problems: list[dict], latency_problems: int | None) -> set:
    """Ids of the problems timed at concurrency 1: the first `latency_problems` (None: all, 0: none)."""
    return first_ids(problems, latency_problems)


def first_ids(problems: list[dict], n: int | None) -> set:
    """Ids of the first `n` problems of the input (None: all)."""
    return {p["id"] for p in (problems if n is None else problems[:n])}


def spread_timed(rows: list[dict]) -> list[dict]:
    """`rows` reordered so the timed ones (each several times an untimed problem's work: every method
    one request at a time) are evenly spaced: every batch, and so every engine actor, gets its share."""
    timed = [r for r in rows if r["timed"]]
    rest = deque(r for r in rows if not r["timed"])
    if not timed or not rest:
        return list(rows)
    step = len(rows) / len(timed)
    out: list[dict] = []
    k = 0  # timed rows placed so far; the k-th goes at position k * step
    for pos in range(len(rows)):
        if k < len(timed) and (pos >= k * step or not rest):
            out.append(timed[k])
            k += 1
        else:
            out.append(rest.popleft())
    return out


def actor_plan(cfg: EvalConfig, env: dict, gpu: bool, n_todo: int) -> tuple[int, int]:
    """(engine actors, problems per batch). On CPU at most one actor per core of the binding (each
    claims its own cores: `EvalWorker`); batches no larger than an even share of the work, so that
    every actor has some."""
    bind = None if gpu else env.get(THREADS_BIND_ENV)
    actors = engine_actor_count(cfg.concurrency, bind) if bind else cfg.concurrency
    return actors, max(1, min(cfg.batch_size, math.ceil(n_todo / actors)))


def map_over_actors(rows: list[dict], worker, ctor_kwargs: dict, *, actors: int, batch: int, **remote_args):
    """`rows` through a pool of `actors` instances of `worker`, `batch` rows per call, as a Ray dataset.
    One block per batch and one batch at a time per actor: otherwise the first actor to start takes
    several batches (a block holding them, or a queue) while the others sit idle."""
    import ray

    ds = ray.data.from_items(rows, override_num_blocks=max(1, math.ceil(len(rows) / batch)))
    return ds.map_batches(
        worker,
        fn_constructor_kwargs=ctor_kwargs,
        compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
        batch_size=batch,
        batch_format="pyarrow",
        **remote_args,
    )


def run_evaluation(cfg: EvalConfig) -> dict:
    """Run (or resume) the evaluation; returns the summary (also written to `<output>/_summary.json`)."""
    t0 = time.time()
    cfg = cfg.with_calibrated_peers()  # DEER / Dynasor / budget as calibrated on dev, if the file says
    from pipelines.common.prompt_source import read_prompts
    from pipelines.common.runtime import engine_env, init_ray, use_gpu

    ident = check_run_identity(cfg)  # before Ray starts: a refusal costs nothing
    init_ray(cfg.ray)

    gpu = use_gpu(cfg.engine.accelerator)
    problems = read_prompts(cfg.input, cfg.limit)
    expected = [p["id"] for p in problems]
    Path(cfg.output).mkdir(parents=True, exist_ok=True)
    check_input_rows(cfg, problems)
    clean_tmp(cfg.output)
    write_identity(cfg.output, ident)
    done = set()
    if part_files(cfg.output):
        done = set(read_all(cfg.output, ["problem_id"]).column("problem_id").to_pylist())
    todo = [p for p in problems if p["id"] not in done]
    log.info(
        "evaluate: %d problems, %d already in %s, %d to do; methods %s; temperatures %s",
        len(problems),
        len(problems) - len(todo),
        cfg.output,
        len(todo),
        cfg.run_methods(),
        cfg.temperatures,
    )
    busy = None
    if todo:
        from pipelines.evaluate.worker import EvalWorker

        env = engine_env(cfg.engine, gpu)
        res = {"num_gpus": cfg.engine.tensor_parallel_size} if gpu else {"num_cpus": 1}
        timed = timed_ids(problems, cfg.latency_problems)
        probed = first_ids(problems, cfg.peer_probe_problems)  # where the peers' candidates are probed
        peered = first_ids(problems, cfg.peer_problems)  # where the peers run at all
        actors, batch = actor_plan(cfg, env, gpu, len(todo))
        log.info("evaluate: %d engine actor(s), %d problems per batch", actors, batch)
        ds = map_over_actors(
            spread_timed(
                [
                    {**p, "timed": p["id"] in timed, "peer_probe": p["id"] in probed, "peers": p["id"] in peered}
                    for p in todo
                ]
            ),
            EvalWorker,
            {"cfg_json": cfg.model_dump_json(), "env": env, "actors": actors},
            actors=actors,
            batch=batch,
            runtime_env={"env_vars": env},
            **res,
        )
        tb = time.time()
        for rec in ds.iter_rows():
            log.info(
                "evaluate: part %s: %d problems, %d rows, %d errors",
                rec["part"],
                rec["problems"],
                rec["rows"],
                rec["errors"],
            )
        busy = time.time() - tb
    # the certificate check (a calibrated file) reads a few more columns: one read for both
    columns = _AGG_COLUMNS + ([c for c in CHECK_COLUMNS if c not in _AGG_COLUMNS] if cfg.calibrated else [])
    wanted = set(expected)
    rows = [r for r in read_all(cfg.output, columns).to_pylist() if r["problem_id"] in wanted]
    by_t = aggregate(rows, tolerance=cfg.accuracy_tolerance, budget_chosen=cfg.budget_chosen)
    head = f"{cfg.temperatures[0]:g}"
    summary = {
        "methods": by_t.get(head, {}).get("methods", {}),
        "sweeps": by_t.get(head, {}).get("sweeps", {}),
        "temperature": cfg.temperatures[0],
        # `natural_end`: the accuracies are agreement with EAGLE-3's answer at its natural end (no gold)
        "graded_against": cfg.grade_against,
        "by_temperature": by_t,
        # each temperature's sampling profile (`T0.6-p0.95-k20`): the name its calibrated exit goes by
        "sampling_profiles": {f"{t:g}": cfg.sampling_profile(t).name for t in cfg.temperatures},
        "samples": cfg.samples,  # per problem at each sampled temperature (intervals resample problems)
        "targets": {t: target_checks(d["methods"], cfg.targets) for t, d in by_t.items()},
        "n": len(expected),
        **tally_problems(rows, expected),
        "output": cfg.output,
        "seconds": round(time.time() - t0, 1),
        "pipeline_seconds": None if busy is None else round(busy, 1),
        "specexit_exit": _exit_used(cfg),
        **_exits_by_temperature(cfg),
        "peer_settings": {
            "deer": {"threshold": cfg.deer.threshold, "mean": cfg.deer.mean},
            "dynasor": {"every": cfg.dynasor.every, "window": cfg.dynasor.window},
            "budget": by_t.get(head, {}).get("methods", {}).get("budget", {}).get("setting"),
            "chosen_on": "dev" if cfg.budget_chosen is not None else "this run (budget) / config (DEER, Dynasor)",
        },
    }
    if cfg.calibrated:  # the certified exit on these (new) problems: pipelines/evaluate/certificate_check.py
        from pipelines.common.graders import EXTRACTORS
        from pipelines.evaluate.certificate_check import certificate_check

        summary["certificate_check"] = certificate_check(
            rows, cfg.calibrated, summary["sampling_profiles"], EXTRACTORS[cfg.grader]
        )
    write_meta(cfg.output, SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary


def toy_eval_config(
    *,
    draft: str,
    n: int,
    output: str,
    methods: list[str] | None = None,
    temperatures: list[float] | None = None,
    calibrated: str | None = None,
    teacher: str | None = None,
    **overrides,
) -> EvalConfig:
    """The toy recipe (`examples/toy/evaluate.yaml`, shipped in the package's checkout) with the
    pieces a caller such as `specexit demo` sets: the draft it trained, n test problems, the output."""
    recipe = Path(__file__).resolve().parents[2] / "examples" / "toy" / "evaluate.yaml"
    d = read_yaml(recipe)
    d.update(draft=str(draft), output=str(output), limit=n, **overrides)
    d["input"] = {**d["input"], "n": n}
    if teacher is not None:
        d["engine"]["model"] = str(teacher)
    if methods is not None:
        d["methods"] = list(methods)
    if temperatures is not None:
        d["temperatures"] = list(temperatures)
    if calibrated is not None:
        d["calibrated"] = str(calibrated)
    root = recipe.parents[2]  # the recipe's relative model paths are relative to the checkout
    for holder, key in ((d["engine"], "model"), (d, "draft")):
        if not Path(holder[key]).is_absolute() and (root / holder[key]).exists():
            holder[key] = str(root / holder[key])
    return load_config(EvalConfig, raw=d, what="evaluate")


def _exit_used(cfg: EvalConfig, temperature: float | None = None) -> dict | None:
    """The exit setting `specexit` ran with at `temperature` (None: the headline one), resolved as the
    plugin does: the draft's `exit_defaults` / `exit_profiles` (e.g. written by calibration) <-
    $SPECEXIT_EXIT_CONFIG <- the request overrides (the calibrated file's, for that sampling profile,
    or `specexit_exit`). None when the draft's config cannot be read."""
    import os

    from specexit_core.draft.checkpoint import read_config
    from specexit_core.exit import EXIT_CONFIG_ENV
    from specexit_core.exit.profiles import resolve_exit_defaults

    t = cfg.temperatures[0] if temperature is None else temperature
    try:
        draft = read_config(cfg.draft)
        defaults = resolve_exit_defaults(draft.exit_defaults, draft.exit_profiles, os.environ.get(EXIT_CONFIG_ENV))
        return defaults.select(cfg.sampling_profile(t))[1].with_overrides(cfg.exit_overrides(t)).to_dict()
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    from pipelines.common.prompt_source import input_overrides
    from pipelines.common.stage_cli import print_summary, setup_logging

    ap = argparse.ArgumentParser(prog="python -m pipelines.evaluate", description="SpecExit vs peer methods (Ray)")
    ap.add_argument("--config", required=True, help="YAML config file (unknown keys are errors)")
    ap.add_argument("--input", help="override the eval set path (.jsonl / .parquet / folder)")
    ap.add_argument("--output", help="override the output folder")
    ap.add_argument("--limit", type=int, help="only the first N problems")
    ap.add_argument("--calibrated", help="JSON written by `specexit calibrate`: the exit setting of `specexit`")
    ap.add_argument(
        "--report", action="store_true", help="also write report.md + PNGs into the output folder's _report/"
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    setup_logging(args.verbose)
    if args.limit is not None and args.limit < 1:
        print(f"--limit must be >= 1, got {args.limit}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(
            EvalConfig,
            args.config,
            what="evaluate",
            overrides={
                "output": args.output,
                "limit": args.limit,
                "calibrated": args.calibrated,
                **input_overrides(args.input),
            },
        )
    except (ConfigError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    try:
        summary = run_evaluation(cfg)
    except RunIdentityMismatch as e:  # refused before any row was written
        print(str(e), file=sys.stderr)
        return 2
    if args.report:
        from pipelines.report.job import write_report

        summary["report"] = str(write_report(cfg.output))
    from pipelines.common.runtime import stop_ray_quietly

    stop_ray_quietly()
    print_summary({k: v for k, v in summary.items() if k not in ("by_temperature", "sweeps")})
    return 0 if summary.get("complete") else 1
