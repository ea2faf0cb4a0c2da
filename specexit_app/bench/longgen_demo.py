"""`python -m specexit_app.bench.longgen_demo`: the TokenSwift engine on the toy teacher, against plain decoding.

1. trains draft heads on the teacher's own continuations (sampled, EOS ignored, as the benchmark generates);
2. for each length and penalty setting, decodes a few test prompts greedily with plain decoding and with the
   engine (n-grams only, heads only, heads + n-grams), checks the outputs are identical, and reports tokens
   per verification forward, acceptance, the drafter's KV footprint, wall time and the speed-up.
The toy has 512 positions, so lengths stay below that; one thread, as both decoders run single-stream.
"""

from __future__ import annotations

import argparse
import json

import torch

from specexit_app.bench.longgen_toy import DEMO_PENALTY, TOY_KV, train_toy_heads
from specexit_core.longgen.diversity import distinct_n
from specexit_core.longgen.engine import LongGenConfig, LongGenEngine
from specexit_core.longgen.heads import load_heads
from specexit_core.longgen.plain import NO_PENALTY, plain_decode
from specexit_core.longgen.tree import TreeConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specexit_app.bench.longgen_demo", description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128,256,448")
    ap.add_argument("--prompts", type=int, default=3, help="test prompts per length")
    ap.add_argument("--repeats", type=int, default=2, help="times = the fastest (CPU time) of this many runs")
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--train-seqs", type=int, default=64)
    ap.add_argument("--heads", default=None, help="load trained heads from here instead of training them")
    ap.add_argument("--heads-out", default="runs/longgen/toy_heads", help="where the trained heads are saved")
    ap.add_argument("--json", action="store_true", help="end with one line {'heads': ..., 'rows': [...]}")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from specexit_core.toy import task
    from specexit_core.toy.hf_generate import load_teacher
    from specexit_core.toy.paths import TEACHER_DIR
    from specexit_core.toy.teacher_eval import prompt_ids

    model, tok = load_teacher(TEACHER_DIR)
    lengths = [int(x) for x in args.lengths.split(",")]
    eng = LongGenEngine(model, None, LongGenConfig(partial_kv=TOY_KV))
    if args.heads:
        heads, info = load_heads(args.heads, dtype=eng.target.dtype), {"loaded": args.heads}
    else:
        heads, info = _train(model, tok, eng, args, max(lengths))
    print(f"heads: {json.dumps(info)}")

    variants = {
        "ngram": (None, TreeConfig()),
        "heads": (heads, TreeConfig(ngram_top_k=0)),
        "heads+ngram": (heads, TreeConfig()),
    }
    test_prompts = [prompt_ids(tok, p) for p in task.problems("test", args.prompts)]
    rows = []
    print(
        f"{'penalty':>8} {'length':>6} {'method':>12} {'tok/fwd':>7} {'accept':>6} {'kv':>4} {'wall_s':>7} {'cpu_s':>6} {'speedup':>7} {'same':>5} {'dist':>5}"
    )
    for penalty in (NO_PENALTY, DEMO_PENALTY):
        for length in lengths:
            plain = [_fastest(args.repeats, plain_decode, eng.target, p, length, penalty=penalty) for p in test_prompts]
            plain_s = sum(r.wall_s for r in plain)
            plain_cpu = sum(r.cpu_s for r in plain)
            dist = sum(distinct_n(r.token_ids) for r in plain) / len(plain)
            rows.append(
                _row("plain", penalty, length, 1.0, 0.0, 0, (plain_s, plain_cpu), (plain_s, plain_cpu), True, dist)
            )
            for name, (h, tree_cfg) in variants.items():
                eng.heads, eng.cfg = h, LongGenConfig(tree=tree_cfg, partial_kv=TOY_KV)
                res = [_fastest(args.repeats, eng.generate, p, length, penalty=penalty) for p in test_prompts]
                acc = sum(r.stats.accepted for r in res)
                rounds = sum(r.stats.rounds for r in res)
                same = all(r.token_ids == pl.token_ids for r, pl in zip(res, plain))
                rows.append(
                    _row(
                        name,
                        penalty,
                        length,
                        (acc + rounds) / rounds,
                        acc / (rounds * len(tree_cfg.widths)),
                        max(r.stats.draft_kv_max for r in res),
                        (sum(r.wall_s for r in res), sum(r.cpu_s for r in res)),
                        (plain_s, plain_cpu),
                        same,
                        dist,
                    )
                )
            for r in rows[-1 - len(variants) :]:
                print(
                    f"{r['penalty']:>8} {r['length']:>6} {r['method']:>12} {r['tokens_per_forward']:7.2f} "
                    f"{r['acceptance']:6.2f} {r['draft_kv']:4d} {r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['speedup']:6.2f}x "
                    f"{str(r['identical_to_plain']):>5} {r['distinct_n']:5.2f}"
                )
    if args.json:
        print(json.dumps({"heads": info, "rows": rows}))
    return 0 if all(r["identical_to_plain"] for r in rows) else 1


def _train(model, tok, eng: LongGenEngine, args, length: int):
    """Heads trained on the teacher's own sampled continuations (half of them with the penalty on)."""
    return train_toy_heads(
        model, tok, eng.target, length=length, seqs=args.train_seqs, steps=args.train_steps, out=args.heads_out
    )


def _fastest(repeats: int, fn, *args, **kwargs):
    """The run with the least CPU time (outputs are deterministic: greedy)."""
    runs = [fn(*args, **kwargs) for _ in range(max(repeats, 1))]
    return min(runs, key=lambda r: r.cpu_s)


def _row(method, penalty, length, tpf, acc, kv, times, plain_times, same, dist) -> dict:
    return {
        "method": method,
        "penalty": "on" if penalty.enabled else "off",
        "length": length,
        "tokens_per_forward": tpf,
        "acceptance": acc,
        "draft_kv": kv,
        "wall_s": times[0],
        "cpu_s": times[1],
        "speedup_wall": plain_times[0] / times[0] if times[0] else 0.0,
        "speedup": plain_times[1] / times[1] if times[1] else 0.0,  # by CPU time
        "identical_to_plain": same,
        "distinct_n": dist,
    }


if __name__ == "__main__":
    raise SystemExit(main())
