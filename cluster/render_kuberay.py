"""Writes the KubeRay manifests in `cluster/kuberay/` from the project's own configs.

    python -m cluster.render_kuberay            # (re)write cluster/kuberay/**.yaml
    python -m cluster.render_kuberay --check    # exit 1 if a committed manifest is stale

Sources of truth, so the manifests cannot drift from what the rest of the project runs:
- a RayService's `serveConfigV2` is the `applications` list of the recipe's Serve config, verbatim:
  `serve_app/gpu_tp2.yaml` (the GPU app's `serve run` config) for Qwen3-4B-Thinking-2507,
  `cluster/serve/r1-llama-8b.yaml` for DeepSeek-R1-Distill-Llama-8B;
- each RayJob runs `python -m pipelines.<stage> --config <examples/gpu/... file>` and its worker
  group has exactly the GPUs that config asks for (engines x tensor parallel, or training workers).

Every manifest uses the image `${SPECEXIT_IMAGE}` (build: `cluster/Dockerfile`); apply with
`envsubst '$SPECEXIT_IMAGE' < FILE | kubectl apply -f -` (docs/runbook.md).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cluster" / "kuberay"
IMAGE = "${SPECEXIT_IMAGE}"
IMAGE_ROOT = "/home/ray/specexit"  # where cluster/Dockerfile puts the checkout
RAY_VERSION = "2.60.0"
STORAGE_CLAIM = "specexit-storage"
STORAGE_MOUNT = "/mnt/cluster_storage"
HF_HOME = f"{STORAGE_MOUNT}/hf-cache"  # one model download for every pod and every job
STAGES = ("traces", "labels", "train_draft")


@dataclass(frozen=True)
class Recipe:
    """One target model: its pipeline configs and the GPU pod shape that runs them."""

    name: str
    configs: str  # folder with traces.yaml, labels.yaml, train_draft.yaml (relative to the repo root)
    serve_config: str  # `serve run` / `serve deploy` config of the app that serves the trained draft
    gpus_per_pod: int
    cpus_per_pod: int
    memory_per_pod: str
    gpu_note: str


RECIPES = (
    Recipe("qwen3-4b", "examples/gpu", "serve_app/gpu_tp2.yaml", 4, 44, "170Gi",
           "4x 24 GB GPUs (L4 / A10G), e.g. GKE g2-standard-48"),
    Recipe("r1-llama-8b", "examples/gpu/deepseek-r1-8b", "cluster/serve/r1-llama-8b.yaml", 8, 88, "600Gi",
           "8x A100 / H100, e.g. GKE a2-highgpu-8g, EKS p4d.24xlarge"),
)

# The serving cluster: one Serve replica (TP=2) per 2-GPU worker pod.
SERVE_GPUS_PER_POD = 2
SERVE_CPUS_PER_POD = 20
SERVE_MEMORY_PER_POD = "80Gi"
SERVE_MAX_WORKER_PODS = 4


def gpus_needed(stage: str, cfg) -> int:
    """GPUs one run of the stage occupies at once (what its worker group must offer)."""
    if stage == "train_draft":
        return cfg.num_workers if cfg.use_gpu is True else 0
    return cfg.engine.tensor_parallel_size * cfg.engine.concurrency


def load_config(stage: str, path: Path):
    from pipelines.config import load_stage_config

    return load_stage_config(stage, str(path))


# -- pod templates ---------------------------------------------------------------------------------
def _volumes():
    return [
        {"name": "storage", "persistentVolumeClaim": {"claimName": STORAGE_CLAIM}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # vLLM / NCCL and Ray's object store use /dev/shm
    ]


def _mounts():
    return [{"name": "storage", "mountPath": STORAGE_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]


def _env():
    return [{"name": "HF_HOME", "value": HF_HOME}, {"name": "TOKENIZERS_PARALLELISM", "value": "false"}]


def head_group(serve: bool) -> dict:
    ports = [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
             {"containerPort": 10001, "name": "client"}, {"containerPort": 8080, "name": "metrics"}]
    if serve:
        ports.append({"containerPort": 8000, "name": "serve"})
    res = {"cpu": "8", "memory": "32Gi"}
    return {
        # The head runs the job driver, Ray Data's CPU stages and the Serve controller, never a GPU task.
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "8", "num-gpus": "0"},
        "template": {"spec": {
            "containers": [{
                "name": "ray-head", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "ports": ports, "env": _env(), "volumeMounts": _mounts(),
                "resources": {"requests": dict(res), "limits": dict(res)},
            }],
            "volumes": _volumes(),
        }},
    }


def gpu_group(name: str, gpus: int, cpus: int, memory: str, replicas: int, min_replicas: int,
              max_replicas: int) -> dict:
    res = {"cpu": str(cpus), "memory": memory, "nvidia.com/gpu": str(gpus)}
    return {
        "groupName": name, "replicas": replicas, "minReplicas": min_replicas, "maxReplicas": max_replicas,
        "rayStartParams": {},  # Ray reads CPUs / GPUs from the container limits
        "template": {"spec": {
            "containers": [{
                "name": "ray-worker", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "env": _env(), "volumeMounts": _mounts(),
                "resources": {"requests": dict(res), "limits": dict(res)},
            }],
            "volumes": _volumes(),
            # GPU node pools are usually tainted; add a nodeSelector for your accelerator if you have several.
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }},
    }


# -- manifests -------------------------------------------------------------------------------------
def rayjob(recipe: Recipe, stage: str) -> dict:
    cfg_path = f"{recipe.configs}/{stage}.yaml"
    cfg = load_config(stage, ROOT / cfg_path)
    need = gpus_needed(stage, cfg)
    pods = max(1, -(-need // recipe.gpus_per_pod))
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": f"specexit-{recipe.name}-{stage.replace('_', '-')}",
                     "labels": {"app.kubernetes.io/part-of": "specexit", "specexit/stage": stage,
                                "specexit/model": recipe.name}},
        "spec": {
            "entrypoint": f"python -m pipelines.{stage} --config {IMAGE_ROOT}/{cfg_path}",
            # A failed or preempted run is submitted again on a fresh cluster: the stage resumes from
            # the Parquet parts / Ray Train checkpoints already on the shared volume.
            "backoffLimit": 2,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": head_group(serve=False),
                "workerGroupSpecs": [gpu_group("gpu", recipe.gpus_per_pod, recipe.cpus_per_pod,
                                               recipe.memory_per_pod, pods, pods, pods)],
            },
        },
    }


def serve_applications(recipe: Recipe) -> list:
    doc = yaml.safe_load((ROOT / recipe.serve_config).read_text())
    return doc["applications"]


def rayservice(recipe: Recipe) -> dict:
    applications = serve_applications(recipe)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": f"specexit-{recipe.name}",
                     "labels": {"app.kubernetes.io/part-of": "specexit", "specexit/model": recipe.name}},
        "spec": {
            # = the `applications` of the recipe's Serve config (tests/test_cluster_kuberay.py checks it)
            "serveConfigV2": yaml.safe_dump({"applications": applications}, sort_keys=False, width=1000),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": True,  # Serve autoscaling adds / removes GPU worker pods
                "headGroupSpec": head_group(serve=True),
                "workerGroupSpecs": [gpu_group("gpu", SERVE_GPUS_PER_POD, SERVE_CPUS_PER_POD, SERVE_MEMORY_PER_POD,
                                               1, 1, SERVE_MAX_WORKER_PODS)],
            },
        },
    }


def storage() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": STORAGE_CLAIM, "labels": {"app.kubernetes.io/part-of": "specexit"}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            # A ReadWriteMany class: GKE Filestore CSI ("standard-rwx"), EKS EFS CSI (e.g. "efs-sc"), NFS.
            "storageClassName": "standard-rwx",
            "resources": {"requests": {"storage": "1Ti"}},
        },
    }


# -- files -----------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, s: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)

HEADER = ("# Generated by `python -m cluster.render_kuberay` -- edit that, not this file.\n"
          "# Apply: envsubst '$SPECEXIT_IMAGE' < {path} | kubectl apply -f -   (docs/runbook.md)\n")


def dump(doc: dict, rel: str, note: str = "") -> str:
    return HEADER.format(path=rel) + (f"# {note}\n" if note else "") + yaml.dump(
        doc, Dumper=_Dumper, sort_keys=False, width=1000)


def render() -> dict[str, str]:
    """{path relative to the repo root: text}. A recipe's RayService needs its Serve config."""
    files = {"cluster/kuberay/storage.yaml": dump(storage(), "cluster/kuberay/storage.yaml",
                                                  "Shared volume for traces, labels, checkpoints, drafts and the HF cache.")}
    for recipe in RECIPES:
        for stage in STAGES:
            rel = f"cluster/kuberay/{recipe.name}/rayjob-{stage.replace('_', '-')}.yaml"
            files[rel] = dump(rayjob(recipe, stage), rel, f"{recipe.name}, stage {stage}: {recipe.gpu_note}.")
        if (ROOT / recipe.serve_config).exists():
            rel = f"cluster/kuberay/{recipe.name}/rayservice.yaml"
            files[rel] = dump(rayservice(recipe), rel, f"serveConfigV2 = applications of {recipe.serve_config}; "
                              f"one TP=2 replica per {SERVE_GPUS_PER_POD}-GPU pod.")
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    a = ap.parse_args(argv)
    files = render()
    for recipe in RECIPES:
        if not (ROOT / recipe.serve_config).exists():
            print(f"note: {recipe.serve_config} is missing: {recipe.name}/rayservice.yaml not rendered", file=sys.stderr)
    stale = []
    for rel, text in files.items():
        p = ROOT / rel
        if a.check:
            if not p.exists() or p.read_text() != text:
                stale.append(rel)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            print(rel)
    if stale:
        print("stale (run `python -m cluster.render_kuberay`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
