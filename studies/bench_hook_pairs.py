"""`specexit bench hook --json` for this checkout and an earlier commit, back to back, in pairs: on a
shared machine only same-session pairs compare (load and cache state move every figure).

    python studies/bench_hook_pairs.py --before 63009d5 --pairs 3 --output docs/results/bench_hook_cpu.json

The earlier commit is checked out into a temporary git worktree (removed afterwards) and run with
this checkout's interpreter. The file's public figures (`hook_us_per_step`, `step_us_without_hook`,
`detail`, `setup`) are this checkout's last run; every run of both is kept under `pairs`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the bench's home since issue #42 (specexit_app/bench/), with its earlier one for an earlier commit
CODE = (
    "try:\n"
    "    from specexit_app.bench.hook_bench import main\n"
    "except ModuleNotFoundError:\n"
    "    from specexit_core.bench.hook_bench import main\n"
    "main()\n"
)


def bench(checkout: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run(
        [sys.executable, "-c", CODE], cwd=checkout, env=env, capture_output=True, text=True, check=True
    )
    res: dict = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            res.update(json.loads(line))
    return res


def short(res: dict) -> dict:
    d = res["detail"]
    return {
        "hook_us_min": {n: d[n]["hook_us_min"] for n in d},
        "signals_us_min": {n: d[n]["signals_us_min"] for n in d},
        "bookkeeping_us_min": {n: round(d[n]["hook_us_min"] - d[n]["signals_us_min"], 1) for n in d},
        "hook_us_per_step": res["hook_us_per_step"],
        "step_us_without_hook": res["step_us_without_hook"],
        "load_average": res["setup"]["load_average"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the earlier commit")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old), args.before], cwd=ROOT, check=True)
        try:
            pairs = []
            for i in range(args.pairs):
                before, after = bench(old), bench(ROOT)
                pairs.append({"before": short(before), "after": short(after)})
                print(f"pair {i + 1}: hook_us_min before {pairs[-1]['before']['hook_us_min']}", file=sys.stderr)
                print(f"        after  {pairs[-1]['after']['hook_us_min']}", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    out = {
        "command": " ".join(["python", "studies/bench_hook_pairs.py", *sys.argv[1:]]),
        "commit": head.strip(),
        "before_commit": args.before,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{os.cpu_count()} shared CPU cores; load average per run under pairs[*].*.load_average",
        "what": "specexit bench hook --json, this checkout and before_commit back to back; the public "
        "figures are this checkout's last run. *_min: fastest step; signals: the hook's signal rows alone "
        "(on a GPU engine device kernels and one transfer); bookkeeping: hook minus signals (host work)",
        **after,
        "pairs": pairs,
    }
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"hook_us_per_step": after["hook_us_per_step"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
