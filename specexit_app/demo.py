"""`specexit demo`: the whole SpecExit loop on one machine, stage after stage, in one local Ray cluster.

    traces (Ray Data + vLLM) -> labels (Ray Data + vLLM probes) -> draft (Ray Train)
    -> calibration (dev split) -> SpecExit on Ray Serve (OpenAI endpoint, queried with `openai`)
    -> evaluation of every method (Ray Data + vLLM) -> report (Markdown + PNG)

Every stage is the standalone job (`python -m pipelines.<stage>`, `specexit calibrate`, `serve run`)
called in-process with its config from `examples/toy/demo.yaml` pointed at one work folder. The
last stdout line with `--json` is `{"methods": {name: {SUMMARY_FIELDS}}}` for the greedy run.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from pipelines.common.provenance import provenance
from pipelines.stages import load_stage_config
from specexit_app.demo_config import DemoConfig
from specexit_core.typed_config import load_config, read_yaml

log = logging.getLogger("specexit.demo")
SUMMARY_METHODS = (
    "plain",
    "eagle3",
    "specexit",
    "specexit_paper",
    "budget",
    "deer",
    "dynasor",
    "nothink",
    "oracle",
)
# The methods the evaluation runs on every sample of a problem (`DemoConfig.eval_samples`): the comparison
# the certified exit is judged by (SpecExit against EAGLE-3 and the oracle); the peers run on the first.
EVAL_SAMPLE_METHODS = ("eagle3", "specexit", "oracle", "effort")
# accuracy_ci95: [low, high], 95% bootstrap over problems; accuracy_vs_eagle3: the paired
# difference in points with its interval ({"points", "ci95", "n"}; null for eagle3 itself);
# speedup_vs_eagle3: eagle3's latency over the method's on the timed problems, with its paired
# interval ({"ratio", "ci95", "n"}; null for eagle3 itself)
SUMMARY_FIELDS = (
    "accuracy",
    "accuracy_ci95",
    "accuracy_vs_eagle3",
    "think_tokens",
    "latency_s",
    "probe_requests",
    "speedup_vs_eagle3",
)


class Stages:
    """The demo's stages; each returns a small dict that goes into `<workdir>/demo.json`."""

    def __init__(self, cfg: DemoConfig):
        self.cfg = cfg
        self.wd = Path(cfg.workdir)
        self.draft = str(self.wd / "draft")

    def traces(self) -> dict:
        from pipelines.traces.job import run

        raw = read_yaml(self.cfg.traces)
        raw["input"] = {**raw.get("input", {}), "n": max(self.cfg.problems, raw.get("input", {}).get("n", 0))}
        return run(load_stage_config("traces", None, raw=raw, output=str(self.wd / "traces"), limit=self.cfg.problems))

    def labels(self) -> dict:
        from pipelines.labels.job import run

        return run(
            load_stage_config(
                "labels",
                None,
                raw=read_yaml(self.cfg.labels),
                input=str(self.wd / "traces"),
                output=str(self.wd / "labels"),
            )
        )

    def train_draft(self) -> dict:
        from pipelines.train_draft.job import run
        from specexit_core.draft.checkpoint import convert
        from specexit_core.toy.paths import DRAFT_DIR

        raw = read_yaml(self.cfg.train_draft)
        raw.update(steps=self.cfg.train_steps, run_name="demo-draft", storage_path=str(self.wd / "ray_train"))
        if self.cfg.init_draft == "stock":
            stock = self.wd / "stock_eagle3"  # the shipped head without its signal rows
            if not (stock / "model.safetensors").exists():
                convert(DRAFT_DIR, stock, add_signals=False)
            raw["init_draft"] = str(stock)
        return run(load_stage_config("train_draft", None, raw=raw, input=str(self.wd / "labels"), output=self.draft))

    def calibrate(self) -> dict:
        from pipelines.calibrate.config import CalibrateConfig
        from pipelines.calibrate.job import run_calibration

        calibrated = self.wd / "calibrated.json"
        out = finished_calibration(calibrated, self.draft)
        if out is not None:  # a rerun: its dev run cannot be resumed (the draft now carries the exit)
            log.info(
                "[demo] calibrate: %s is this draft's calibration (it carries the exit); nothing to do", calibrated
            )
            return calibration_brief(out)
        raw = read_yaml(self.cfg.calibrate)
        raw["write_draft_defaults"] = True  # the served and evaluated draft then uses the chosen setting
        raw["confirm"] = self.cfg.calibrate_confirm
        raw["temperatures"] = self.cfg.temperatures  # calibrated where it is evaluated
        if self.cfg.calibrate_peers is not None:
            raw["peers"] = self.cfg.calibrate_peers
        if self.cfg.calibrate_selection is not None:
            raw["selection"] = self.cfg.calibrate_selection
        ev = raw.setdefault("eval", {})
        ev.update(draft=self.draft, output=str(self.wd / "calibrate" / "dev"))
        if self.cfg.calibrate_samples > 1:
            ev["samples"] = self.cfg.calibrate_samples
        ev["input"] = {**ev.get("input", {}), "n": self.cfg.calibrate_problems}
        if self.cfg.eval_concurrency is not None:
            ev["concurrency"] = self.cfg.eval_concurrency
        out = run_calibration(
            load_config(CalibrateConfig, raw=raw, what="calibrate", overrides={"output": str(calibrated)})
        )
        return calibration_brief(out)

    def serve_max_tokens(self) -> int:
        """The endpoint requests' budget: the evaluation stage's `max_tokens`, the one place a recipe
        says how long its teacher's thinking and answer may run (toy 400, qwen3-like 700)."""
        from pipelines.evaluate.config import EvalConfig

        return int(read_yaml(self.cfg.evaluate).get("max_tokens", EvalConfig.model_fields["max_tokens"].default))

    def serve(self) -> dict:
        from specexit_app.demo_serve import serve_and_query

        out = self.wd / "serve.json"
        n, max_tokens = self.cfg.serve_requests, self.serve_max_tokens()
        identity = serve_identity(self.cfg.serve, self.draft, n, max_tokens)
        done = finished_serve(out, identity)
        if done is not None:  # a rerun: this draft's endpoint was checked with these requests already
            log.info("[demo] serve: %s is this draft's endpoint check (same app, same requests); nothing to do", out)
            return done
        return serve_and_query(
            self.cfg.serve,
            draft=self.draft,
            port=self.cfg.serve_port,
            n=n,
            max_tokens=max_tokens,
            out=out,
            identity=identity,
        )

    def evaluate(self) -> dict:
        from pipelines.evaluate.config import EvalConfig
        from pipelines.evaluate.job import run_evaluation
        from pipelines.report.job import write_report

        raw = read_yaml(self.cfg.evaluate)
        # the draft's exit_defaults are the calibrated setting (stage 4), so `specexit` = calibrated;
        # the calibrated file also sets the peers (DEER, Dynasor, budget) as chosen on the dev split
        raw.update(
            draft=self.draft,
            temperatures=self.cfg.temperatures,
            calibrated=str(self.wd / "calibrated.json"),
            specexit_exit=None,
            # effort: SpecExit at each reasoning effort level
            methods=[*SUMMARY_METHODS, *(["effort"] if self.cfg.eval_efforts else [])],
        )
        raw["input"] = {**raw.get("input", {}), "n": self.cfg.eval_problems}
        if self.cfg.eval_efforts:
            raw["efforts"] = list(self.cfg.eval_efforts)
        if self.cfg.eval_samples > 1:
            raw.update(
                samples=self.cfg.eval_samples,
                sample_methods=[m for m in EVAL_SAMPLE_METHODS if m in raw["methods"]],
            )
            if self.cfg.eval_peer_problems is not None and self.cfg.eval_peer_problems < self.cfg.eval_problems:
                raw["peer_problems"] = self.cfg.eval_peer_problems
        if self.cfg.eval_latency_problems is not None:
            raw["latency_problems"] = self.cfg.eval_latency_problems
        if self.cfg.eval_budget_sweep is not None:
            raw["budget_sweep"] = self.cfg.eval_budget_sweep
        if self.cfg.eval_concurrency is not None:
            raw["concurrency"] = self.cfg.eval_concurrency
        summary = run_evaluation(
            load_config(EvalConfig, raw=raw, what="evaluate", overrides={"output": str(self.wd / "eval")})
        )
        summary["report"] = str(write_report(self.wd / "eval", self.wd / "report"))
        return summary


def finished_calibration(calibrated: Path, draft: str) -> dict | None:
    """The calibrated file of a finished calibrate stage for this draft, else None: the file exists and
    the draft carries its settings (`write_draft_defaults` is the stage's last step: exit, per profile,
    per effort level). A draft trained again no longer carries them, and is calibrated again."""
    from specexit_core.draft.config import read_specexit_fields

    try:
        out = json.loads(calibrated.read_text())
        fields = read_specexit_fields(json.loads((Path(draft) / "config.json").read_text()))
    except (OSError, ValueError):
        return None
    carried = (fields.exit_defaults, fields.exit_profiles, fields.exit_efforts)
    written = (out.get("exit"), out.get("by_profile"), out.get("efforts"))
    return out if "calibration" in out and fields.exit_defaults is not None and carried == written else None


def serve_identity(serve_yaml: str, draft: str, n: int, max_tokens: int) -> dict:
    """What the serve stage's endpoint check depends on: the draft's content (the calibrated exit it
    carries included), the application the serve config builds around it, and the requests sent; not
    the port."""
    from pipelines.common.run_identity import model_fingerprint
    from specexit_app.demo_serve import app_args

    return {
        "draft": model_fingerprint(draft),
        "app": app_args(serve_yaml, draft)[1],
        "problems": n,  # each asked with SpecExit off and on
        "max_tokens": max_tokens,
    }


def finished_serve(out: Path, identity: dict) -> dict | None:
    """The summary in `out` (serve.json) of a finished serve stage with this identity, else None: a rerun
    over a finished work folder does not start the endpoint again for the same check."""
    try:
        saved = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("identity") != identity or not saved.get("complete"):
        return None
    return {k: v for k, v in saved.items() if k not in ("identity", "rows")}


def calibration_brief(out: dict) -> dict:
    """What demo.json keeps of a calibrated file."""
    c = out["calibration"]
    return {
        "exit": out["exit"],
        "eagle3": c["eagle3"],
        "oracle": c["oracle"],
        "chosen_replay": c["chosen_replay"],
        "confirmed": c.get("confirmed"),
        "at_grid_edge": c.get("at_grid_edge"),
        "peers": out.get("peers"),  # DEER / Dynasor / budget settings chosen on the same dev split
        # Learn then Test's certificate on the same dev split (pipelines/calibrate/certificate.py)
        "certificate": {
            "selection": c["selection"],
            **{k: c["certificate"][k] for k in ("epsilon", "delta", "loss", "n_dev", "chosen", "bound")},
        },
        # each sampling profile's setting (the engines pick it by how a request samples) and its
        # certified bound (None: nothing certified there)
        "by_profile": {
            name: {"setting": p["exit"], "bound": p["certificate"]["bound"], "replay": p["replay"]}
            for name, p in c["by_profile"].items()
        },
    }


ORDER = ("traces", "labels", "train_draft", "calibrate", "serve", "evaluate")


def run_demo(cfg: DemoConfig, *, fresh: bool = False) -> dict:
    """Run every stage; returns {"methods": ..., "stages": {name: {seconds, ...}}, ...}."""
    from pipelines.common.config import RayConfig
    from pipelines.common.runtime import init_ray
    from serve_app.proxy_readiness import patient_proxy_readiness

    if fresh:
        shutil.rmtree(cfg.workdir, ignore_errors=True)
    wd = Path(cfg.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    patient_proxy_readiness()  # the serve stage starts Serve on this cluster, beside busy engines
    init_ray(RayConfig(num_cpus=8))
    stages = Stages(cfg)
    done: dict = {}
    for i, name in enumerate(ORDER, 1):
        log.info("[demo] stage %d/%d: %s ...", i, len(ORDER), name)
        ts = time.time()
        res = getattr(stages, name)()
        secs = round(time.time() - ts, 1)
        done[name] = {"seconds": secs, **_brief(name, res)}
        log.info("[demo] stage %d/%d: %s done in %.0fs: %s", i, len(ORDER), name, secs, json.dumps(done[name]))
        if name == "evaluate":
            evaluation = res
        elif not res.get("complete", True):
            raise RuntimeError(f"demo: stage {name} did not complete: {json.dumps(res)[:2000]}")
    by_temperature = {
        t: {m: {k: v.get(k) for k in SUMMARY_FIELDS} for m, v in d["methods"].items()}
        for t, d in evaluation["by_temperature"].items()
    }
    summary = {
        "teacher": cfg.teacher,
        "methods": {
            m: {k: evaluation["methods"].get(m, {}).get(k) for k in SUMMARY_FIELDS}
            for m in SUMMARY_METHODS
            if m in evaluation["methods"]
        },
        "temperature": evaluation["temperature"],
        "by_temperature": by_temperature,
        # a sampled temperature whose profile is more than the temperature (top-p, top-k): the same
        # methods under the profile's name (`T0.6-p0.95-k20`), the name its calibrated exit has
        "by_profile": {
            name: by_temperature[t]
            for t, name in evaluation.get("sampling_profiles", {}).items()
            if name != f"T{t}" and t in by_temperature
        },
        # SpecExit at each reasoning effort level (its certified exit): per temperature, per level
        "by_effort": {
            t: {p["setting"]: {k: p.get(k) for k in SUMMARY_FIELDS} for p in d["sweeps"].get("effort", [])}
            for t, d in evaluation["by_temperature"].items()
        },
        "budget_best": {
            t: d["methods"].get("budget", {}).get("setting") for t, d in evaluation["by_temperature"].items()
        },
        "peer_settings": evaluation.get("peer_settings"),
        # the certified exit (issue #39): epsilon, delta, the loss, the dev size, and per sampling profile
        # its setting and certified bound
        "calibration": {
            **{k: done["calibrate"]["certificate"][k] for k in ("epsilon", "delta", "loss", "n_dev")},
            "by_profile": done["calibrate"]["by_profile"],
            # per temperature: the certificate against the loss on the test problems (certificate_check.py)
            "on_test": evaluation.get("certificate_check"),
        },
        "targets": evaluation["targets"],
        "report": evaluation["report"],
        "stages": done,
        "seconds": round(time.time() - t0, 1),
        "workdir": str(wd),
        **provenance(),  # command, commit, machine, date: what docs/results/ keeps with each figure
    }
    (wd / "demo.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _brief(name: str, res: dict) -> dict:
    keep = {
        "traces": ("input_rows", "ok", "errors", "rows_per_s"),
        "labels": ("input_rows", "ok", "errors"),
        "train_draft": ("step", "loss", "resumed_from_steps"),
        "calibrate": ("exit", "at_grid_edge", "peers", "certificate", "by_profile"),
        "serve": ("requests", "reasoning_separated", "think_tokens_off", "think_tokens_on", "exits"),
        "evaluate": ("n", "ok", "errors", "complete"),
    }[name]
    return {k: res.get(k) for k in keep}


def print_table(summary: dict) -> None:
    print(f"\nSpecExit demo: {summary['seconds']:.0f}s; report: {summary['report']}")
    print("stages: " + ", ".join(f"{k} {v['seconds']:.0f}s" for k, v in summary["stages"].items()))
    for t, methods in summary["by_temperature"].items():
        print(f"\nT = {t}")
        print(
            f"{'method':16s} {'accuracy':>9s} {'95% CI':>14s} {'vs eagle3 (pts)':>22s} {'think':>7s} "
            f"{'latency ms':>11s} {'probes':>7s}"
        )
        for m, v in methods.items():
            lat = v.get("latency_s")
            print(
                f"{m:16s} {_f(v.get('accuracy'), 3):>9s} {_ci(v.get('accuracy_ci95'), 3):>14s} "
                f"{_vs(v.get('accuracy_vs_eagle3')):>22s} {_f(v.get('think_tokens'), 1):>7s} "
                f"{_f(None if lat is None else 1000 * lat, 1):>11s} {_f(v.get('probe_requests'), 1):>7s}"
            )


def _ci(ci, nd: int) -> str:
    return "-" if not ci else f"[{ci[0]:.{nd}f}, {ci[1]:.{nd}f}]"


def _vs(diff) -> str:
    return "-" if not diff else f"{diff['points']:+.1f} {_ci(diff['ci95'], 1)}"


def _f(x, nd: int) -> str:
    return "-" if x is None else f"{x:.{nd}f}"
