"""Training levers for the exit signals, one at a time (#44 item 3): SpecExit drafts trained by the
train_draft job on the same labels with one config change each, every one measured on the same
held-out labeled traces.

    python studies/signal_ablation.py LABELS TRAIN_YAML CALIBRATE_YAML WORKDIR --held-out 64 --steps 150 \\
        --variant base= --variant 'fixed1=weighting: fixed' \\
        --variant 'fixed10=weighting: fixed, signal_weight: 10' --out OUT.json

LABELS: a labels folder (`python -m pipelines.labels`); TRAIN_YAML: the teacher's train_draft recipe
(its input, output, run and steps are replaced); CALIBRATE_YAML: the recipe whose exit grid is replayed.
`--held-out N` labeled traces (a seeded draw) are kept out of training; the rest train every variant
(WORKDIR/labels_train; each variant's run and draft under WORKDIR/<name>, resumed on a rerun). Training
traces are of the problems the built-in teachers were built on (the toy task's train split); `--test-labels`
measures each draft on labels of other problems too (`on_test_labels`: e.g. the test split's). A
variant is 'NAME=key: value, ...' over the recipe (a YAML flow mapping without its braces). One key is
the study's own, not the recipe's: `confidence_label` trains on the same probes spread over the tokens by
another rule (`CONFIDENCE_LABELS`); the measures always read the probes themselves. Two more are the
study's: `steps` (a variant trained longer than `--steps`) and `more_traces` (a labels folder, or a list
of them, whose rows join the training rows, ids already there or held out left out: the data-size lever,
measured on the same held-out and test traces).

Each draft runs over the held-out traces offline (the target in transformers, teacher-forced: the
signals the engine would record along the same tokens) and is measured as `specexit signals` measures
a run: confidence AUROC and Brier at the probed breaks, progress and remaining error, and the exit
grid replayed on the signals with the breaks' probes: its front of think tokens against accuracy
beside no exit and the oracle. `fewest_think_within_1_point` is the front's cheapest point whose
accuracy is at most 1 point below no exit's, and its ratio to the oracle's think tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import yaml

from pipelines.calibrate.config import CalibrateConfig
from pipelines.calibrate.job import draft_token_ids, grid, replay
from pipelines.calibrate.signal_quality import confidence_quality, exit_headroom, regression_quality
from pipelines.common.parts import read_all, write_part
from pipelines.common.provenance import emit_result, provenance
from pipelines.common.schemas import LABELS
from specexit_core.draft.checkpoint import load_draft
from specexit_core.labels import confidence_from_probes
from specexit_core.signals import activate
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.training.features import target_features
from specexit_core.typed_config import load_config

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.01  # "within 1 point" of no exit's accuracy
# What the confidence at a token is trained to say, from the same probes (specexit_core.labels):
# next_step: the labels job's default: a step's tokens say whether the answer forced at the break *before*
#   them was right (so the break where the exit decides says it of the previous break);
# same_step: a step's tokens, its break included, say it of the break that ends the step (where an exit
#   there would force the answer);
# settled_*: as those, of "right here and at every later break" (an exit wants an answer that stays right).
CONFIDENCE_LABELS = ("next_step", "same_step", "settled_next_step", "settled_same_step")


def split_labels(labels: str, held_out: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The ok rows of a labels folder as (train, held-out), the held-out a seeded draw of `held_out`."""
    rows = sorted((r for r in read_all(labels).to_pylist() if r["status"] == "ok"), key=lambda r: r["id"])
    held = set(random.Random(seed).sample(range(len(rows)), held_out))
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def relabel(rows: list[dict], rule: str) -> list[dict]:
    """The rows with their confidence arrays rebuilt from their probe outcomes by `rule`."""
    if rule not in CONFIDENCE_LABELS:
        raise SystemExit(f"confidence_label {rule!r}: one of {CONFIDENCE_LABELS}")
    shift = "same_step" if rule.endswith("same_step") else "next_step"
    out = []
    for r in rows:
        outcomes = [float(o) for o in r["probe_outcomes"]]
        if rule.startswith("settled_"):  # right here and at every later break: the suffix minimum
            outcomes = list(np.minimum.accumulate(outcomes[::-1])[::-1]) if outcomes else []
        conf = confidence_from_probes(
            len(r["completion_token_ids"]), r["boundaries"], outcomes, r["think_start"], r["think_end"], shift=shift
        )
        out.append({**r, "confidence": conf.tolist()})
    return out


def training_labels(wd: Path, rows: list[dict], rule: str, name: str | None = None) -> Path:
    """The training rows' folder for a confidence rule (the labels job's own rows for next_step);
    `name`: a variant's own rows (more traces), in its folder."""
    folder = (
        wd / name / "labels_train" if name else wd / ("labels_train" if rule == "next_step" else f"labels_train_{rule}")
    )
    if not folder.exists():
        write_part(folder, pa.Table.from_pylist(relabel(rows, rule) if rule != "next_step" else rows, schema=LABELS))
    return folder


def more_training_rows(folders: list[str], seen: set[str]) -> list[dict]:
    """The ok rows of more labels folders whose ids are not in `seen` (the training and held-out rows),
    each id once: the data-size lever (`more_traces`), with the same held-out and test traces."""
    out = []
    for f in folders:
        for r in read_all(f).to_pylist():
            if r["status"] == "ok" and r["id"] not in seen:
                seen.add(r["id"])
                out.append(r)
    return out


def parse_variant(text: str) -> tuple[str, dict]:
    """'NAME=key: value, key: value' (a YAML flow mapping without its braces) -> (NAME, {key: value})."""
    name, _, body = text.partition("=")
    changes = yaml.safe_load("{" + body + "}")
    if not name or any(v is None for v in changes.values()):
        raise SystemExit(f"--variant {text!r}: want 'NAME=key: value, ...' (a space after each colon)")
    return name, changes


def train(recipe: dict, labels: Path, wd: Path, name: str, steps: int, changes: dict) -> dict:
    """One variant through the train_draft job (a subprocess, as a user runs it); its summary."""
    cfg = dict(
        recipe,
        input=str(labels),
        output=str(wd / name / "draft"),
        storage_path=str(wd / "ray_train"),
        run_name=name,
        warmup_steps=min(recipe.get("warmup_steps", 10), max(1, steps // 10)),
        **changes,
        steps=steps,
        checkpoint_every=steps,
    )
    path = wd / name / "train_draft.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    p = subprocess.run(
        [sys.executable, "-m", "pipelines.train_draft", "--config", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("SPECEXIT_SUMMARY ")]
    if p.returncode != 0 or not line:
        raise SystemExit(f"train_draft {name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[-1].split(" ", 1)[1])


@torch.no_grad()
def held_out_traces(draft_dir: Path, target, rows: list[dict]) -> list[dict]:
    """The held-out rows as the replay's traces, with the draft's signals computed along their tokens."""
    draft = load_draft(draft_dir, target_embed=target.get_input_embeddings().weight, expect_signals=True).eval()
    out = []
    for r in rows:
        prompt, comp = r["prompt_token_ids"], r["completion_token_ids"]
        ids = torch.tensor([prompt + comp])
        aux, _ = target_features(target, ids, torch.ones_like(ids), draft.cfg.aux_layer_ids)
        _, raw = draft.fuse(aux[0, len(prompt) :])
        out.append(
            {
                "id": r["id"],
                "completion": comp,
                "correct": bool(r["final_correct"]),
                "think_tokens": r["think_end"] - r["think_start"],
                "signals": [tuple(v) for v in activate(raw).tolist()],
                "probes": {b: o > 0.5 for b, o in zip(r["boundaries"], r["probe_outcomes"])},
            }
        )
    return out


def break_scores(traces: list[dict]) -> list[tuple[list[float], list[bool]]]:
    """Per trace, the confidence at each probed break and whether the answer forced there is right."""
    return [([t["signals"][i][0] for i in t["probes"]], [bool(ok) for ok in t["probes"].values()]) for t in traces]


def auroc_difference(a: list, b: list, draws: int = 1000, seed: int = 0) -> dict:
    """AUROC(a) - AUROC(b) over the same traces (`break_scores` of two drafts), with a paired bootstrap
    95% interval that resamples traces (a trace's breaks are not independent of each other)."""
    from specexit_core.training.signal_quality import auroc

    def pooled(scores, idx):
        return auroc([x for i in idx for x in scores[i][0]], [y for i in idx for y in scores[i][1]])

    everything = range(len(a))
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(draws):
        idx = rng.integers(0, len(a), len(a))
        diffs.append(pooled(a, idx) - pooled(b, idx))
    lo, hi = np.nanpercentile(diffs, [2.5, 97.5])
    return {"difference": pooled(a, everything) - pooled(b, everything), "ci95": [float(lo), float(hi)]}


@torch.no_grad()
def engine_check(eval_dir: str, draft_dir: str, target) -> dict:
    """The offline signals against what the engine recorded: an evaluation's eagle3 rows (their
    `signal_confidence`, `signal_progress`, `signal_remaining`) and the same draft's signals computed here
    along the same tokens; the largest absolute difference (0: the offline traces are the engine's)."""
    from pipelines.calibrate.job import load_traces

    rows = [{"id": t["id"], "completion": t["completion"], "signals": t["signals"]} for t in load_traces(eval_dir)]
    prompts = {
        r["problem_id"]: r["prompt_token_ids"]
        for r in read_all(eval_dir, ["problem_id", "method", "prompt_token_ids"]).to_pylist()
        if r["method"] == "eagle3"
    }
    draft = load_draft(draft_dir, target_embed=target.get_input_embeddings().weight, expect_signals=True).eval()
    worst, tokens = 0.0, 0
    for r in rows:
        prompt = prompts[r["id"].split("/")[0]]
        ids = torch.tensor([prompt + r["completion"]])
        aux, _ = target_features(target, ids, torch.ones_like(ids), draft.cfg.aux_layer_ids)
        mine = activate(draft.fuse(aux[0, len(prompt) :])[1])
        engine = torch.tensor(r["signals"], dtype=mine.dtype)
        worst = max(worst, float((mine[: len(engine)] - engine).abs().max()))
        tokens += len(engine)
    return {
        "eval_dir": eval_dir,
        "draft": draft_dir,
        "traces": len(rows),
        "tokens": tokens,
        "max_abs_difference": worst,
    }


def signal_rows_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two drafts' signal rows (fc's rows after the hidden size)."""
    from safetensors.torch import load_file

    rows = [load_file(str(d / "model.safetensors"))["fc.weight"] for d in (a, b)]
    n = json.loads((a / "config.json").read_text())["hidden_size"]
    return float((rows[0][n:] - rows[1][n:]).abs().max())


def measure(traces: list[dict], draft_dir: Path, calibrate: CalibrateConfig) -> dict:
    """`specexit signals`' measures on offline traces, and the front's cheapest point within 1 point."""
    ids = draft_token_ids(str(draft_dir))
    head = exit_headroom(traces, replay(traces, grid(calibrate), ids), ids)
    floor = head["eagle3"]["accuracy"] - TOLERANCE
    best = min((p for p in head["front"] if p["accuracy"] >= floor - 1e-12), key=lambda p: p["think_tokens"])
    reg = regression_quality(traces, ids)
    conf = confidence_quality(traces)
    return {
        "confidence_auroc": conf["auroc"],
        "confidence_brier": conf["brier"],
        "breaks": conf["breaks"],
        "progress_mae": reg["progress_mae"],
        "remaining_mae_tokens": reg["remaining_mae_tokens"],
        "no_exit": head["eagle3"],
        "oracle": head["oracle"],
        "fewest_think_within_1_point": {
            "think_tokens": best["think_tokens"],
            "accuracy": best["accuracy"],
            "vs_oracle": best["think_tokens"] / head["oracle"]["think_tokens"],
            "exit": best["exit"],
        },
        "front": [{k: p[k] for k in ("think_tokens", "accuracy")} for p in head["front"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels")
    ap.add_argument("train_yaml")
    ap.add_argument("calibrate_yaml")
    ap.add_argument("workdir")
    ap.add_argument("--held-out", type=int, default=64)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--variant", action="append", required=True, help="'NAME=key: value, ...' (base= for the recipe)")
    ap.add_argument("--engine-check", metavar="EVAL_DIR:DRAFT", help="an evaluation run and its draft (engine_check)")
    ap.add_argument(
        "--test-labels", help="labels of problems the teacher was not built on: each draft measured there too"
    )
    ap.add_argument("--out")
    a = ap.parse_args()
    wd = Path(a.workdir)
    train_rows, held = split_labels(a.labels, a.held_out)
    recipe = yaml.safe_load(Path(a.train_yaml).read_text())
    calibrate = load_config(CalibrateConfig, a.calibrate_yaml, what="calibrate")
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(resolve_model(recipe["target"]), dtype=torch.float32).eval()
    test_rows = [r for r in read_all(a.test_labels).to_pylist() if r["status"] == "ok"] if a.test_labels else []
    variants, scores, test_scores = {}, {}, {}
    for text in a.variant:
        name, changes = parse_variant(text)
        rule = changes.pop("confidence_label", "next_step")
        steps = changes.pop("steps", a.steps)  # a variant may train longer (`steps: 600`)
        more = changes.pop("more_traces", [])  # labels folders whose rows join the training rows
        more_rows = more_training_rows([more] if isinstance(more, str) else more, {r["id"] for r in train_rows + held})
        rows = train_rows + more_rows
        labels = training_labels(wd, rows, rule, name if more_rows else None)
        summary = train(recipe, labels, wd, name, steps, changes)
        draft = wd / name / "draft"
        final = json.loads((draft / "specexit_train.json").read_text())["final_metrics"]
        traces = held_out_traces(draft, target, held)
        scores[name] = break_scores(traces)
        variants[name] = {
            "changes": {
                **changes,
                **({} if rule == "next_step" else {"confidence_label": rule}),
                **({} if steps == a.steps else {"steps": steps}),
                **({"more_traces": more, "training_traces": len(rows)} if more_rows else {}),
            },
            # the training's own time and last losses (a rerun finds the run finished: read from the export)
            "train_seconds": final["seconds"],
            "rerun_skipped_training": bool(summary.get("skipped")),
            "final_losses": {k: final[k] for k in ("token_loss", "confidence_loss", "progress_loss", "remaining_loss")},
            **measure(traces, draft, calibrate),
        }
        if len(scores) > 1:  # against the first variant (the recipe), on the same held-out traces
            first = next(iter(scores))
            variants[name]["confidence_auroc_vs_" + first] = auroc_difference(scores[name], scores[first])
            variants[name]["signal_rows_max_difference_vs_" + first] = signal_rows_difference(
                draft, wd / first / "draft"
            )
        if test_rows:  # the same measures on the test split's traces
            tested = held_out_traces(draft, target, test_rows)
            test_scores[name] = break_scores(tested)
            variants[name]["on_test_labels"] = measure(tested, draft, calibrate)
            if len(test_scores) > 1:
                first = next(iter(test_scores))
                variants[name]["on_test_labels"]["confidence_auroc_vs_" + first] = auroc_difference(
                    test_scores[name], test_scores[first]
                )
        print(f"{name}: " + json.dumps({k: v for k, v in variants[name].items() if k != "front"}), flush=True)
    check = engine_check(*a.engine_check.split(":"), target) if a.engine_check else None
    res = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "engine_check": check,
        "labels": a.labels,
        "train_recipe": a.train_yaml,
        "calibrate_recipe": a.calibrate_yaml,
        "traces": {"train": len(train_rows), "held_out": len(held), "test_labels": len(test_rows)},
        "test_labels": a.test_labels,
        "steps": a.steps,
        "variants": variants,
        "provenance": provenance(" ".join(sys.argv)),
    }
    emit_result(res, a.out)


if __name__ == "__main__":
    main()
