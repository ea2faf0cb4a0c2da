"""What k sampled probes per break change in the labels (#44 item 2): the labels job run twice on the
same traces, once with one greedy probe per break (the recipe's) and once with `probe_sampling` (k
probes sampled at the serving settings, the label the share that answers right), compared break by
break.

    python studies/soft_probe_labels.py TRACES_YAML LABELS_YAML WORKDIR --n 64 --samples 4 \\
        --temperature 0.6 [--top-p 0.95 --top-k 20] --out OUT.json

TRACES_YAML and LABELS_YAML: the teacher's recipes (`examples/<teacher>/traces.yaml`, `labels.yaml`);
the traces of the first N problems of the recipe go to WORKDIR/traces, the two labels folders to
WORKDIR/greedy and WORKDIR/sampled (a rerun resumes them). The JSON: breaks labeled, how many of
them got a fractional label (strictly between 0 and 1), how many got another label than the greedy
probe's, the mean label of each, and each labels job's seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from pipelines.common.parts import read_all
from pipelines.common.provenance import emit_result, provenance

ROOT = Path(__file__).resolve().parents[1]


def run_stage(stage: str, cfg: dict, out: Path) -> dict:
    """A pipeline job with `cfg` writing to `out` (a subprocess, as a user runs it); its summary."""
    path = out.with_suffix(".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(cfg, output=str(out))))
    p = subprocess.run(
        [sys.executable, "-m", f"pipelines.{stage}", "--config", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("SPECEXIT_SUMMARY ")]
    if p.returncode != 0 or not line:
        raise SystemExit(f"{stage} job failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[-1].split(" ", 1)[1])


def compare(greedy: list[dict], sampled: list[dict]) -> dict:
    """Break-by-break comparison of two labels folders' ok rows (the same traces)."""
    by_id = {r["id"]: r for r in sampled if r["status"] == "ok"}
    pairs = [
        (g, s)
        for r in greedy
        if r["status"] == "ok" and r["id"] in by_id
        for g, s in zip(r["probe_outcomes"], by_id[r["id"]]["probe_outcomes"])
    ]
    n = len(pairs)
    return {
        "traces": sum(1 for r in greedy if r["status"] == "ok" and r["id"] in by_id),
        "breaks": n,
        "fractional_labels": sum(1 for _, s in pairs if 0 < s < 1),
        "labels_unlike_the_greedy_probe": sum(1 for g, s in pairs if g != s),
        "mean_label": {"greedy": sum(g for g, _ in pairs) / n, "sampled": sum(s for _, s in pairs) / n},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces_yaml")
    ap.add_argument("labels_yaml")
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=64, help="problems traced (the first N of the traces recipe)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    sampling = {"samples": a.samples, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k}
    wd = Path(a.workdir)
    traces = yaml.safe_load(Path(a.traces_yaml).read_text())
    traces["input"]["n"] = a.n
    run_stage("traces", traces, wd / "traces")
    labels = dict(yaml.safe_load(Path(a.labels_yaml).read_text()), input=str(wd / "traces"))
    runs = {
        "greedy": run_stage("labels", labels, wd / "greedy"),
        "sampled": run_stage("labels", dict(labels, probe_sampling=sampling), wd / "sampled"),
    }
    res = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "recipes": {"traces": a.traces_yaml, "labels": a.labels_yaml, "problems": a.n},
        "trace_sampling": traces["sampling"],
        "probe_sampling": sampling,
        **compare(read_all(wd / "greedy").to_pylist(), read_all(wd / "sampled").to_pylist()),
        "labels_job_seconds": {name: s["seconds"] for name, s in runs.items()},
        "provenance": provenance(" ".join(sys.argv)),
    }
    emit_result(res, a.out)


if __name__ == "__main__":
    main()
