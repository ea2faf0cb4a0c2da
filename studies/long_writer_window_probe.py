"""A built long writer loaded with a sliding window in every layer, without training: does its accuracy stay
flat with position? (How the window was chosen: docs/longgen.md, "Stage 2".)

    python studies/long_writer_window_probe.py --model DIR --window 512 --length 4096 [--prompts 2] [--output F]

The model's config gets `use_sliding_window`, `sliding_window` W and every layer `sliding_attention` (the stock
Qwen3 way); greedy `generate` in transformers, EOS ignored, one torch thread; each output scored by
`long_writer_task.score` (fraction of steps correct, overall and per bucket of output position).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specexit_core.teachers.long_writer import load_long_writer  # noqa: E402
from specexit_core.teachers.long_writer_check import prompt_ids  # noqa: E402
from specexit_core.teachers.long_writer_task import prompts, score  # noqa: E402


def probe(model_dir: str, window: int, length: int, n_prompts: int) -> list[dict]:
    from transformers import AutoModelForCausalLM

    model, tok = load_long_writer(model_dir, threads=1)
    cfg = model.config
    cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, window, 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    windowed = AutoModelForCausalLM.from_config(cfg)
    windowed.load_state_dict(model.state_dict())
    windowed.eval()
    rows = []
    for p in prompts("test", n_prompts, seed=0):
        ids = torch.tensor([prompt_ids(tok, p)])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = windowed.generate(ids, max_new_tokens=length, min_new_tokens=length, do_sample=False)
        sc = score(p, out[0, ids.shape[1] :].tolist(), tok).to_json()
        rows.append(
            {
                "window": window,
                "length": length,
                "prompt": p.text.strip(),
                "correct": round(sc["correct"], 4),
                "buckets": {k: round(v["correct"], 3) for k, v in sc["buckets"].items()},
                "first_error_token": sc["first_error_token"],
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--window", type=int, action="append", required=True, help="repeat for several windows")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--output")
    args = ap.parse_args(argv)
    rows = [r for w in args.window for r in probe(args.model, w, args.length, args.prompts)]
    for r in rows:
        print(json.dumps(r))
    if args.output:
        Path(args.output).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
