"""Where an evaluation's time went, from its log: the `[evaluate]` lines EvalWorker prints, one per
batched method per actor and one per timed problem, summed per (method, temperature) as actor-seconds.

    python studies/eval_time_by_method.py DEMO_OR_EVAL_LOG [--after "stage 6/6: evaluate"] > out.json

Ray folds some repeated actor lines ("[repeated 2x across cluster]"), so a few lines can be missing.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

LINE = re.compile(r"\[evaluate\] T=(\S+) (.+?): (\d+) problem\(s\) (batched|timed)\S* .*?in ([\d.]+)s")


def time_by_method(lines) -> dict:
    secs: dict = defaultdict(float)
    for line in lines:
        m = LINE.search(re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            temp, what, _, how, s = m.groups()
            secs[("timed problems" if how == "timed" else what.split("/")[0], temp)] += float(s)
    total = sum(secs.values())
    rows = [
        {"method": k, "temperature": t, "actor_seconds": round(v, 1), "share": round(v / total, 3)}
        for (k, t), v in sorted(secs.items(), key=lambda kv: -kv[1])
    ]
    return {"actor_seconds": round(total, 1), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--after", help="only the lines after the first one containing this text")
    a = ap.parse_args()
    with open(a.log, errors="replace") as f:
        lines = f.read().splitlines()
    if a.after:
        lines = lines[next(i for i, x in enumerate(lines) if a.after in x) :]
    print(json.dumps(time_by_method(lines), indent=1))


if __name__ == "__main__":
    main()
