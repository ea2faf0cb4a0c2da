"""Plain decoding, one target forward per token: the baseline the engine must reproduce.

The target distribution of every step is `next_token_probs`: the contextual penalty over the window, then the
temperature (greedy at 0). The engine applies the same function to its verification rows, so both decode the
same (penalised) target. `use_hf=True` runs the transformers model's own forward and cache (the strongest
identity check); otherwise `target.Target`'s forward, the one the engine uses (the fair timing baseline).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specexit_core.longgen.penalty import PenaltyConfig, penalise, window_presence
from specexit_core.longgen.target import Target

NO_PENALTY = PenaltyConfig(theta=1.0)


def next_token_logits(logits: torch.Tensor, seq: list[int], penalty: PenaltyConfig) -> torch.Tensor:
    """The penalised logits [V] after context `seq`."""
    if not penalty.enabled:
        return logits
    present = window_presence(seq, logits.shape[-1], penalty.window, logits.device)
    return penalise(logits, present, penalty.theta)


def pick(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature > 0:
        return int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
    return int(logits.argmax())


@dataclass
class PlainResult:
    token_ids: list[int]
    forwards: int
    wall_s: float
    cpu_s: float  # this process's CPU time


@torch.inference_mode()
def plain_decode(
    target: Target,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    penalty: PenaltyConfig = NO_PENALTY,
    stop_at_eos: bool = False,
    use_hf: bool = False,
) -> PlainResult:
    """Up to `max_tokens` tokens after `prompt_ids`, one target forward each (greedy at temperature 0, else
    sampled from `seed`) under the contextual `penalty`; EOS is ignored unless `stop_at_eos`. `use_hf`: the
    transformers model's own forward and cache instead of `Target`'s. The tokens, forwards and times."""
    gen = torch.Generator(device=target.device).manual_seed(seed)
    eos = target.model.config.eos_token_id
    t0, c0 = time.perf_counter(), time.process_time()
    seq = list(prompt_ids)
    step = _hf_stepper(target, seq) if use_hf else _target_stepper(target, seq, max_tokens)
    logits = step(None)
    out: list[int] = []
    forwards = 1
    while True:
        tok = pick(next_token_logits(logits, seq, penalty), temperature, gen)
        if stop_at_eos and tok == eos:
            break
        out.append(tok)
        seq.append(tok)
        if len(out) >= max_tokens:
            break
        logits = step(tok)
        forwards += 1
    return PlainResult(out, forwards, time.perf_counter() - t0, time.process_time() - c0)


def _hf_stepper(target: Target, prompt: list[int]):
    from transformers import DynamicCache

    cache, n = DynamicCache(), [0]

    def step(tok):
        ids = prompt if tok is None else [tok]
        pos = torch.arange(n[0], n[0] + len(ids), device=target.device)[None]
        o = target.model(
            input_ids=torch.tensor([ids], device=target.device), position_ids=pos, past_key_values=cache, use_cache=True
        )
        n[0] += len(ids)
        return o.logits[0, -1].float()

    return step


def _target_stepper(target: Target, prompt: list[int], max_tokens: int):
    cache = target.new_cache(len(prompt) + max_tokens + 1)
    n = [0]

    def step(tok):
        ids = prompt if tok is None else [tok]
        h = target.forward(ids, list(range(n[0], n[0] + len(ids))), cache)
        cache.commit()
        n[0] += len(ids)
        return target.logits(h[-1:])[0]

    return step
