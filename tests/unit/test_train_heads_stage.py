"""The head-training stage without a cluster: its typed config (HeadTrainConfig's fields inherited, unknown
keys are errors), the example recipes, the pure batch functions, the learning-rate schedule, the run
identity / finished-run check, the export the long-generation engine loads, and one training step over a
bf16 target (the GPU recipe's autocast path) on the CPU. Seconds."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pipelines.common.parts import write_part
from pipelines.common.run_identity import RunIdentityMismatch, check_identity
from pipelines.common.schemas import TRACES, to_table
from pipelines.stages import STAGES, load_stage_config
from pipelines.train_heads.batch import pick_positions, sequences
from pipelines.train_heads.config import TrainHeadsConfig
from pipelines.train_heads.job import RECORD, export_heads, finished, identity, trainable_ids
from pipelines.train_heads.loop import autocast_for, frozen_target
from specexit_core.longgen.heads import DraftHeads, HeadsConfig, load_heads, save_heads
from specexit_core.longgen.train_heads import IGNORE, HeadTrainConfig, collect_features, heads_loss, lr_at
from specexit_core.typed_config import ConfigError
from support.paths import REPO_ROOT

BASE = {"input": "i", "output": "o", "target": "t", "run_name": "r"}
GPU = REPO_ROOT / "examples/gpu/deepseek-r1-8b"


def _load(tmp_path, **kw):
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps({**BASE, **kw}))
    return load_stage_config("train_heads", str(f))


# -- config ---------------------------------------------------------------------------------------
def test_registered_and_inherits_the_trainers_fields(tmp_path):
    assert STAGES["train_heads"] is TrainHeadsConfig and issubclass(TrainHeadsConfig, HeadTrainConfig)
    cfg = _load(tmp_path)
    for name in HeadTrainConfig.model_fields:  # one home for the defaults: the in-process trainer's config
        assert getattr(cfg, name) == HeadTrainConfig.model_fields[name].default
    assert cfg.output == str(tmp_path / "o") or cfg.output.endswith("/o")


@pytest.mark.parametrize(
    "patch,key",
    [({"stepz": 3}, "stepz"), ({"num_heads": 0}, "num_heads"), ({"lr": 0}, "lr"), ({"batch_size": 0}, "batch_size")],
)
def test_bad_keys_are_errors(tmp_path, patch, key):
    with pytest.raises(ConfigError, match=key):
        _load(tmp_path, **patch)


def test_missing_required_key_is_an_error(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps({k: v for k, v in BASE.items() if k != "target"}))
    with pytest.raises(ConfigError, match="target"):
        load_stage_config("train_heads", str(f))


def test_toy_recipe_reads_the_toy_traces(monkeypatch):
    monkeypatch.setenv("SPECEXIT_ROOT", "/data/x")
    t = load_stage_config("traces", str(REPO_ROOT / "examples/toy/traces.yaml"))
    h = load_stage_config("train_heads", str(REPO_ROOT / "examples/toy/train_heads.yaml"))
    assert h.input == t.output == "/data/x/runs/toy/traces" and h.storage_path == "/data/x/runs/ray_train"
    assert h.use_gpu is False and h.num_workers == 2 and h.target_dtype == "float32"
    assert h.max_seq_len >= t.engine.max_model_len  # whole toy traces


def test_gpu_recipe_trains_on_the_8b_teachers_traces():
    t = load_stage_config("traces", str(GPU / "traces.yaml"))
    h = load_stage_config("train_heads", str(GPU / "train_heads.yaml"))
    assert h.target == t.engine.model == "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"  # a hub id stays one
    assert h.input == t.output and all(p.startswith("/mnt/cluster_storage/") for p in (h.output, h.storage_path))
    assert h.use_gpu is True and h.target_dtype == "bfloat16" and h.num_workers == 8  # the 8-GPU node
    assert h.max_seq_len >= t.sampling.max_tokens  # the long outputs are what the heads learn from
    assert h.min_completion_tokens <= t.sampling.max_tokens and h.cache_data is False
    # the documented size of the largest tensor: full-vocabulary logits of every head at every position
    vocab = 128256
    assert h.num_heads * h.batch_positions * vocab * 4 < 7e9


# -- pure parts -----------------------------------------------------------------------------------
def test_sequences_join_prompt_and_completion_and_cut():
    assert sequences([[1, 2]], [[3, 4, 5]], None) == [[1, 2, 3, 4, 5]]
    assert sequences([[1, 2], [7]], [[3, 4, 5], [8]], 3) == [[1, 2, 3], [7, 8]]


def test_pick_positions_only_labelled_distinct_at_most_n():
    labels = torch.tensor([[5, 6, 7, IGNORE, IGNORE, 8, IGNORE, IGNORE]])
    g = torch.Generator().manual_seed(0)
    assert pick_positions(labels, 10, g).tolist() == [0, 1, 2, 5]  # fewer than n: all of them
    got = pick_positions(labels, 2, g).tolist()
    assert len(got) == 2 == len(set(got)) and set(got) <= {0, 1, 2, 5}


def test_lr_schedule_is_a_function_of_the_step():
    cfg = HeadTrainConfig(steps=100, lr=1e-3)
    assert lr_at(cfg, 0) == pytest.approx(1e-3) and lr_at(cfg, 50) == pytest.approx(5e-4)
    assert lr_at(cfg, 100) == pytest.approx(0) and lr_at(cfg, 150) == pytest.approx(0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
    for step in range(30):  # the same schedule as torch's cosine annealing
        assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(cfg, step))
        opt.step()
        sched.step()
    assert math.isclose(lr_at(cfg, 25), 1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))


# -- identity, finished runs, export --------------------------------------------------------------
def _traces(folder):
    rows = [
        {
            "id": "a",
            "status": "ok",
            "prompt_token_ids": [1, 2],
            "completion_token_ids": [3, 4],
            "num_completion_tokens": 2,
        },
        {"id": "b", "status": "ok", "prompt_token_ids": [1], "completion_token_ids": [3], "num_completion_tokens": 1},
        {"id": "c", "status": "error", "error": "x"},
        {
            "id": "d",
            "status": "ok",
            "prompt_token_ids": [1],
            "completion_token_ids": [5, 6],
            "num_completion_tokens": 2,
        },
    ]
    write_part(folder, to_table(rows, TRACES))


def test_trainable_ids_skip_errors_short_rows_and_respect_limit(tmp_path):
    _traces(tmp_path / "tr")
    cfg = _load(tmp_path, input=str(tmp_path / "tr"), min_completion_tokens=2)
    assert trainable_ids(cfg) == (["a", "b", "c", "d"], ["a", "d"])
    cfg = _load(tmp_path, input=str(tmp_path / "tr"), limit=2)
    assert trainable_ids(cfg) == (["a", "b"], ["a", "b"])


def test_identity_ignores_run_only_keys_and_refuses_other_changes(tmp_path):
    from pipelines.common.parts import part_files

    _traces(tmp_path / "tr")
    files = part_files(tmp_path / "tr")
    a = identity(_load(tmp_path, input=str(tmp_path / "tr")), files)
    b = identity(_load(tmp_path, input=str(tmp_path / "tr"), steps=900, num_workers=4, output="elsewhere"), files)
    assert a == b  # steps, workers, paths: a resume may change them
    check_identity(tmp_path / "run", a, resuming=False, what="train_heads")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps(a))
    c = identity(_load(tmp_path, input=str(tmp_path / "tr"), lr=0.01), files)
    with pytest.raises(RunIdentityMismatch, match=r"config\.lr: 0.002 -> 0.01"):
        check_identity(tmp_path / "run", c, resuming=True, what="train_heads")


def test_export_is_loadable_and_a_finished_run_is_recognised(tmp_path):
    _traces(tmp_path / "tr")
    cfg = _load(tmp_path, input=str(tmp_path / "tr"), output=str(tmp_path / "heads"), steps=7)
    from pipelines.common.parts import part_files

    ident = identity(cfg, part_files(cfg.input))
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2))
    with torch.no_grad():
        heads.heads[1].proj.weight.fill_(0.5)
    save_heads(heads, tmp_path / "ckpt")
    summary = {"run_name": "r", "step": 7, "loss": 1.5}
    training = {"target": cfg.target, "steps": 7, "loss": 1.5}
    export_heads(tmp_path / "ckpt", cfg.output, training, {"summary": summary, "run_identity": ident})
    loaded = load_heads(cfg.output)
    assert loaded.cfg.num_heads == 2 and loaded.cfg.training == training
    assert torch.equal(loaded.heads[1].proj.weight, heads.heads[1].proj.weight)
    assert finished(cfg, ident) == summary
    assert finished(cfg.model_copy(update={"steps": 8}), ident) is None  # more steps: train on
    assert finished(cfg.model_copy(update={"run_name": "other"}), ident) is None
    assert finished(cfg, {**ident, "models": {"target": "changed"}}) is None
    export_heads(tmp_path / "ckpt", cfg.output, training, {"summary": summary, "run_identity": ident})  # replaced
    assert json.loads((tmp_path / "heads" / RECORD).read_text())["summary"] == summary
    assert not list(tmp_path.glob(".heads.*"))


# -- one step over a bf16 target (the GPU recipe's dtype) --------------------------------------------
def test_a_step_over_a_bf16_target_trains_float32_heads():
    from transformers import LlamaConfig, LlamaForCausalLM

    from specexit_core.longgen.heads import heads_for

    torch.manual_seed(0)
    mcfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    target = frozen_target(LlamaForCausalLM(mcfg).to(torch.bfloat16))
    cfg = TrainHeadsConfig(**BASE, target_dtype="bfloat16", num_heads=2)
    heads = heads_for(target, cfg.num_heads).float().train()
    with torch.no_grad():
        for h in heads.heads:
            h.proj.weight.normal_(std=0.02)
    feats, labels = collect_features(target, sequences([[1, 2, 3]], [list(range(4, 30))], None), cfg.num_heads)
    idx = pick_positions(labels, 16, torch.Generator().manual_seed(0))
    with autocast_for(cfg, torch.device("cpu")):
        loss = heads_loss(heads, target.lm_head, feats[idx], labels[:, idx])
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and p.dtype == torch.float32 for p in heads.parameters())
    assert all(p.grad is None for p in target.model.parameters())  # the target stays frozen
