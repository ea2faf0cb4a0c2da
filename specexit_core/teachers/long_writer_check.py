"""`specexit long-writer check`: generate long outputs greedily and score every step of them.

Plain greedy decoding on `longgen.target.Target` (`plain.plain_decode`), EOS ignored, to a fixed length:
the engine the TokenSwift benchmark compares against, with a preallocated KV cache (transformers'
`DynamicCache` concatenates per token, which grows quadratic at 16K; both are ~5 ms/token at short
contexts on this CPU). Test prompts only (`long_writer_task.WalkPrompt.split`), never trained on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from specexit_core.teachers.long_writer import LONG_WRITER_DIR, load_long_writer
from specexit_core.teachers.long_writer_task import WalkPrompt, WalkScore, prompts, score

log = logging.getLogger("specexit.teachers.long_writer")


def prompt_ids(tok, prompt: WalkPrompt) -> list[int]:
    """The token ids of a walk prompt's text, as the long writer reads it (no special tokens)."""
    return tok(prompt.text, add_special_tokens=False)["input_ids"]


def check(
    model_dir: str | Path = LONG_WRITER_DIR, *, length: int = 16384, n_prompts: int = 3, seed: int = 0, threads: int = 1
) -> dict:
    """Per prompt and pooled: steps, fraction correct overall and per position bucket, generation time."""
    from specexit_core.longgen.plain import plain_decode
    from specexit_core.longgen.target import Target

    model, tok = load_long_writer(model_dir, threads=threads)
    target = Target(model)
    rows, pooled = [], []
    for p in prompts("test", n_prompts, seed=seed):
        res = plain_decode(target, prompt_ids(tok, p), length)
        sc = score(p, res.token_ids, tok)
        pooled += sc.steps
        rows.append(
            {
                "prompt": p.text.strip(),
                "tokens": len(res.token_ids),
                "wall_s": res.wall_s,
                "cpu_s": res.cpu_s,
                **sc.to_json(),
            }
        )
        log.info(
            "%s: %d tokens in %.0fs, %.4f of %d steps correct",
            p.text.strip(),
            len(res.token_ids),
            res.wall_s,
            sc.fraction_correct,
            sc.n_steps,
        )
    all_steps = WalkScore(pooled).to_json()
    all_steps.pop("first_error_token")
    return {
        "model_dir": str(model_dir),
        "length": length,
        "decoding": "greedy, plain_decode on longgen.target.Target (float32), EOS ignored",
        "threads": threads,
        "torch": torch.__version__,  # machine, date, command, commit: the caller's provenance()
        "prompts": rows,
        "pooled": all_steps,
    }


def meets_target(result: dict, floor: float = 0.95) -> bool:
    """Every bucket of every prompt at least `floor` correct (the issue's bar: 95% up to 16K)."""
    return all(b["correct"] >= floor for r in result["prompts"] for b in r["buckets"].values())


def record(model_dir: Path, result: dict) -> None:
    """Add a check's summary (per prompt: steps and correctness per bucket; pooled) to the model folder's
    `build_config.json`, keyed by engine and length, so the shipped folder says what it was measured to do."""
    import json

    path = Path(model_dir) / "build_config.json"
    meta = json.loads(path.read_text())
    summary = {k: result[k] for k in ("command", "commit", "date", "machine", "pooled") if k in result}
    summary["prompts"] = [{k: v for k, v in r.items() if k != "token_ids"} for r in result["prompts"]]
    meta.setdefault("checks", {})[f"{result.get('engine', 'target')}@{result['length']}"] = summary
    path.write_text(json.dumps(meta, indent=2) + "\n")
