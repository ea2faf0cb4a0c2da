"""Writes the KubeRay manifests in `cluster/kuberay/` and the `ray up` Serve configs in
`cluster/serve/` from the project's own configs.

    python -m cluster.render_kuberay            # (re)write cluster/kuberay/**.yaml, cluster/serve/*.yaml
    python -m cluster.render_kuberay --check    # exit 1 if a committed file is stale

Sources of truth, so these files cannot drift from what the rest of the project runs:
- `serve_app/gpu_tp2.yaml` (the GPU app's `serve run` config) is the Serve config. The Qwen3-4B
  RayService's `serveConfigV2` is its `applications` list, verbatim. `cluster/serve/<recipe>.yaml`
  are copies of it with only the fields in SERVE_OVERRIDES changed (the model, the draft the
  recipe trains, no `accelerator_type` so the 24 GB / A100 nodes of the `ray up` clusters qualify);
  the DeepSeek-R1-Distill-Llama-8B RayService serves `cluster/serve/r1-llama-8b.yaml`;
- a RayService's pods see the draft the recipe's train_draft config writes at the path the Serve
  config names (a sub-path mount of the shared volume when the two differ), and the API-key file
  the Serve config names (from the Secret `specexit-api-keys`) when auth is on;
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

from specexit_core.typed_config import read_yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cluster" / "kuberay"
SERVE_GPU_CONFIG = "serve_app/gpu_tp2.yaml"  # the GPU app's `serve run` config (issue #6)
IMAGE = "${SPECEXIT_IMAGE}"
IMAGE_ROOT = "/home/ray/specexit"  # where cluster/Dockerfile puts the checkout
RAY_VERSION = "2.60.0"
STORAGE_CLAIM = "specexit-storage"
STORAGE_MOUNT = "/mnt/cluster_storage"
HF_HOME = f"{STORAGE_MOUNT}/hf-cache"  # one model download for every pod and every job
STAGES = ("traces", "labels", "train_draft")
API_KEYS_SECRET = "specexit-api-keys"
_DELETE = object()

# cluster/serve/<recipe>.yaml = serve_app/gpu_tp2.yaml with these `applications[0].args` changes
# (nested dicts merge; _DELETE removes a key). "{draft}" is the recipe's train_draft output.
SERVE_OVERRIDES = {
    "qwen3-4b": {"model": {"draft": "{draft}", "accelerator_type": _DELETE}},
    "r1-llama-8b": {"model": {"id": "deepseek-r1-distill-llama-8b-specexit",
                              "source": "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "draft": "{draft}",
                              "accelerator_type": _DELETE, "reasoning_parser": "deepseek_r1"}},
}


@dataclass(frozen=True)
class Recipe:
    """One target model: its pipeline configs and the GPU pod shape that runs them."""

    name: str
    configs: str  # folder with traces.yaml, labels.yaml, train_draft.yaml (relative to the repo root)
    rayservice_config: str  # Serve config whose `applications` the recipe's RayService carries
    gpus_per_pod: int
    cpus_per_pod: int
    memory_per_pod: str
    gpu_note: str


RECIPES = (
    Recipe("qwen3-4b", "examples/gpu", SERVE_GPU_CONFIG, 4, 44, "170Gi",
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
    from pipelines.common.stage_cli import load_stage_config

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


def head_group(serve: bool, extra_volumes=(), extra_mounts=()) -> dict:
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
                "ports": ports, "env": _env(), "volumeMounts": _mounts() + list(extra_mounts),
                "resources": {"requests": dict(res), "limits": dict(res)},
            }],
            "volumes": _volumes() + list(extra_volumes),
        }},
    }


def gpu_group(name: str, gpus: int, cpus: int, memory: str, replicas: int, min_replicas: int,
              max_replicas: int, extra_volumes=(), extra_mounts=()) -> dict:
    res = {"cpu": str(cpus), "memory": memory, "nvidia.com/gpu": str(gpus)}
    return {
        "groupName": name, "replicas": replicas, "minReplicas": min_replicas, "maxReplicas": max_replicas,
        "rayStartParams": {},  # Ray reads CPUs / GPUs from the container limits
        "template": {"spec": {
            "containers": [{
                "name": "ray-worker", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "env": _env(), "volumeMounts": _mounts() + list(extra_mounts),
                "resources": {"requests": dict(res), "limits": dict(res)},
            }],
            "volumes": _volumes() + list(extra_volumes),
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


def trained_draft(recipe: Recipe) -> str:
    return load_config("train_draft", ROOT / recipe.configs / "train_draft.yaml").output


def _merge(base: dict, over: dict, recipe: Recipe) -> dict:
    out = dict(base)
    for k, v in over.items():
        if v is _DELETE:
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = _merge(base.get(k) or {}, v, recipe)
        else:
            out[k] = trained_draft(recipe) if v == "{draft}" else v
    return out


def serve_variant(recipe: Recipe) -> dict:
    """cluster/serve/<recipe>.yaml: serve_app/gpu_tp2.yaml with SERVE_OVERRIDES[recipe] applied."""
    doc = read_yaml(ROOT / SERVE_GPU_CONFIG)
    (app,) = doc["applications"]
    app["args"] = _merge(app["args"], SERVE_OVERRIDES[recipe.name], recipe)
    return doc


def serve_doc(recipe: Recipe) -> dict:
    if recipe.rayservice_config == SERVE_GPU_CONFIG:
        return read_yaml(ROOT / SERVE_GPU_CONFIG)
    return serve_variant(recipe)


def serve_pod_extras(recipe: Recipe, applications: list) -> tuple[list, list]:
    """Volumes and mounts the Serve replicas need beyond the shared volume."""
    volumes, mounts = [], []
    for app in applications:
        args = app.get("args") or {}
        draft = (args.get("model") or {}).get("draft")
        trained = trained_draft(recipe)
        if draft and draft != trained and not draft.startswith(STORAGE_MOUNT + "/"):
            # the Serve config reads the draft elsewhere: show it the one the recipe trained
            mounts.append({"name": "storage", "mountPath": draft, "readOnly": True,
                           "subPath": trained[len(STORAGE_MOUNT) + 1:]})
        auth = args.get("auth") or {}
        if auth.get("enabled") and auth.get("api_keys_file"):
            key_file = Path(auth["api_keys_file"])
            volumes.append({"name": "api-keys", "secret": {
                "secretName": API_KEYS_SECRET, "optional": True,  # no Secret: no keys, every request 401
                "items": [{"key": "api-keys", "path": key_file.name}]}})
            mounts.append({"name": "api-keys", "mountPath": str(key_file.parent), "readOnly": True})
    return volumes, mounts


def rayservice(recipe: Recipe) -> dict:
    applications = serve_doc(recipe)["applications"]
    vols, mounts = serve_pod_extras(recipe, applications)
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
                "headGroupSpec": head_group(serve=True, extra_volumes=vols, extra_mounts=mounts),
                "workerGroupSpecs": [gpu_group("gpu", SERVE_GPUS_PER_POD, SERVE_CPUS_PER_POD, SERVE_MEMORY_PER_POD,
                                               1, 1, SERVE_MAX_WORKER_PODS, vols, mounts)],
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
    def ignore_aliases(self, data):  # plain repeated blocks, no &id001 anchors
        return True


def _str(dumper, s: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)

HEADER = ("# Generated by `python -m cluster.render_kuberay` -- edit that, not this file.\n"
          "# Apply: envsubst '$SPECEXIT_IMAGE' < {path} | kubectl apply -f -   (docs/runbook.md)\n")


def dump(doc: dict, rel: str, note: str = "") -> str:
    return HEADER.format(path=rel) + (f"# {note}\n" if note else "") + yaml.dump(
        doc, Dumper=_Dumper, sort_keys=False, width=1000)


def _accelerator_note(applications: list) -> str:
    types = sorted({t for a in applications if (t := ((a.get("args") or {}).get("model") or {}).get("accelerator_type"))})
    return (f" Replicas ask for accelerator_type {', '.join(types)}: schedule the GPU pods on such nodes."
            if types else "")


def render() -> dict[str, str]:
    """{path relative to the repo root: text}. Needs serve_app/gpu_tp2.yaml for the Serve files."""
    files = {"cluster/kuberay/storage.yaml": dump(storage(), "cluster/kuberay/storage.yaml",
                                                  "Shared volume for traces, labels, checkpoints, drafts and the HF cache.")}
    for recipe in RECIPES:
        for stage in STAGES:
            rel = f"cluster/kuberay/{recipe.name}/rayjob-{stage.replace('_', '-')}.yaml"
            files[rel] = dump(rayjob(recipe, stage), rel, f"{recipe.name}, stage {stage}: {recipe.gpu_note}.")
    if not (ROOT / SERVE_GPU_CONFIG).exists():
        return files
    for recipe in RECIPES:
        rel = f"cluster/serve/{recipe.name}.yaml"
        changed = ", ".join(sorted(_flat(SERVE_OVERRIDES[recipe.name])))
        files[rel] = SERVE_HEADER.format(recipe=recipe.name, path=rel, changed=changed) + yaml.safe_dump(
            serve_variant(recipe), sort_keys=False, width=1000)
        rel = f"cluster/kuberay/{recipe.name}/rayservice.yaml"
        svc = rayservice(recipe)
        apps = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
        files[rel] = dump(svc, rel, f"serveConfigV2 = applications of {recipe.rayservice_config}; one TP=2 replica "
                          f"per {SERVE_GPUS_PER_POD}-GPU pod.{_accelerator_note(apps)}")
    return files


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


SERVE_HEADER = """# Serve config of the {recipe} recipe on the `ray up` clusters (docs/runbook.md, step A5):
#   serve deploy {path}
# Generated by `python -m cluster.render_kuberay` from serve_app/gpu_tp2.yaml -- edit that or
# SERVE_OVERRIDES in cluster/render_kuberay.py, not this file. Changed args: {changed}.
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    a = ap.parse_args(argv)
    files = render()
    if not (ROOT / SERVE_GPU_CONFIG).exists():
        print(f"note: {SERVE_GPU_CONFIG} is missing: cluster/serve/ and the RayServices not rendered", file=sys.stderr)
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
