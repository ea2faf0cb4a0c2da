"""An EAGLE-3 draft for the long writer, trained in-process, so `specexit bench longgen --model-set long-writer`
can run its vLLM rows `eagle3` and `vllm_long` (they load `LONG_WRITER_DRAFT_DIR` as vLLM's eagle3 drafter).

The toy's recipe (`toy.draft_build`) without its labels: the frozen long writer's features and logits on its
own text (`prompt + reference walk`, `seq_len` tokens each: the walk is what the writer produces greedily),
one `train_step` of the project's objective (TTT token loss) per batch. The draft is a SpecExit draft (the
vLLM long mode runs only with the SpecExit drafter) whose signal rows are neutral: the walk has no think block,
so every token's signal labels are masked (`think_mask` False), the signal rows stay zero (confidence 0.5,
progress 0.5, remaining 0, as `draft convert --add-signals` makes them) and the signal terms are weighted 0.
The exit's token ids name two padding ids the tokenizer never emits as think markers (the exit can never
start) and the line break as the split token. Aux layers (0, 1, 2): a 3-layer target has no other choice
(`target_features` reads hidden states before the last layer; vLLM's default needs 7+ layers). The draft
vocab is the whole 240-id vocabulary (`save_draft` then writes no d2t / t2d, as vLLM wants). Training positions stop at
`seq_len`: the writer's 1,024-token window makes its features at 16K look like those of a window, but the
draft's own full-attention cache at 16K is longer than any it trained on.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

from specexit_core.teachers.long_writer import LONG_WRITER_DIR
from specexit_core.teachers.long_writer_drafters import LongWriterDraftConfig

AUX_LAYER_IDS = (0, 1, 2)
BUILD_INFO = "specexit_train.json"


def _sequences(tok, split: str, n: int, seq_len: int, seed: int) -> list[tuple[int, list[int]]]:
    """(prompt length, `seq_len` ids of prompt + reference walk) per prompt, tokenized as the bench does."""
    from specexit_core.teachers import long_writer_task as task
    from specexit_core.teachers.long_writer_check import prompt_ids

    out = []
    for p in task.prompts(split, n, seed=seed):
        n_prompt = len(prompt_ids(tok, p))
        n_lines = math.ceil(max(1, seq_len - n_prompt) / task.LINE_TOKENS) + 1
        ids = tok(p.text + p.reference(n_lines), add_special_tokens=False)["input_ids"][:seq_len]
        out.append((n_prompt, ids))
    return out


def _batch(rows):
    """Equal-length rows -> DraftBatch: token loss on the walk, signal labels masked everywhere."""
    from specexit_core.training.step import DraftBatch

    ids = torch.tensor([r[1] for r in rows])
    loss_mask = torch.ones(ids.shape)
    for i, (n_prompt, _) in enumerate(rows):
        loss_mask[i, :n_prompt] = 0
    zeros = torch.zeros(ids.shape)
    return DraftBatch(ids, torch.ones_like(ids), loss_mask, zeros, zeros, zeros, torch.zeros(ids.shape, dtype=bool))


def new_draft(target, tok):
    """A SpecExit draft for the long writer: target-shaped, full vocab, head from the target's, neutral signals."""
    from specexit_core.draft.config import DraftConfig
    from specexit_core.draft.model import SpecExitDraft

    v = target.config.vocab_size
    token_ids = {"think_start": v - 2, "think_end": v - 1, "split": [tok.convert_tokens_to_ids("\n")]}
    dcfg = DraftConfig.for_target(target.config, aux_layer_ids=AUX_LAYER_IDS, draft_vocab_size=v, token_ids=token_ids)
    draft = SpecExitDraft(dcfg)  # d2t 0, t2d all True: the draft vocab is the target's
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight.float())
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight.float())
        draft.fc.weight[dcfg.hidden_size :].zero_()
    draft.embed_tokens.weight.requires_grad_(False)
    return draft


@torch.no_grad()
def heldout_accuracy(draft, target, rows, unroll: int = 7) -> dict[str, float]:
    """Top-1 agreement of the draft with the target's greedy token per TTT step (acc_0: first draft position)."""
    from specexit_core.training.features import target_features
    from specexit_core.training.loss import LossConfig, ttt_token_loss

    batch = _batch(rows)
    aux, logits = target_features(target, batch.input_ids, batch.attention_mask, draft.cfg.aux_layer_ids)
    _, m = ttt_token_loss(draft.eval(), aux, batch.input_ids, logits, batch.loss_mask, LossConfig(unroll=unroll))
    return {k: round(v, 4) for k, v in m.items() if k.startswith("acc_")}


def train_long_writer_draft(
    out_dir: str | Path, cfg: LongWriterDraftConfig | None = None, *, target_dir: str | Path = LONG_WRITER_DIR
) -> dict:
    """Train on `cfg.seqs` train prompts (`seq_len` tokens each, `batch_size` a step), save to `out_dir` (with
    `specexit_train.json`), return what was measured: loss first/last, seconds, held-out top-1 per step."""
    from specexit_core.draft.checkpoint import save_draft
    from specexit_core.teachers.long_writer import load_long_writer
    from specexit_core.training.loss import LossConfig
    from specexit_core.training.schedule import warmup_cosine
    from specexit_core.training.step import SpecExitObjective, train_step

    cfg = cfg or LongWriterDraftConfig()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    target, tok = load_long_writer(target_dir, threads=cfg.threads)
    for prm in target.parameters():
        prm.requires_grad_(False)
    train = _sequences(tok, "train", cfg.seqs, cfg.seq_len, cfg.seed)
    held = _sequences(tok, "test", cfg.heldout, cfg.seq_len, cfg.seed + 1)
    draft = new_draft(target, tok)
    obj = SpecExitObjective(draft, LossConfig(weighting="fixed", signal_weight=0.0))
    opt = torch.optim.AdamW(
        [q for q in obj.parameters() if q.requires_grad], lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    rng, warmup, losses = random.Random(cfg.seed), max(1, cfg.steps // 10), []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(cfg.lr, step, cfg.steps, warmup)
        logs = train_step(obj, opt, target, _batch(rng.sample(train, min(cfg.batch_size, len(train)))))
        losses.append(logs["token_loss"])
    train_s = time.perf_counter() - t0
    draft.eval()
    save_draft(draft, out_dir, include_embed=True)
    info = {
        "steps": cfg.steps,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "loss_last10_mean": round(sum(losses[-10:]) / len(losses[-10:]), 4),
        "train_acc_last": {k: round(v, 4) for k, v in logs.items() if k.startswith("acc_")},
        "heldout_acc": heldout_accuracy(draft, target, held),
        "train_s": round(train_s, 1),
    }
    target_name = "the shipped long writer" if Path(target_dir) == Path(LONG_WRITER_DIR) else str(target_dir)
    settings = {**cfg.model_dump(), "target": target_name, "aux_layer_ids": list(AUX_LAYER_IDS)}
    meta = {"settings": settings, "measured": info, "torch": torch.__version__}
    (Path(out_dir) / BUILD_INFO).write_text(json.dumps(meta, indent=2) + "\n")
    return info
