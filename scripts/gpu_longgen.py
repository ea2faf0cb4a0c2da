"""TokenSwift's faithful engine on one GPU at 1K, 4K and 16K generated tokens (issue #14's GPU script).

    python3 scripts/gpu_longgen.py --out gpu_longgen.json                  # a CUDA machine, a few minutes
    python3 scripts/gpu_longgen.py --smoke --out /tmp/gpu_longgen.json     # CPU, short: checks the script

Needs PyTorch and transformers only (no vLLM, no Ray, no network) plus this checkout's pure-Python
dependencies (the lent H200 image lacks pydantic: carry its wheels, docs/runbook.md).

1. **Heads.** Trained here, on the GPU, with the GPU's plan (`teachers/long_writer_heads.py`, as `specexit
   long-writer heads` trains the shipped ones on a CPU): on the teacher's own sampled
   continuations (T = 0.7, half with the penalty on) of the long writer's train prompts; top-1 accuracy per
   head on held-out continuations.
2. **Rows.** `specexit bench longgen`'s torch rows (`plain`, `tokenswift`) on the long writer, greedy and
   T = 0.6, penalty off and on, one length at a time, shortest first; the JSON is rewritten after each
   length, and a length whose projected time (the last one's, scaled by length) would pass `--budget-s` is
   skipped with the reason recorded. The vLLM rows need vLLM (not on the lent image).

Writes `{"environment", "heads", "lengths": {N: bench result}, "rows": [...], "skipped_lengths"}`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specexit_app.bench.longgen_bench import LongGenBenchConfig, run_bench  # noqa: E402
from specexit_core.teachers.long_writer_drafters import LongWriterHeadsConfig  # noqa: E402
from specexit_core.teachers.long_writer_heads import train_long_writer_heads  # noqa: E402

FULL = dict(lengths=(1024, 4096, 16384), head_len=2048, seqs=32, steps=1000, batch_positions=8192)
SMOKE = dict(lengths=(24, 48), head_len=32, seqs=2, steps=10, batch_positions=256)


def train_heads(device: str, *, head_len: int, seqs: int, steps: int, batch_positions: int, out: Path):
    cfg = LongWriterHeadsConfig(
        head_len=head_len, seqs=seqs, steps=steps, batch_positions=batch_positions, threads=torch.get_num_threads()
    )
    return train_long_writer_heads(cfg, out, device=device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_longgen.json")
    ap.add_argument("--heads-dir", default="/tmp/long_writer_heads")
    ap.add_argument("--budget-s", type=float, default=330.0, help="time for the rows; longer lengths are skipped")
    ap.add_argument("--lengths", help="comma-separated generated-token counts (default 1024,4096,16384)")
    ap.add_argument("--smoke", action="store_true", help="CPU, short lengths: checks the script, measures nothing")
    args = ap.parse_args(argv)
    import transformers

    plan = SMOKE if args.smoke else FULL
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else list(plan["lengths"])
    if args.smoke:
        device = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --smoke on CPU)")
    else:
        device = "cuda"
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    env["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (--smoke)"
    res: dict = {"environment": env, "lengths": {}, "rows": [], "skipped_lengths": {}}
    out = Path(args.out)

    def write() -> None:
        out.write_text(json.dumps(res, indent=2) + "\n")

    t0 = time.perf_counter()
    res["heads"] = train_heads(
        device, **{k: plan[k] for k in ("head_len", "seqs", "steps", "batch_positions")}, out=Path(args.heads_dir)
    )
    print(f"heads: {json.dumps(res['heads'])}", flush=True)
    write()
    start, last = time.perf_counter(), None
    for n in sorted(lengths):
        spent = time.perf_counter() - start
        projected = None if last is None else last[1] * n / last[0]
        if projected is not None and spent + projected > args.budget_s:
            res["skipped_lengths"][str(n)] = f"projected {projected:.0f} s after {spent:.0f} s > budget {args.budget_s}"
            print(f"length {n}: skipped ({res['skipped_lengths'][str(n)]})", flush=True)
            continue
        t1 = time.perf_counter()
        cfg = LongGenBenchConfig(
            model_set="long-writer",
            heads=args.heads_dir,
            heads_out=None,
            methods=["plain", "tokenswift"],
            backends=["torch"],
            lengths=[n],
            prompts=1,
            torch_device=device,
        )
        r = run_bench(cfg, print_fn=lambda s: print(s, flush=True))
        last = (n, time.perf_counter() - t1)
        res["lengths"][str(n)] = {k: v for k, v in r.items() if k != "rows"} | {"seconds": round(last[1], 1)}
        res["rows"] += r["rows"]
        for row in r["rows"]:
            keep = ("method", "length", "temperature", "penalty", "wall_s", "speedup_vs_plain", "tokens_per_forward")
            print(json.dumps({k: row.get(k) for k in (*keep, "acceptance", "identical_to_plain")}), flush=True)
        write()
    res["total_s"] = round(time.perf_counter() - t0, 1)
    write()
    print(f"wrote {out}", flush=True)
    greedy = [r for r in res["rows"] if r.get("identical_to_plain") is not None]
    return 0 if all(r["identical_to_plain"] for r in greedy) else 1


if __name__ == "__main__":
    sys.exit(main())
