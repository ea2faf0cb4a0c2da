"""The Ray Train worker loop: frozen target features online, the core `train_step`, DDP, checkpoints.

Each worker loads the frozen target, builds the draft (vocab maps from the driver, embeddings and
head initialised from the target), wraps `SpecExitObjective` in DDP (gloo on CPU, NCCL on GPU)
and trains on its shard of the labeled Parquet. Rank 0 writes a checkpoint every
`checkpoint_every` steps and at the end; after a worker failure (FailureConfig) or a driver rerun
with the same run name, `ray.train.get_checkpoint()` returns the latest one and training resumes
from its step. The data order after a resume is not replayed exactly (shuffles restart).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import torch

from pipelines.common.train_run import STATE, load_state, start_worker
from pipelines.common.train_run import event as _event
from pipelines.common.train_run import say as _say
from pipelines.train_draft.config import TrainDraftConfig
from specexit_core.draft.checkpoint import load_draft, save_draft
from specexit_core.draft.config import DraftConfig, vllm_default_aux_layer_ids
from specexit_core.draft.model import SpecExitDraft
from specexit_core.training.collate import collate
from specexit_core.training.length_buckets import length_buckets
from specexit_core.training.loss import LossConfig
from specexit_core.training.schedule import warmup_cosine
from specexit_core.training.step import DraftBatch, SpecExitObjective, train_step

DRAFT_SUBDIR = "draft"


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """vLLM's EAGLE-3 default (2, L//2, L-3); tiny targets must configure their own. The rule's one home
    is `vllm_default_aux_layer_ids` (published heads that name no layers get it too)."""
    return vllm_default_aux_layer_ids(n_layers)


def build_draft(
    target, cfg: TrainDraftConfig, d2t: torch.Tensor, t2d: torch.Tensor, token_ids: dict | None = None
) -> SpecExitDraft:
    """`token_ids` ({think_start, think_end, split}) go into the draft config: the vLLM plugin's
    exit policy reads them from there."""
    aux = cfg.aux_layer_ids or default_aux_layers(target.config.num_hidden_layers)
    dcfg = DraftConfig.for_target(
        target.config, aux_layer_ids=aux, draft_vocab_size=cfg.draft_vocab_size, token_ids=token_ids, layer=cfg.layer
    )
    draft = SpecExitDraft(dcfg)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    with torch.no_grad():  # embeddings frozen (vLLM may share the target's); head starts as the target's
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight.detach().float().cpu())
        rows = torch.arange(dcfg.draft_vocab_size) + d2t
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight.detach().float().cpu()[rows])
    draft.embed_tokens.weight.requires_grad_(False)
    return draft


def auto_on_gpu(flag: bool | str, device_type: str) -> bool:
    """A `bool | "auto"` config flag: "auto" is on for CUDA workers, off on CPU."""
    return device_type == "cuda" if flag == "auto" else bool(flag)


def lr_at(cfg: TrainDraftConfig, step: int) -> float:
    return warmup_cosine(cfg.lr, step, cfg.steps, cfg.warmup_steps)


def _to(batch: DraftBatch, device) -> DraftBatch:
    return DraftBatch(*(getattr(batch, f).to(device) for f in DraftBatch.__dataclass_fields__))


def _save(inner: SpecExitObjective, opt, step: int, cfg: TrainDraftConfig, metrics: dict):
    from ray.train import Checkpoint

    d = tempfile.mkdtemp(prefix="specexit-ckpt-")
    torch.save({"objective": inner.state_dict(), "optimizer": opt.state_dict(), "step": step}, os.path.join(d, STATE))
    save_draft(
        inner.draft,
        os.path.join(d, DRAFT_SUBDIR),
        include_embed=cfg.include_embed,
        extra={"specexit_train": {"step": step, **{k: metrics[k] for k in ("loss", "token_loss") if k in metrics}}},
    )
    return d, Checkpoint.from_directory(d)


def _batches(shard, cfg: TrainDraftConfig, epoch: int, step: int):
    """The worker's batches for one pass over its shard: windows of `length_buckets` batches,
    locally shuffled, each cut into batches of similar length (specexit_core/training/length_buckets.py)."""
    window = cfg.batch_size * cfg.length_buckets
    for w, nb in enumerate(
        shard.iter_batches(
            batch_size=window,
            batch_format="numpy",
            local_shuffle_buffer_size=max(4 * cfg.batch_size, 2 * window),
            local_shuffle_seed=cfg.seed + 1000 * epoch + step,
        )
    ):
        if cfg.length_buckets == 1:
            yield nb
            continue
        lengths = [len(p) + len(c) for p, c in zip(nb["prompt_token_ids"], nb["completion_token_ids"])]
        # the seed leaves the rank out: every worker takes the same length rank at the same step
        for rows in length_buckets(lengths, cfg.batch_size, cfg.seed + 1000 * epoch + step + w):
            yield {k: v[rows] for k, v in nb.items()}


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch
    from transformers import AutoModelForCausalLM

    cfg = TrainDraftConfig.model_validate(config["cfg"])
    rank, world, device = start_worker(config, cfg.threads_per_worker, cfg.seed)

    target = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=getattr(torch, cfg.target_dtype))
    target.eval().to(device)
    for p in target.parameters():
        p.requires_grad_(False)
    if config.get("init_draft"):  # fine-tune an existing draft (its vocab maps came with it)
        draft = load_draft(
            config["init_draft"],
            target_embed=target.get_input_embeddings().weight.detach().float().cpu(),
            expect_signals=True,
        ).train()
        draft.cfg = draft.cfg.replace(token_ids=config.get("token_ids"))
    else:
        draft = build_draft(
            target,
            cfg,
            torch.tensor(config["d2t"]),
            torch.tensor(config["t2d"], dtype=torch.bool),
            config.get("token_ids"),
        )
    autocast = auto_on_gpu(cfg.bf16_autocast, device.type)
    recompute = auto_on_gpu(cfg.recompute, device.type)
    objective = SpecExitObjective(
        draft,
        LossConfig(
            unroll=cfg.unroll,
            weighting=cfg.weighting,
            signal_weight=cfg.signal_weight,
            end_weight=cfg.end_weight,
            recompute=recompute,
        ),
    ).to(device)
    opt = torch.optim.AdamW(
        [p for p in objective.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0
    )

    step = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = load_state(os.path.join(d, STATE), device)
        objective.load_state_dict(state["objective"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    if rank == 0:
        _event(config.get("events"), event="start", step=step, world_size=world, resumed=ckpt is not None)
        _say(
            f"[train] rank 0/{world}: {'resuming from step ' + str(step) if ckpt else 'starting'}; "
            f"{sum(p.numel() for p in objective.parameters() if p.requires_grad) / 1e6:.2f}M trainable params; "
            f"device {device}; bf16 autocast {autocast}, recompute {recompute}"
        )

    # Learned weights exist only in "uncertainty" mode; other modes leave log_vars out of the graph.
    model = ray.train.torch.prepare_model(
        objective, parallel_strategy_kwargs={"find_unused_parameters": cfg.weighting != "uncertainty"}
    )
    inner = model.module if hasattr(model, "module") else model
    shard = ray.train.get_dataset_shard("train")
    eos = config["eos_id"]
    t0, epoch = time.time(), 0
    metrics: dict = {}
    t_data = t_step = 0.0  # where the time goes (data wait + reporting vs compute), logged with the losses
    while step < cfg.steps:
        n_batches = 0
        t_mark = time.time()
        for nb in _batches(shard, cfg, epoch, step):
            if step >= cfg.steps:
                break
            n_batches += 1
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, step)
            batch = _to(
                collate(
                    nb["prompt_token_ids"],
                    nb["completion_token_ids"],
                    nb,
                    pad_id=config["pad_id"],
                    eos_id=eos,
                    max_len=cfg.max_seq_len,
                ),
                device,
            )
            t_data += time.time() - t_mark
            t_mark = time.time()
            logs = train_step(model, opt, target, batch, grad_clip=cfg.grad_clip, autocast=autocast)
            t_step += time.time() - t_mark
            t_mark = time.time()  # from here on it counts as data/reporting time
            step += 1
            is_log = step % cfg.log_every == 0 or step == 1 or step == cfg.steps
            is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
            if not (is_log or is_ckpt):
                continue
            metrics = {k: float(v) for k, v in logs.items()}
            metrics.update(
                step=step,
                lr=lr_at(cfg, step - 1),
                epoch=epoch,
                seconds=round(time.time() - t0, 1),
                data_s=round(t_data, 2),
                compute_s=round(t_step, 2),
            )
            if rank == 0 and is_log:
                terms = " ".join(f"{k}={v:.4f}" for k, v in sorted(logs.items()))
                _say(
                    f"[train] step {step}/{cfg.steps} {terms} ({metrics['seconds']:.0f}s; data {t_data:.1f}s, "
                    f"compute {t_step:.1f}s)"
                )
            tmp, ck = _save(inner, opt, step, cfg, metrics) if (is_ckpt and rank == 0) else (None, None)
            ray.train.report(metrics, checkpoint=ck)  # a collective: every rank reports at the same steps
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
                _event(config.get("events"), event="checkpoint", step=step)
        if n_batches == 0:
            raise RuntimeError(f"rank {rank}: empty data shard; need at least {world} labeled rows")
        epoch += 1
    if rank == 0:
        _event(config.get("events"), event="end", step=step)
