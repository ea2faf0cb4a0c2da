"""`specexit toy train-draft`: teacher traces -> probe labels -> SpecExit draft, in one process.

The same stages run distributed as Ray jobs (`pipelines/`); this single-process path is what the
tests and the shipped toy draft use. ~10 min on 2 CPU cores.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from specexit_core.draft.checkpoint import save_draft
from specexit_core.draft.config import DraftConfig
from specexit_core.draft.model import SpecExitDraft
from specexit_core.draft.vocab import build_draft_vocab
from specexit_core.labels import TraceLabels, label_trace, probe_prompts, step_boundaries
from specexit_core.signals import activate
from specexit_core.toy.hf_generate import generate, load_teacher
from specexit_core.toy.task import grade, problems
from specexit_core.toy.teacher_eval import prompt_ids
from specexit_core.training.collate import SIGNAL_LABELS, collate
from specexit_core.training.loss import LossConfig
from specexit_core.training.schedule import warmup_cosine
from specexit_core.training.signal_quality import signal_metrics
from specexit_core.training.step import DraftBatch, SpecExitObjective, train_step

log = logging.getLogger("specexit.toy.train_draft")


@dataclass(frozen=True)
class DraftTrainConfig:
    seed: int = 0
    n_train: int = 1200  # train-split problems; each gives one trace
    n_heldout: int = 150  # dev-split problems for the signal metrics
    sampled_fraction: float = 0.5  # share of traces sampled at `temperature` (the rest greedy)
    temperature: float = 0.6
    max_new_tokens: int = 400
    probe_max_tokens: int = 6
    aux_layer_ids: tuple[int, int, int] = (1, 2, 3)
    draft_vocab_size: int = 160
    steps: int = 600
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 30
    unroll: int = 7
    weighting: str = "uncertainty"
    threads: int = 2
    log_every: int = 25

    @classmethod
    def from_json(cls, d: dict) -> DraftTrainConfig:
        known = {f.name for f in fields(cls)}
        bad = set(d) - known
        if bad:
            raise ValueError(f"unknown DraftTrainConfig keys {sorted(bad)}; known: {sorted(known)}")
        d = dict(d)
        if "aux_layer_ids" in d:
            d["aux_layer_ids"] = tuple(d["aux_layer_ids"])
        return cls(**d)


@dataclass
class LabeledTrace:
    prompt: list[int]
    completion: list[int]  # without EOS
    labels: TraceLabels


def make_traces(model, tok, split: str, n: int, cfg: DraftTrainConfig, seed: int) -> list[LabeledTrace]:
    """Teacher traces (greedy + sampled) with probe-based confidence labels."""
    close_id, brk = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("\n\n")
    probs = problems(split, n, seed=seed)  # type: ignore[arg-type]
    prompts = [prompt_ids(tok, p) for p in probs]
    n_s = int(n * cfg.sampled_fraction)
    comps = generate(
        model, tok, prompts[:n_s], max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed
    ) + generate(model, tok, prompts[n_s:], max_new_tokens=cfg.max_new_tokens)
    keep = [i for i, c in enumerate(comps) if close_id in c]
    log.info("%s: %d traces, %d finished", split, n, len(keep))
    all_probes, owners = [], []
    for i in keep:
        b = step_boundaries(comps[i], {brk}, 0, comps[i].index(close_id))
        for pp in probe_prompts(prompts[i], comps[i], b, [close_id, brk]):
            all_probes.append(pp)
            owners.append(i)
    t0 = time.time()
    answers = generate(model, tok, all_probes, max_new_tokens=cfg.probe_max_tokens, batch_size=128)
    log.info("%s: %d probes answered in %.0fs", split, len(all_probes), time.time() - t0)
    outcomes: dict[int, list[float]] = {i: [] for i in keep}
    for i, a in zip(owners, answers):
        outcomes[i].append(float(grade(tok.decode(a), probs[i].answer)))
    return [
        LabeledTrace(
            prompts[i],
            comps[i],
            label_trace(
                prompts[i],
                comps[i],
                outcomes[i],
                split_ids={brk},
                think_start_id=tok.convert_tokens_to_ids("<think>"),
                think_end_id=close_id,
            ),
        )
        for i in keep
    ]


def draft_batch(traces: list[LabeledTrace], pad_id: int, eos_id: int) -> DraftBatch:
    labels = {k: [getattr(t.labels, k) for t in traces] for k in SIGNAL_LABELS}
    return collate([t.prompt for t in traces], [t.completion for t in traces], labels, pad_id=pad_id, eos_id=eos_id)


def init_draft(target, cfg: DraftTrainConfig, traces: list[LabeledTrace], tok) -> SpecExitDraft:
    from specexit_core.exit import split_token_ids

    token_ids = {
        "think_start": tok.convert_tokens_to_ids("<think>"),
        "think_end": tok.convert_tokens_to_ids("</think>"),
        "split": list(split_token_ids(tok)),
    }
    dcfg = DraftConfig.for_target(
        target.config, aux_layer_ids=cfg.aux_layer_ids, draft_vocab_size=cfg.draft_vocab_size, token_ids=token_ids
    )
    draft = SpecExitDraft(dcfg)
    always = [tok.convert_tokens_to_ids(x) for x in ("</think>", "\n\n")] + [tok.eos_token_id]
    d2t, t2d = build_draft_vocab((t.completion for t in traces), dcfg.vocab_size, dcfg.draft_vocab_size, always)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    emb = target.get_input_embeddings().weight.detach().float()
    draft.embed_tokens.weight.data.copy_(emb)
    with torch.no_grad():  # start the draft head from the (tied) target head on the draft vocab
        draft.lm_head.weight.copy_(
            target.get_output_embeddings().weight.detach().float()[torch.arange(dcfg.draft_vocab_size) + d2t]
        )
    return draft


@torch.no_grad()
def heldout_signal_metrics(draft: SpecExitDraft, target, traces: list[LabeledTrace]) -> dict[str, float]:
    from specexit_core.training.features import target_features

    preds, c, p, r, m = [], [], [], [], []
    for t in traces:
        ids = torch.tensor([t.prompt + t.completion])
        aux, _ = target_features(target, ids, torch.ones_like(ids), draft.cfg.aux_layer_ids)
        _, raw = draft.fuse(aux[0, len(t.prompt) :])
        preds.append(activate(raw).numpy())
        c.append(t.labels.confidence)
        p.append(t.labels.progress)
        r.append(t.labels.remaining)
        m.append(t.labels.mask)
    cat = np.concatenate
    return signal_metrics(cat(preds), cat(c), cat(p), cat(r), cat(m))


def train_toy_draft(cfg: DraftTrainConfig, teacher_dir: Path, out_dir: Path) -> dict:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.time()
    target, tok = load_teacher(teacher_dir)
    for prm in target.parameters():
        prm.requires_grad_(False)
    train = make_traces(target, tok, "train", cfg.n_train, cfg, seed=cfg.seed)
    held = make_traces(target, tok, "dev", cfg.n_heldout, cfg, seed=cfg.seed + 1)
    draft = init_draft(target, cfg, train, tok)
    obj = SpecExitObjective(draft, LossConfig(unroll=cfg.unroll, weighting=cfg.weighting))
    params = [q for q in obj.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(cfg.seed)
    log.info(
        "draft: %.2fM trainable params; %d train traces; %d steps",
        sum(q.numel() for q in params) / 1e6,
        len(train),
        cfg.steps,
    )
    for step in range(cfg.steps):
        lr = warmup_cosine(cfg.lr, step, cfg.steps, cfg.warmup_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = draft_batch(rng.sample(train, cfg.batch_size), tok.pad_token_id, tok.eos_token_id)
        logs = train_step(obj, opt, target, batch)
        if (step + 1) % cfg.log_every == 0 or step == 0:
            log.info(
                "step %d/%d loss %.3f token_loss %.3f acc0 %.2f acc2 %.2f confidence_loss %.3f progress_loss %.3f "
                "remaining_loss %.3f (%.0fs)",
                step + 1,
                cfg.steps,
                logs["loss"],
                logs["token_loss"],
                logs["acc_0"],
                logs.get("acc_2", 0),
                logs["confidence_loss"],
                logs["progress_loss"],
                logs["remaining_loss"],
                time.time() - t0,
            )
    draft.eval()
    metrics = heldout_signal_metrics(draft, target, held)
    log.info("held-out signals: %s", metrics)
    save_draft(draft, out_dir, include_embed=True)
    meta = {"train_config": asdict(cfg), "heldout": metrics, "train_seconds": round(time.time() - t0, 1)}
    (Path(out_dir) / "specexit_train.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
