"""`specexit calibrate`: pick the exit thresholds (and the method string) on a dev split.

1. One evaluation run on the dev split, greedy: eagle3 (the trace + per-token draft signals) and
   oracle (a graded forced answer at every paragraph break of that trace).
2. Offline replay: the exit decision depends only on the tokens and their signals, so for every
   setting of the grid the exit break of each trace follows from the signals computed once
   (`specexit_core.exit.replay`: the engines' `ExitTracker` records its checks once per trace and
   alpha, the engines' `passes` judges each setting), and its accuracy from the
   forced answer probed at that break (greedy: what the engine writes after forcing `</think>` there).
3. Pick the fewest think tokens with accuracy >= eagle3 accuracy - tolerance, or (`selection:
   certified`) the most aggressive setting certified by Learn then Test (certificate.py), which is
   computed and recorded either way.
4. Confirm the chosen setting with the real engine (specexit on the same dev problems).
Writes `{"exit": {ExitConfig fields}, "calibration": {evidence}}`, which `SPECEXIT_EXIT_CONFIG`
(the plugin's server defaults), `EvalConfig.calibrated` and optionally the draft's
`config.json` `specexit.exit_defaults` read.
"""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.calibrate.certificate import certified_choice, int_mean, prompt_losses
from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.peers import calibrate_budget, calibrate_deer, calibrate_dynasor
from pipelines.common.parts import read_all
from pipelines.common.runtime import stop_ray_quietly
from pipelines.evaluate.rules import best_setting
from pipelines.evaluate.samples import sample_key
from specexit_core.exit import ExitConfig
from specexit_core.exit.replay import CheckTable, exit_checks, first_exits

log = logging.getLogger("specexit.pipelines.calibrate")


def grid(cfg: CalibrateConfig) -> list[ExitConfig]:
    """Every distinct setting: thresholds only vary for the signals the method string uses."""
    values = {
        "confidence_threshold": cfg.confidence_thresholds,
        "progress_threshold": cfg.progress_thresholds,
        "remaining_threshold": cfg.remaining_thresholds,
    }
    out, seen = [], set()
    for m in cfg.methods:
        axes = {f"{s}_threshold": values[f"{s}_threshold"] for s in ExitConfig(method=m).signals_used}
        for combo in itertools.product(*axes.values(), cfg.alphas):  # unused thresholds keep their defaults
            e = ExitConfig(method=m, alpha=combo[-1], **dict(zip(axes, combo)))
            if e not in seen:
                seen.add(e)
                out.append(e)
    return out


def grid_edges(cfg: CalibrateConfig, chosen: ExitConfig) -> list[str]:
    """The chosen values that sit at an end of their grid axis (a better one may lie beyond it):
    one sentence each, empty when every varied value is inside its range."""
    axes = {f"{s}_threshold": getattr(cfg, f"{s}_thresholds") for s in chosen.signals_used}
    axes["alpha"] = cfg.alphas
    out = []
    for name, values in axes.items():
        v = getattr(chosen, name)
        if len(values) > 1 and v in (min(values), max(values)):
            end = "lowest" if v == min(values) else "highest"
            out.append(f"{name} = {v:g} is the {end} value of the grid {sorted(values)}")
    return out


def load_traces(eval_dir: str, temperature: float = 0.0) -> list[dict]:
    """The eagle3 rows at `temperature` (trace + signals) joined with their oracle rows (break probes),
    one per problem-sample (`EvalConfig.samples`)."""
    rows = read_all(
        eval_dir,
        [
            "problem_id",
            "status",
            "method",
            "temperature",
            "correct",
            "think_tokens",
            "completion_token_ids",
            "signal_confidence",
            "signal_progress",
            "signal_remaining",
            "boundaries",
            "probe_correct",
            "info",
        ],
    ).to_pylist()
    by: dict = {}
    for r in rows:
        if (
            r["status"] == "ok"
            and abs(float(r["temperature"]) - temperature) < 1e-6
            and r["method"] in ("eagle3", "oracle")
        ):
            by.setdefault(sample_key(r), {})[r["method"]] = r
    out = []
    for (pid, sample), d in sorted(by.items()):
        e, o = d.get("eagle3"), d.get("oracle")
        if e is None or o is None or e["signal_confidence"] is None:
            continue
        info = json.loads(o["info"] or "{}")
        out.append(
            {
                "id": pid if sample == 0 else f"{pid}/s{sample}",  # one per trace
                "problem": pid,  # the prompt it samples (EvalConfig.samples): the certificate's unit
                "sample": sample,
                "completion": e["completion_token_ids"],
                "correct": bool(e["correct"]),
                "think_tokens": e["think_tokens"],
                "oracle_think": o["think_tokens"],
                "signals": list(zip(e["signal_confidence"], e["signal_progress"], e["signal_remaining"])),
                "probes": dict(zip(o["boundaries"] or [], o["probe_correct"] or [])),
                # the answers at those breaks and at the trace's natural end (the disagreement loss);
                # None where the run did not record them (an evaluation from before they were)
                "answers": (
                    dict(zip(o["boundaries"] or [], info["probe_answers"])) if "probe_answers" in info else None
                ),
                "final_answer": info.get("final_answer"),
                # the peers' exit candidates along the same trace (EvalConfig.peer_probes)
                "think_end": info.get("think_end") or 0,  # unfinished: no candidate, the peers keep it all
                "deer_points": info.get("deer_points"),
                "dynasor_points": {p[0]: p for p in info.get("dynasor_points") or []},
                "budget_points": {b: ok for b, ok in info.get("budget_points") or []},
            }
        )
    return out


def replay(traces: list[dict], settings: list[ExitConfig], token_ids: dict) -> list[dict]:
    """Accuracy and mean think tokens of every setting, from the signals and probes alone."""
    return summarise(settings, replay_outcomes(traces, settings, token_ids))


def summarise(settings: list[ExitConfig], outcomes: list[list[tuple[bool, int]]]) -> list[dict]:
    """Each setting's accuracy and mean think tokens from its per-trace outcomes (`replay_outcomes`)."""
    return [
        {
            "exit": s.to_dict(),
            "accuracy": int_mean([ok for ok, _ in row]),
            "think_tokens": int_mean([n for _, n in row]),
        }
        for s, row in zip(settings, outcomes)
    ]


def replay_outcomes(traces: list[dict], settings: list[ExitConfig], token_ids: dict, outcome=None) -> list[list]:
    """[setting][trace] -> (answer right, think tokens): `exit_outcome` (or `outcome`, e.g.
    `exit_result`) of every setting on every trace, each trace's checks computed once per alpha."""
    outcome = outcome or exit_outcome
    out: list[list] = [[] for _ in settings]
    by_alpha: dict[float, list[int]] = {}
    for k, s in enumerate(settings):
        by_alpha.setdefault(s.alpha, []).append(k)
    for alpha, ks in by_alpha.items():
        checks = [trace_checks(tr, alpha, token_ids) for tr in traces]
        table = CheckTable(checks)
        # each trace's outcome at each of its checks, and without an exit (the last entry, index -1)
        outcomes = [[outcome(tr, c) for c in cs] + [outcome(tr, None)] for tr, cs in zip(traces, checks)]
        for k in ks:
            out[k] = [outs[j] for outs, j in zip(outcomes, first_exits(table, settings[k]).tolist())]
    return out


def trace_checks(trace: dict, alpha: float, token_ids: dict) -> list:
    """Every exit check along one trace at this smoothing (`exit_checks`, with the draft's token ids)."""
    return exit_checks(
        trace["completion"],
        trace["signals"],
        alpha=alpha,
        split_token_ids=token_ids["split"],
        think_start_id=token_ids["think_start"],
        think_end_id=token_ids["think_end"],
    )


def exit_outcome(trace: dict, check) -> tuple[bool, int]:
    """(answer right, think tokens) of one trace under an exit at `check` (None: no exit, the trace
    as it is): the forced answer probed at that break, and the think tokens kept up to it."""
    if check is None or check.index not in trace["probes"]:
        return bool(trace["correct"]), trace["think_tokens"]
    return bool(trace["probes"][check.index]), check.think_tokens


def exit_result(trace: dict, check) -> tuple[bool, int, str | None]:
    """`exit_outcome` plus the answer given there: the probe's at the exit break, the trace's own at
    its natural end without an exit (None when the run recorded no answers)."""
    ok, think = exit_outcome(trace, check)
    answers = trace.get("answers")
    if check is None or check.index not in trace["probes"] or answers is None:
        return ok, think, trace.get("final_answer")
    return ok, think, answers.get(check.index)


def certify_as_configured(cfg: CalibrateConfig, traces_by_t: dict, results_by_t: dict, **kw) -> dict:
    """`certified_choice` at the config's epsilon, delta, loss, order share and seed (`kw`: its
    `point_choice` and `losses`)."""
    return certified_choice(
        traces_by_t,
        results_by_t,
        epsilon=cfg.epsilon,
        delta=cfg.delta,
        loss=cfg.loss,
        order_share=cfg.order_share,
        seed=cfg.seed,
        **kw,
    )


def _holds(methods: dict, tolerance: float) -> bool:
    s, e = methods.get("specexit", {}), methods.get("eagle3", {})
    return (
        s.get("accuracy") is not None
        and e.get("accuracy") is not None
        and s["accuracy"] >= e["accuracy"] - tolerance - 1e-12
    )


def choose_exit(points_by_t: dict[float, list[dict]], ref_by_t: dict[float, float], tolerance: float) -> int:
    """Index of the setting with the fewest think tokens (mean over temperatures) whose accuracy is
    within `tolerance` of eagle3's at every temperature; if none is, the one that falls least short."""
    temps = list(points_by_t)
    merged = [
        {
            "i": i,
            "accuracy": min(points_by_t[t][i]["accuracy"] - ref_by_t[t] for t in temps),  # worst margin
            "think_tokens": statistics.mean(points_by_t[t][i]["think_tokens"] for t in temps),
        }
        for i in range(len(points_by_t[temps[0]]))
    ]
    return best_setting(merged, ref_accuracy=0.0, tolerance=tolerance)["i"]


def draft_token_ids(draft_dir: str) -> dict:
    """The draft's `specexit.token_ids` (think start / end, paragraph breaks): what the replay needs.
    ValueError for a draft without them (not a SpecExit draft)."""
    from specexit_core.draft.checkpoint import read_config

    ids = read_config(draft_dir).token_ids
    if not ids:
        raise ValueError(f"{draft_dir}/config.json has no specexit.token_ids: not a SpecExit draft")
    return ids


def choose_peers(cfg: CalibrateConfig, traces: list[dict]) -> dict:
    """DEER, Dynasor and the budget, each chosen on the greedy dev traces by SpecExit's rule (peers.py),
    against EAGLE-3's accuracy on the same traces: every dev trace, or the first `peer_problems`."""
    probed = [t for t in traces if t["deer_points"] is not None]
    kw = dict(ref_accuracy=statistics.mean(t["correct"] for t in probed) if probed else 0.0, tolerance=cfg.tolerance)
    out: dict = {"deer": None, "dynasor": None, "budget": None}
    # every trace probed, or (peer_problems) those of the first problems that did not fail
    if probed and (cfg.peer_problems is not None or len(probed) == len(traces)):
        out["deer"] = calibrate_deer(probed, cfg.deer_thresholds, cfg.deer_means, **kw)
        out["dynasor"] = calibrate_dynasor(
            probed, cfg.dynasor_every, cfg.dynasor_windows, cfg.eval.dynasor.hedge_words, **kw
        )
        out["budget"] = calibrate_budget(probed, cfg.budgets, **kw)
        log.info("calibrate: the peers chosen on %d of %d greedy dev traces", len(probed), len(traces))
    else:
        log.warning(
            "calibrate: %d of %d dev traces lack peer probes: the peers are not calibrated",
            len(traces) - len(probed),
            len(traces),
        )
    return out


def run_calibration(cfg: CalibrateConfig) -> dict:
    from pipelines.evaluate.job import run_evaluation

    t0 = time.time()
    ev = cfg.eval.model_copy(
        update={
            # what the replay needs: the traces and their signals, and a forced answer at every break (a
            # specexit run here once gave the draft's default exit a figure nothing read: 16% of the toy's)
            "methods": ["eagle3", "oracle"],
            "temperatures": list(cfg.temperatures),
            "signals": True,
            "calibrated": None,
            "peer_probes": cfg.peers,
            "peer_probe_stride": cfg.probe_stride(),
            "peer_probe_problems": cfg.peer_problems,
            "budget_sweep": list(cfg.budgets),
            "budget_chosen": None,
            # the replay needs each trace's tokens, signals and probes, not their latency: every dev
            # problem runs batched (the confirmation run below times like the evaluation)
            "latency_problems": 0,
            # k samples per prompt: the replay needs each sample's trace and probes, nothing else
            "sample_methods": ["eagle3", "oracle"] if cfg.eval.samples > 1 else None,
        }
    )
    run_evaluation(ev)
    traces_by_t = {t: load_traces(ev.output, t) for t in cfg.temperatures}
    traces = traces_by_t[0.0]  # greedy: the headline figures and the peers' replay
    if any(not tr for tr in traces_by_t.values()):
        raise RuntimeError(f"no usable dev traces in {ev.output} at some temperature (every problem failed?)")
    ids = draft_token_ids(ev.draft)
    settings = grid(cfg)
    t1 = time.time()
    results_by_t = {t: replay_outcomes(trs, settings, ids, exit_result) for t, trs in traces_by_t.items()}
    outcomes_by_t = {t: [[(ok, n) for ok, n, _ in row] for row in rows] for t, rows in results_by_t.items()}
    points_by_t = {t: summarise(settings, outcomes) for t, outcomes in outcomes_by_t.items()}
    points = points_by_t[0.0]
    default_pt = replay(traces, [ExitConfig()], ids)[0]
    replay_s = time.time() - t1
    e_by_t = {t: statistics.mean(tr["correct"] for tr in trs) for t, trs in traces_by_t.items()}
    e_acc = e_by_t[0.0]
    e_think = statistics.mean(t["think_tokens"] for t in traces)
    i_point = choose_exit(points_by_t, e_by_t, cfg.tolerance)
    losses = prompt_losses(traces_by_t, results_by_t, cfg.loss)  # once: every certificate below reads them
    cert = certify_as_configured(cfg, traces_by_t, results_by_t, point_choice=i_point, losses=losses)
    i_best = i_point if cfg.selection == "tolerance" else cert["chosen"]
    cert["chosen"] = None if cert["chosen"] is None else settings[cert["chosen"]].to_dict()
    if i_best is None:  # nothing certified: the exit stays off (SpecExit decodes as EAGLE-3 does)
        log.warning(
            "calibrate: no exit setting is certified at epsilon %g, delta %g on %d dev prompts: the exit is off",
            cfg.epsilon,
            cfg.delta,
            cert["n_dev"],
        )
    off = ExitConfig(enabled=False).to_dict()
    chosen_by_t = {
        t: points_by_t[t][i_best]
        if i_best is not None
        else {"exit": off, "accuracy": e_by_t[t], "think_tokens": statistics.mean(tr["think_tokens"] for tr in trs)}
        for t, trs in traces_by_t.items()
    }
    best = chosen_by_t[0.0]
    log.info(
        "calibrate: %d settings x %d traces x %d temperatures replayed in %.1fs; best %s",
        len(settings),
        len(traces),
        len(points_by_t),
        replay_s,
        best,
    )
    chosen = ExitConfig.from_dict(best["exit"]).to_dict()
    edges = grid_edges(cfg, ExitConfig.from_dict(chosen)) if i_best is not None else []
    for e in edges:
        log.warning("calibrate: the chosen %s: widen the grid to be sure nothing better lies beyond", e)
    ok_at = {t: chosen_by_t[t]["accuracy"] >= e_by_t[t] - cfg.tolerance - 1e-12 for t in points_by_t}
    dev = DevReplay(settings, traces_by_t, results_by_t, points_by_t, e_by_t)
    by_profile = choose_per_profile(cfg, ev, dev, joint=i_best, losses=losses)
    calib = {
        "how": "offline replay of ExitTracker over per-token draft signals computed once per EAGLE-3 dev trace "
        "(greedy, and sampled at each further calibration temperature with the evaluation's per-problem seeds); "
        "accuracy at an exit = the graded forced answer probed (greedy) at that paragraph break; the chosen "
        "setting has the fewest think tokens (mean over temperatures) within tolerance at every temperature",
        "split": ev.input.split if ev.input.kind == "toy" else ev.input.path,
        # `natural_end` (`--prompts FILE`, no gold): every "accuracy" here is agreement with the answer the
        # EAGLE-3 trace reaches at its natural end, so 1 - accuracy is the disagreement loss
        "graded_against": ev.grade_against,
        "n_traces": len(traces),
        "samples": ev.samples,  # per prompt at each sampled temperature; the certificate counts prompts
        "temperatures": list(cfg.temperatures),
        "tolerance": cfg.tolerance,
        "grid_size": len(settings),
        "replay_seconds": round(replay_s, 2),
        "eagle3": {"accuracy": e_acc, "think_tokens": e_think},
        "oracle": {"think_tokens": statistics.mean(t["oracle_think"] for t in traces)},
        "default": {k: default_pt[k] for k in ("accuracy", "think_tokens")},
        "chosen_replay": {k: best[k] for k in ("accuracy", "think_tokens")},
        "by_temperature": {
            f"{t:g}": {
                "n_traces": len(traces_by_t[t]),
                "eagle3": {
                    "accuracy": e_by_t[t],
                    "think_tokens": statistics.mean(tr["think_tokens"] for tr in traces_by_t[t]),
                },
                "chosen_replay": {k: chosen_by_t[t][k] for k in ("accuracy", "think_tokens")},
                "within_tolerance": ok_at[t],
            }
            for t in points_by_t
        },
        "within_tolerance": all(ok_at.values()),
        "at_grid_edge": edges,  # [] = every chosen value lies inside its grid axis
        # each sampling profile's own choice by the same rule, on its traces alone (`exit` above holds at
        # every one of them; a request sampled as a profile gets the profile's: exit/profiles.py)
        "by_profile": by_profile,
        # which rule chose; Learn then Test's certificate either way (certificate.py): epsilon, delta, the
        # loss, n_dev = n_order + n_test, the certified setting and its certified bound on the loss
        "selection": cfg.selection,
        "certificate": cert,
        "top": sorted(
            (p for p in points if p["accuracy"] >= e_acc - cfg.tolerance - 1e-12),
            key=lambda p: (p["think_tokens"], -p["accuracy"]),
        )[:10],
    }
    peers = None
    if cfg.peers:
        calib["peers"] = choose_peers(cfg, traces)
        peers = {name: c["setting"] for name, c in calib["peers"].items() if c is not None}
        if "budget" in peers:
            peers["budget"] = peers["budget"]["budget"]
        for name, c in calib["peers"].items():
            for e in (c or {}).get("at_grid_edge", []):
                log.warning("calibrate: %s: the chosen %s: widen the grid", name, e)
    # reasoning effort levels: the same certificate at each level's epsilon (specexit_core/exit/efforts.py)
    efforts, calib["efforts"] = calibrate_efforts(cfg, ev, dev, losses)
    out = {"exit": chosen, "by_profile": profile_exits(by_profile), "calibration": calib}
    if efforts:
        out["efforts"] = efforts
    if peers:
        out["peers"] = peers  # EvalConfig.with_calibrated_peers reads this
    _write(cfg.output, out)  # the confirmation reads it: each temperature runs its profile's exit
    if cfg.confirm:
        conf_ev = ev.model_copy(
            update={
                "methods": ["eagle3", "specexit"] + (["budget", "deer", "dynasor"] if peers else []),
                "calibrated": cfg.output,
                "specexit_exit": None,
                "signals": False,
                "peer_probes": False,
                "output": ev.output.rstrip("/") + "-confirm",
                "latency_problems": cfg.eval.latency_problems,
                "sample_methods": ["eagle3", "specexit"] if ev.samples > 1 else None,
                "budget_sweep": [] if peers and "budget" in peers else ev.budget_sweep,  # only the chosen one
            }
        ).with_peers(peers)
        shutil.rmtree(conf_ev.output, ignore_errors=True)  # derived from this choice: never resume it
        res = run_evaluation(conf_ev)
        m = res["methods"]
        calib["confirmed"] = {
            name: {k: m.get(name, {}).get(k) for k in ("accuracy", "think_tokens", "latency_s")}
            for name in ("eagle3", "specexit") + (("budget", "deer", "dynasor") if peers else ())
        }
        calib["confirmed"]["within_tolerance"] = _holds(m, cfg.tolerance)
        calib["confirmed_by_temperature"] = {
            t: {
                **{
                    name: {k: d["methods"].get(name, {}).get(k) for k in ("accuracy", "think_tokens")}
                    for name in ("eagle3", "specexit")
                },
                "within_tolerance": _holds(d["methods"], cfg.tolerance),
            }
            for t, d in res["by_temperature"].items()
        }
    calib["seconds"] = round(time.time() - t0, 1)
    _write(cfg.output, out)
    if cfg.write_draft_defaults:
        from specexit_core.draft.checkpoint import set_exit_defaults

        set_exit_defaults(ev.draft, chosen, out["by_profile"], out.get("efforts"))
    return out


@dataclass(frozen=True)
class DevReplay:
    """The grid replayed over the dev traces: what every choice made from it (per profile, per
    reasoning effort level) reads."""

    settings: list[ExitConfig]
    traces_by_t: dict[float, list[dict]]
    results_by_t: dict[float, list[list[tuple]]]  # [setting][trace] -> (right, think tokens, answer)
    points_by_t: dict[float, list[dict]]  # [setting] -> {exit, accuracy, think_tokens}
    e_by_t: dict[float, float]  # EAGLE-3's accuracy on the traces


def _write(path: str, out: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=2) + "\n")


def choose_per_profile(
    cfg: CalibrateConfig, ev, replay: DevReplay, joint: int | None = None, losses: dict | None = None
) -> dict[str, dict]:
    """{profile name: {sampling, exit, replay, certificate, source}}: each calibration temperature's own
    choice by the config's rule (`selection`), from its traces alone; the profile is how the dev run
    `ev` sampled there (its temperature with its top-p / top-k). Certified and nothing certified on the
    profile's own traces: the joint certified exit (`joint`, tested at every profile; `source: joint`),
    else the exit is off there (`source: off`). A profile that falls back rests on two tests of the same
    dev prompts, so its guarantee holds at 1 - 2 delta (either test may be the one that failed)."""
    settings, traces_by_t, results_by_t = replay.settings, replay.traces_by_t, replay.results_by_t
    points_by_t, e_by_t = replay.points_by_t, replay.e_by_t
    out = {}
    for t, trs in traces_by_t.items():
        i_point = choose_exit({t: points_by_t[t]}, {t: e_by_t[t]}, cfg.tolerance)
        cert = certify_as_configured(cfg, {t: trs}, {t: results_by_t[t]}, losses=losses)
        i = i_point if cfg.selection == "tolerance" else cert["chosen"]
        source = "profile"
        if i is None and cfg.selection == "certified" and joint is not None:
            i, source = joint, "joint"
        if i is None:
            source = "off"
            chosen = ExitConfig(enabled=False).to_dict()
            replay_pt = {"accuracy": e_by_t[t], "think_tokens": statistics.mean(tr["think_tokens"] for tr in trs)}
        else:
            chosen, replay_pt = settings[i].to_dict(), {k: points_by_t[t][i][k] for k in ("accuracy", "think_tokens")}
        prof = ev.sampling_profile(t)
        out[prof.name] = {
            "sampling": prof.to_dict(),
            "exit": chosen,
            "replay": replay_pt,
            "source": source,  # profile: its own choice; joint: the joint certified exit; off: none
            "certificate": {
                "chosen": None if cert["chosen"] is None else settings[cert["chosen"]].to_dict(),
                **{k: cert[k] for k in ("bound", "epsilon", "delta", "loss", "n_dev")},
            },
        }
    return out


def calibrate_efforts(cfg: CalibrateConfig, ev, replay: DevReplay, losses: dict | None = None) -> tuple[dict, dict]:
    """The reasoning effort levels (`cfg.efforts`: level -> epsilon): at each, Learn then Test at that
    epsilon over the same replay, jointly and per sampling profile, as the certified exit is chosen.
    Returns the calibrated file's `efforts` ({level: {epsilon, exit, by_profile}}: efforts.py reads it)
    and the evidence ({level: {epsilon, certificate, by_profile}})."""
    settings, traces_by_t, results_by_t = replay.settings, replay.traces_by_t, replay.results_by_t
    if not cfg.efforts:
        return {}, {}
    if losses is None:
        losses = prompt_losses(traces_by_t, results_by_t, cfg.loss)  # once for every level
    off = ExitConfig(enabled=False).to_dict()
    efforts, evidence = {}, {}
    for level, eps in cfg.efforts.items():
        at = cfg.model_copy(update={"epsilon": eps, "selection": "certified"})
        cert = certify_as_configured(at, traces_by_t, results_by_t, losses=losses)
        i = cert["chosen"]
        per = choose_per_profile(at, ev, replay, joint=i, losses=losses)
        efforts[level] = {
            "epsilon": eps,
            "exit": settings[i].to_dict() if i is not None else off,
            "by_profile": profile_exits(per),
        }
        evidence[level] = {
            "epsilon": eps,
            "certificate": {
                "chosen": None if i is None else settings[i].to_dict(),
                **{k: cert[k] for k in ("bound", "delta", "loss", "n_dev")},
            },
            "by_profile": {
                name: {"source": p["source"], "replay": p["replay"], "bound": p["certificate"]["bound"]}
                for name, p in per.items()
            },
        }
    return efforts, evidence


def profile_exits(by_profile: dict[str, dict]) -> dict[str, dict]:
    """The calibrated file's `by_profile`: what the plugin and the evaluation read (sampling, exit)."""
    return {name: {"sampling": p["sampling"], "exit": p["exit"]} for name, p in by_profile.items()}


def main(
    config: str,
    output: str | None = None,
    limit: int | None = None,
    as_json: bool = False,
    prompts: str | None = None,
    prompt_column: str | None = None,
    **sampling,
) -> int:
    """`specexit calibrate`; `sampling`: `load_calibrate_config`'s samples / temperatures / top_p / top_k."""
    from pipelines.calibrate.config import load_calibrate_config

    cfg = load_calibrate_config(
        config, output=output, limit=limit, prompts=prompts, prompt_column=prompt_column, **sampling
    )
    out = run_calibration(cfg)
    stop_ray_quietly()
    if as_json:  # one line, the last one: engine actors' logs also reach this stdout
        print(json.dumps(out), flush=True)
    else:
        c = out["calibration"]
        acc = "agreement with EAGLE-3's own answers" if c["graded_against"] == "natural_end" else "accuracy"
        print(f"chosen exit: {json.dumps(out['exit'])}")
        for e in out["calibration"]["at_grid_edge"]:
            print(f"warning: {e}: widen the grid (a better setting may lie beyond it)")
        print(
            f"replay on {c['n_traces']} dev traces: {acc} {c['chosen_replay']['accuracy']:.3f} "
            f"(eagle3 {c['eagle3']['accuracy']:.3f}, tolerance {c['tolerance']}), think tokens "
            f"{c['chosen_replay']['think_tokens']:.1f} (eagle3 {c['eagle3']['think_tokens']:.1f}, default "
            f"{c['default']['think_tokens']:.1f}, oracle {c['oracle']['think_tokens']:.1f})"
        )
        k = c["certificate"]
        print(
            f"certificate (Learn then Test, {k['loss']} loss, epsilon {k['epsilon']}, delta {k['delta']}, "
            f"{k['n_order']} dev prompts to order, {k['n_test']} to test): "
            + (
                f"certified {json.dumps(k['chosen'])}, loss <= {k['bound']:.4f}"
                if k["chosen"] is not None
                else "no setting certified"
            )
            + f"; chosen by {c['selection']}"
        )
        if "confirmed" in c:
            print(f"confirmed with the engine: {json.dumps(c['confirmed'])}")
        print(f"wrote {cfg.output}  (use: SPECEXIT_EXIT_CONFIG={cfg.output})")
    return 0
