"""Cluster launch files, checked without a cloud: the `ray up` YAMLs against Ray's own cluster-config
schema and config preparation, the GPU job configs against the pipelines' typed loader and the real
models' shapes, the Dockerfile's pins. Seconds, no Ray cluster."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from support.paths import REPO_ROOT

RAY_UP = sorted((REPO_ROOT / "cluster").glob("*/*.yaml"))
RAY_UP = [p for p in RAY_UP if p.parent.name in ("aws", "gcp")]

# Shapes of the real targets (their Hugging Face config.json).
MODELS = {
    "Qwen/Qwen3-4B-Thinking-2507": {"layers": 36, "hidden": 2560, "vocab": 151936},
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": {"layers": 32, "hidden": 4096, "vocab": 128256},
}
GPU_RECIPES = {
    "examples/gpu": "Qwen/Qwen3-4B-Thinking-2507",
    "examples/gpu/deepseek-r1-8b": "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
}


def _load(p: Path) -> dict:
    return yaml.safe_load(p.read_text())


def test_there_are_aws_and_gcp_clusters_for_both_models():
    names = {f"{p.parent.name}/{p.stem}" for p in RAY_UP}
    assert names == {"aws/qwen3-4b", "aws/r1-llama-8b", "gcp/qwen3-4b", "gcp/r1-llama-8b"}


@pytest.mark.parametrize("path", RAY_UP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ray_up_yaml_validates_against_rays_schema(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = _load(path)
    validate_config(cfg)  # ray-schema.json (jsonschema) + Ray's own cross-field checks
    prepared = prepare_config(copy.deepcopy(cfg))  # what `ray up` does next: defaults, docker, min/max
    validate_config(prepared)
    assert cfg["provider"]["type"] == path.parent.name


@pytest.mark.parametrize("path", RAY_UP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ray_up_yaml_shape(path):
    cfg = _load(path)
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    workers = {k: v for k, v in types.items() if k != cfg["head_node_type"]}
    # CPU head, on-demand; GPU worker types that scale from zero
    head_res = head["resources"]
    assert head_res.get("GPU", 0) == 0
    nc = head["node_config"]
    assert "InstanceMarketOptions" not in nc and "scheduling" not in nc
    assert workers and all(w["min_workers"] == 0 and w["max_workers"] <= cfg["max_workers"] for w in workers.values())
    assert any(w["max_workers"] >= 1 for w in workers.values())
    for w in workers.values():
        if cfg["provider"]["type"] == "gcp":
            assert w["resources"]["GPU"] >= 4  # GCP does not detect resources
        assert any("$RAY_HEAD_IP:/mnt/cluster_storage" in c for c in w["initialization_commands"])
    if "qwen3-4b" in path.name:  # 24 GB GPUs on spot
        spot = [
            w
            for w in workers.values()
            if w["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
            or w["node_config"].get("scheduling", {}).get("provisioningModel") == "SPOT"
        ]
        assert len(spot) == len(workers)
    # pinned stack, the project installed from the synced checkout, token auth, ports
    assert cfg["docker"]["image"] == "rayproject/ray:2.60.0-py311-gpu"
    assert cfg["file_mounts"]["/home/ray/specexit"] == "."
    assert cfg["file_mounts"]["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"
    assert cfg["file_mounts"]["/etc/specexit/api-keys"] == "~/.specexit/api-keys"  # Serve auth.api_keys_file
    assert any("pip install" in c and "/home/ray/specexit[gpu]" in c for c in cfg["setup_commands"])
    head_start = " ".join(cfg["head_start_ray_commands"])
    for flag in (
        "--port=6379",
        "--dashboard-port=8265",
        "--ray-client-server-port=10001",
        "RAY_AUTH_MODE=token",
        "--autoscaling-config=~/ray_bootstrap_config.yaml",
    ):
        assert flag in head_start
    assert "--address=$RAY_HEAD_IP:6379" in " ".join(cfg["worker_start_ray_commands"])
    assert any("/etc/exports" in c for c in cfg["initialization_commands"])  # the head serves NFS


def test_dockerfile_pins_ray_vllm_python():
    text = (REPO_ROOT / "cluster" / "Dockerfile").read_text()
    assert re.search(r"^FROM rayproject/ray:2\.60\.0-py311-gpu$", text, re.M)
    assert '"vllm==0.32.0"' in text and '"ray[serve,data,train]==2.60.0"' in text
    assert 'pip install -e "/home/ray/specexit[gpu]"' in text
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"vllm==0.32.0"' in pyproject and '"ray[serve,data,train]==2.60.0"' in pyproject  # same pins
    ignore = (REPO_ROOT / "cluster" / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


@pytest.mark.parametrize("folder", sorted(GPU_RECIPES))
def test_gpu_recipes_load_and_match_the_model(folder):
    from pipelines.stages import load_stage_config

    model = GPU_RECIPES[folder]
    shape = MODELS[model]
    t = load_stage_config("traces", str(REPO_ROOT / folder / "traces.yaml"))
    lab = load_stage_config("labels", str(REPO_ROOT / folder / "labels.yaml"))
    tr = load_stage_config("train_draft", str(REPO_ROOT / folder / "train_draft.yaml"))
    assert t.engine.model == lab.engine.model == tr.target == model
    assert t.engine.accelerator == lab.engine.accelerator == "gpu" and tr.use_gpu is True
    # the chain: traces -> labels -> train_draft, all on shared storage
    assert lab.input == t.output and tr.input == lab.output
    assert all(p.startswith("/mnt/cluster_storage/") for p in (t.output, lab.output, tr.output, tr.storage_path))
    # EAGLE-3 conventions: aux layers (2, L//2, L-3), 32k draft vocabulary, shared embedding
    n = shape["layers"]
    assert tuple(tr.aux_layer_ids) == (2, n // 2, n - 3)
    assert tr.draft_vocab_size == 32000 < shape["vocab"]
    assert tr.include_embed is False and tr.target_dtype == "bfloat16"
    # the engines fit the cluster's GPU nodes (4 GPUs for the 4B recipe, 8 for the 8B one)
    gpus = 4 if "Qwen3-4B" in model else 8
    for c in (t, lab):
        assert c.engine.tensor_parallel_size * c.engine.concurrency == gpus
        assert c.engine.max_model_len >= t.sampling.max_tokens + 1024
    assert tr.num_workers == gpus


def test_runbook_names_existing_files():
    text = (REPO_ROOT / "docs" / "runbook.md").read_text()
    for rel in sorted(set(re.findall(r"\b((?:cluster|examples|serve_app)/[\w./-]+\.(?:yaml|md|py))\b", text))):
        if rel == "serve_app/gpu_tp2.yaml" and not (REPO_ROOT / rel).exists():
            continue  # the GPU Serve config (issue #6), written in parallel
        assert (REPO_ROOT / rel).exists(), rel
