"""Batched generation with a transformers causal LM (left padding), used by the toy eval and probes."""

from __future__ import annotations

from pathlib import Path

import torch


def load_teacher(model_dir: str | Path, threads: int | None = None):
    """Load the toy teacher (or any local HF causal LM) in float32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads:
        torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    return model, tok


@torch.inference_mode()
def generate(
    model,
    tok,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 64,
) -> list[list[int]]:
    """Generate continuations (token ids, without the prompt, stopping at and excluding EOS)."""
    out: list[list[int]] = [[] for _ in prompts]
    gen = torch.Generator().manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths -> less padding
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        n = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), n), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((len(idx), n), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, n - len(prompts[i]) :] = torch.tensor(prompts[i])
            att[r, n - len(prompts[i]) :] = 1
        res = _decode_loop(model, ids, att, max_new_tokens, temperature, gen, tok.eos_token_id)
        for r, i in enumerate(idx):
            out[i] = res[r]
    return out


def _decode_loop(model, ids, att, max_new, temperature, gen, eos) -> list[list[int]]:
    """Plain KV-cached decoding; greedy when temperature == 0 (what the engines must reproduce)."""
    bsz = ids.shape[0]
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    res: list[list[int]] = [[] for _ in range(bsz)]
    done = torch.zeros(bsz, dtype=torch.bool)
    past = None
    cur_ids, cur_pos = ids, pos
    for _ in range(max_new):
        o = model(input_ids=cur_ids, attention_mask=att, position_ids=cur_pos, past_key_values=past, use_cache=True)
        past = o.past_key_values
        logits = o.logits[:, -1, :].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        else:
            nxt = logits.argmax(-1)
        for r in range(bsz):
            if not done[r]:
                t = int(nxt[r])
                if t == eos:
                    done[r] = True
                else:
                    res[r].append(t)
        if bool(done.all()):
            break
        cur_ids = nxt.unsqueeze(-1)
        cur_pos = cur_pos[:, -1:] + 1
        att = torch.cat([att, torch.ones((bsz, 1), dtype=att.dtype)], dim=-1)
    return res
