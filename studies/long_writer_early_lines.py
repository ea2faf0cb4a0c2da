"""How often the long writer gets the walk's first lines right: the only lines that read the prompt.

    python studies/long_writer_early_lines.py [--model DIR] [--prompts 100] [--lines 4] [--output FILE]

Greedy (plain decoding on `longgen.target.Target`, one torch thread), `--lines` lines per test prompt (seed 7,
so not the prompts `specexit long-writer check` uses first); per line index the number of prompts whose line
follows by the rule (line 0: from the prompt), and which fields line 0 got wrong. The 16K check counts these
lines in its 0-1K bucket among 79; this probe sees them alone, over many prompts.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specexit_core.longgen.plain import plain_decode  # noqa: E402
from specexit_core.longgen.target import Target  # noqa: E402
from specexit_core.teachers.long_writer import LONG_WRITER_DIR, load_long_writer  # noqa: E402
from specexit_core.teachers.long_writer_check import prompt_ids  # noqa: E402
from specexit_core.teachers.long_writer_task import LINE_TOKENS, parse, prompts, score  # noqa: E402

FIELDS = ("H", "L", "X", "A", "Y", "B")


def early_lines(model_dir: str | Path, n_prompts: int, n_lines: int) -> dict:
    model, tok = load_long_writer(model_dir, threads=1)
    target = Target(model)
    right, wrong_fields = collections.Counter(), collections.Counter()
    for p in prompts("test", n_prompts, seed=7):
        out = plain_decode(target, prompt_ids(tok, p), LINE_TOKENS * n_lines).token_ids
        for s in score(p, out, tok).steps:
            right[s.index] += s.correct
        got, want = parse(tok.decode(out).split("\n")[0]), p.state(0)
        for name, g, w in zip(FIELDS, got or [None] * len(FIELDS), want):
            wrong_fields[name] += g != w
    return {
        "model_dir": str(model_dir),
        "prompts": n_prompts,
        "right_per_line": {str(i): right[i] for i in range(n_lines)},
        "line_0_wrong_fields": {k: v for k, v in wrong_fields.items() if v},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(LONG_WRITER_DIR))
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--lines", type=int, default=4)
    ap.add_argument("--output")
    args = ap.parse_args(argv)
    res = early_lines(args.model, args.prompts, args.lines)
    print(json.dumps(res))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
