"""Greedy generation of the toy teacher with vLLM (the CPU build here, the same code on GPUs)."""

from __future__ import annotations

from pathlib import Path

from specexit_core.vllm_env import apply_cpu_defaults, toy_llm_kwargs


def make_llm(model_dir: str | Path, **overrides):
    apply_cpu_defaults()
    from vllm import LLM

    return LLM(**toy_llm_kwargs(str(model_dir), **overrides))


def vllm_generate(
    llm, prompts: list[list[int]], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
) -> list[list[int]]:
    """Token ids of each completion (EOS excluded, like `hf_generate.generate`)."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    eos = llm.get_tokenizer().eos_token_id
    res = []
    for o in outs:
        ids = list(o.outputs[0].token_ids)
        res.append(ids[:-1] if ids and ids[-1] == eos else ids)
    return res
