"""The long writer in vLLM (the CPU build here): loads as a stock `Qwen3ForCausalLM` and writes past 16K.

`specexit long-writer check --engine vllm`. In the app layer, not in `specexit_core/teachers/`: core modules
reach vLLM only through its adapters (the import contract in pyproject.toml). Greedy, EOS ignored, float32 (parity with transformers),
`max_model_len` = the teacher's 20,480 positions; outputs are scored with `long_writer_task.score`.
"""

from __future__ import annotations

import time
from pathlib import Path

from specexit_core.teachers.long_writer import LONG_WRITER_DIR, MAX_MODEL_LEN
from specexit_core.teachers.long_writer_task import WalkScore, prompts, score
from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs


def make_long_writer_llm(model_dir: str | Path = LONG_WRITER_DIR, **overrides):
    apply_cpu_defaults()
    from vllm import LLM

    return LLM(**toy_llm_kwargs(str(model_dir), **{"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 8, **overrides}))


def vllm_check(llm, *, length: int = 16384, n_prompts: int = 1, seed: int = 0) -> dict:
    """Greedy outputs of `length` tokens for the first test prompts, scored; one batch."""
    from vllm import SamplingParams

    tok = llm.get_tokenizer()
    ps = prompts("test", n_prompts, seed=seed)
    sp = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": tok(p.text, add_special_tokens=False)["input_ids"]} for p in ps], sp, use_tqdm=False
    )
    wall = time.perf_counter() - t0
    rows, pooled = [], []
    for p, o in zip(ps, outs):
        ids = list(o.outputs[0].token_ids)
        sc = score(p, ids, tok)
        pooled += sc.steps
        rows.append({"prompt": p.text.strip(), "tokens": len(ids), "token_ids": ids, **sc.to_json()})
    return {"engine": "vllm", "length": length, "wall_s": wall, "prompts": rows, "pooled": WalkScore(pooled).to_json()}
