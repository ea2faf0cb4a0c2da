"""Inclusive share of each function in a py-spy profile (`py-spy record -f raw`: collapsed stacks,
one `frame;frame;... count` per line), as JSON: where a process spends its time.

    py-spy record -p PID -d 20 -r 50 -f raw -o stacks.txt --nonblocking
    python studies/summarise_pyspy.py stacks.txt --top 40 > out.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter


def inclusive_shares(lines, top: int) -> dict:
    seen_in: Counter = Counter()
    total = 0
    for line in lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        total += int(n)
        for name in {f.split(" (")[0] for f in stack.split(";")}:  # once per sample, however deep
            seen_in[name] += int(n)
    return {
        "samples": total,
        "inclusive": [{"function": k, "share": round(v / total, 3)} for k, v in seen_in.most_common(top)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stacks")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    with open(a.stacks) as f:
        print(json.dumps(inclusive_shares(f, a.top), indent=1))


if __name__ == "__main__":
    main()
