"""Writes the KubeRay manifests in `cluster/kuberay/` and the `ray up` Serve configs in
`cluster/serve/` from the project's own configs.

    python -m cluster.render_kuberay            # (re)write cluster/kuberay/**.yaml, cluster/serve/*.yaml
    python -m cluster.render_kuberay --check    # exit 1 if a committed file is stale

Sources of truth, so these files cannot drift from what the rest of the project runs:
- `serve_app/gpu_tp2.yaml` (the GPU app's `serve run` config) is the Serve config.
  `cluster/serve/<name>.yaml` are copies of it with only the fields in SERVE_VARIANTS changed: for
  the `ray up` clusters the model, the draft the recipe trains and no `accelerator_type` (so their
  24 GB / A100 nodes qualify); for the Qwen3-4B RayService TP=1 (one H100 holds the 4B model). A
  RayService's `serveConfigV2` is the `applications` list of its recipe's file, verbatim;
- a RayService's GPU worker group is derived from that Serve config: one replica per pod (the
  replica's tensor-parallel GPUs), min..max pods = the app's min..max replicas, and a pinned
  `accelerator_type` declared as the Ray resource it becomes (`accelerator_type:H100`, so the
  KubeRay autoscaler, which learns node types from the RayCluster spec, can add pods for it) with
  a node affinity to such nodes;
- a RayService's pods see the draft the recipe's train_draft config writes at the path the Serve
  config names (a sub-path mount of the shared volume when the two differ), and the API-key file
  the Serve config names (from the Secret `specexit-api-keys`) when auth is on;
- each RayJob runs `python -m pipelines.<stage> --config <examples/gpu/... file>` and its worker
  group has exactly the GPUs that config asks for (engines x tensor parallel, or training workers);
- every Ray cluster runs with Ray token authentication (token from the Secret `specexit-ray-token`,
  never inline) and ships with a NetworkPolicy that admits only its own pods, the KubeRay operator
  (dashboard port) and, for a RayService, the ingress namespace (Serve port);
- every RayService runs with GCS fault tolerance on an external Redis (`gcsFaultToleranceOptions`,
  KubeRay >= 1.3; the CRDs of 1.6 / 1.7 / master accept it as rendered): `redisAddress` is the Service
  of `cluster/kuberay/redis.yaml` (a one-pod Redis rendered here, with a NetworkPolicy that admits
  only the RayServices' head pods and KubeRay's Redis cleanup Job), the password comes from the
  Secret `specexit-redis` (key `password`, never inline) and KubeRay passes it to the head as
  `REDIS_PASSWORD`. A head restart then keeps the job table, the Serve application and its
  replicas on the worker pods (docs/runbook.md, "When the head restarts"). For production, point
  REDIS_ADDRESS at a managed Redis with persistence and skip redis.yaml;
- the RayJobs run without it: each is one job on a cluster made for it and deleted after it. GCS
  FT restores the cluster's state, not a running driver (it runs on the head and dies with it), so
  the job fails either way; KubeRay submits it again on a fresh cluster (`backoffLimit`) and the
  stage resumes from what is on the shared volume. Redis would add a dependency and a cleanup Job
  per run for nothing.

Every manifest uses the image `${SPECEXIT_IMAGE}` (build: `cluster/Dockerfile`); apply with
`envsubst '$SPECEXIT_IMAGE' < FILE | kubectl apply -f -` (docs/runbook.md).
"""

from __future__ import annotations

import argparse
import json
import math
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

# Ray token authentication (what RAY_AUTH_MODE=token + ~/.ray/auth_token do on the `ray up` clusters):
# the token comes from this Secret, key `auth_token` (the key KubeRay's authOptions.secretName reads).
RAY_TOKEN_SECRET = "specexit-ray-token"
RAY_TOKEN_KEY = "auth_token"
# Pod label naming the RayJob / RayService a pod belongs to: the NetworkPolicy's unit of trust.
CLUSTER_LABEL = "specexit/cluster"
# The KubeRay operator's pods (label of both its Helm chart and its kustomize install): they call the
# head's dashboard port to submit Serve configs and read job / app status.
OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "kuberay-operator"}
# GCS fault tolerance of the RayServices (KubeRay gcsFaultToleranceOptions): the Redis of
# cluster/kuberay/redis.yaml, its password from this Secret (key `password`, never inline). A managed
# Redis (Memorystore, ElastiCache, ...) replaces it by changing REDIS_ADDRESS.
REDIS_NAME = "specexit-redis"  # its Deployment, Service and NetworkPolicy
REDIS_PORT = 6379
REDIS_ADDRESS = f"{REDIS_NAME}:{REDIS_PORT}"  # the Service, in the namespace the manifests are applied to
REDIS_SECRET = "specexit-redis"
REDIS_PASSWORD_KEY = "password"
REDIS_IMAGE = "redis:7.2"  # 7.2: the last BSD-licensed line; valkey/valkey:8 is a drop-in alternative
REDIS_UID = 999  # the `redis` user of the official image
REDIS_LABELS = {"app.kubernetes.io/part-of": "specexit", "app.kubernetes.io/name": REDIS_NAME}
# The pods of a RayService that talk to Redis, by the label KubeRay sets: the head (its GCS stores its
# tables there) and, when the RayService's RayCluster is deleted, KubeRay's Redis cleanup Job (a copy
# of the head pod that deletes the cluster's keys). The GPU workers never do.
REDIS_CLIENT_NODE_TYPES = ("head", "redis-cleanup")
# Namespace whose pods may call the Serve HTTP port (an ingress controller's); docs/runbook.md, part B.
SERVE_CLIENT_NAMESPACE = "ingress-nginx"
# Nodes that carry a Ray accelerator type, as node labels: any one of these (nodeAffinity terms are
# ORed) -- NVIDIA GPU feature discovery (GPU operator), GKE, and the instance type (EKS).
ACCELERATOR_NODE_LABELS = {
    "H100": {
        "nvidia.com/gpu.product": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"],
        "cloud.google.com/gke-accelerator": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
        "node.kubernetes.io/instance-type": ["p5.48xlarge", "p5.4xlarge"],
    },
}
# A serving pod's CPUs and memory per GPU it holds (one replica per pod; vLLM's host-side memory and
# the pod's share of Ray's object store).
SERVE_CPUS_PER_GPU = 10
SERVE_MEMORY_GIB_PER_GPU = 40
# a stopping serve pod gets its replicas' graceful shutdown plus this before Kubernetes kills it
POD_STOP_MARGIN_S = 30


@dataclass(frozen=True)
class ServeVariant:
    """cluster/serve/<name>.yaml: serve_app/gpu_tp2.yaml with `overrides` applied to its
    `applications[0].args` (nested dicts merge; _DELETE removes a key; "{draft}" is the output of
    `recipe`'s train_draft config)."""

    name: str
    recipe: str
    overrides: dict
    use: str  # what the file is for (its header)


SERVE_VARIANTS = (
    ServeVariant(
        "qwen3-4b",
        "qwen3-4b",
        {"model": {"draft": "{draft}", "accelerator_type": _DELETE}},
        "`serve deploy cluster/serve/qwen3-4b.yaml` on the `ray up` clusters of the qwen3-4b recipe"
        " (docs/runbook.md, step A5)",
    ),
    ServeVariant(
        "r1-llama-8b",
        "r1-llama-8b",
        {
            "model": {
                "id": "deepseek-r1-distill-llama-8b-specexit",
                "source": "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
                "draft": "{draft}",
                "accelerator_type": _DELETE,
                "reasoning_parser": "deepseek_r1",
            }
        },
        "`serve deploy cluster/serve/r1-llama-8b.yaml` on the `ray up` clusters of the r1-llama-8b recipe"
        " (docs/runbook.md, step A5);\n# also the serveConfigV2 of cluster/kuberay/r1-llama-8b/rayservice.yaml",
    ),
    # One H100 80 GB holds the 4B bf16 target (8 GB) and ~60 GB of KV cache: a replica needs one GPU,
    # so TP=2 would only halve the replicas per GPU and add an all-reduce per layer.
    ServeVariant(
        "qwen3-4b-h100",
        "qwen3-4b",
        {"model": {"tensor_parallel_size": 1}},
        "the serveConfigV2 of cluster/kuberay/qwen3-4b/rayservice.yaml (KubeRay: one H100 per replica)",
    ),
)
SERVE_VARIANT = {v.name: v for v in SERVE_VARIANTS}


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
    Recipe(
        "qwen3-4b",
        "examples/gpu",
        "cluster/serve/qwen3-4b-h100.yaml",
        4,
        44,
        "170Gi",
        "4x 24 GB GPUs (L4 / A10G), e.g. GKE g2-standard-48",
    ),
    Recipe(
        "r1-llama-8b",
        "examples/gpu/deepseek-r1-8b",
        "cluster/serve/r1-llama-8b.yaml",
        8,
        88,
        "600Gi",
        "8x A100 / H100, e.g. GKE a2-highgpu-8g, EKS p4d.24xlarge",
    ),
)


def gpus_needed(stage: str, cfg) -> int:
    """GPUs one run of the stage occupies at once (what its worker group must offer)."""
    if stage == "train_draft":
        return cfg.num_workers if cfg.use_gpu is True else 0
    return cfg.engine.tensor_parallel_size * cfg.engine.concurrency


def load_config(stage: str, path: Path):
    from pipelines.stages import load_stage_config

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
    return [
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        # Ray token auth on every node; a missing Secret keeps the pod from starting (fails closed)
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": RAY_TOKEN_SECRET, "key": RAY_TOKEN_KEY}}},
    ]


def auth_options() -> dict:
    """KubeRay >= 1.6: the operator sends this token to the dashboard (Serve configs, job status) and
    sets it in the containers it adds (autoscaler, job submitter). The env of _env() sets the same
    token in the Ray containers themselves, so an operator that drops this field cannot start them
    without auth."""
    return {"mode": "token", "secretName": RAY_TOKEN_SECRET}


def gcs_fault_tolerance() -> dict:
    """KubeRay >= 1.3 (`spec.rayClusterConfig.gcsFaultToleranceOptions`): the operator sets
    RAY_REDIS_ADDRESS, REDIS_PASSWORD (from the Secret) and `redis-password` on the head, a storage
    namespace per RayCluster (its UID), a 600 s GCS reconnect timeout on the workers, and a
    finalizer whose Job deletes the cluster's keys when the RayCluster goes. No password in the
    manifest: a missing Secret keeps the head from starting (fails closed). `backend` (KubeRay >= 1.7,
    default redis) is left out so that 1.6's CRD accepts the manifest too."""
    return {
        "redisAddress": REDIS_ADDRESS,
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": REDIS_SECRET, "key": REDIS_PASSWORD_KEY}}},
    }


def _pod_metadata(cluster: str) -> dict:
    return {"labels": {"app.kubernetes.io/part-of": "specexit", CLUSTER_LABEL: cluster}}


def head_group(cluster: str, serve: bool, extra_volumes=(), extra_mounts=()) -> dict:
    ports = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
        {"containerPort": 8080, "name": "metrics"},
    ]
    if serve:
        ports.append({"containerPort": 8000, "name": "serve"})
    res = {"cpu": "8", "memory": "32Gi"}
    return {
        # The head runs the job driver, Ray Data's CPU stages and the Serve controller, never a GPU task.
        # The dashboard listens on all interfaces for the workers, the operator and the job submitter:
        # token auth and the cluster's NetworkPolicy guard it.
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "8", "num-gpus": "0"},
        "template": {
            "metadata": _pod_metadata(cluster),
            "spec": {
                "containers": [
                    {
                        "name": "ray-head",
                        "image": IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "ports": ports,
                        "env": _env(),
                        "volumeMounts": _mounts() + list(extra_mounts),
                        "resources": {"requests": dict(res), "limits": dict(res)},
                    }
                ],
                "volumes": _volumes() + list(extra_volumes),
            },
        },
    }


def gpu_group(
    cluster: str,
    name: str,
    gpus: int,
    cpus: int,
    memory: str,
    replicas: int,
    min_replicas: int,
    max_replicas: int,
    extra_volumes=(),
    extra_mounts=(),
    accelerator_type: str | None = None,
    termination_grace_s: int | None = None,
) -> dict:
    res = {"cpu": str(cpus), "memory": memory, "nvidia.com/gpu": str(gpus)}
    spec = {
        "containers": [
            {
                "name": "ray-worker",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "env": _env(),
                "volumeMounts": _mounts() + list(extra_mounts),
                "resources": {"requests": dict(res), "limits": dict(res)},
            }
        ],
        "volumes": _volumes() + list(extra_volumes),
        # GPU node pools are usually tainted; add a nodeSelector for your accelerator if you have several.
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    start = {}  # Ray reads CPUs / GPUs from the container limits
    if accelerator_type:
        # Ray detects the type on the node and offers `accelerator_type:<type>`, but the KubeRay
        # autoscaler only knows what the group declares: without this it finds no node type for a
        # pinned replica and never adds a pod. The affinity makes the declaration true.
        start["resources"] = "'" + json.dumps({f"accelerator_type:{accelerator_type}": 1}) + "'"
        spec["affinity"] = accelerator_affinity(accelerator_type)
    if termination_grace_s is not None:
        # Kubernetes kills a pod this long after SIGTERM (default 30 s), whatever Serve's own
        # graceful shutdown is still waiting for: a scale-down would cut long generations.
        spec["terminationGracePeriodSeconds"] = termination_grace_s
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "rayStartParams": start,
        "template": {"metadata": _pod_metadata(cluster), "spec": spec},
    }


def accelerator_affinity(accelerator_type: str) -> dict:
    if accelerator_type not in ACCELERATOR_NODE_LABELS:
        raise ValueError(
            f"accelerator_type {accelerator_type!r}: add the node labels of such nodes to "
            f"ACCELERATOR_NODE_LABELS in {Path(__file__).name}"
        )
    terms = [
        {"matchExpressions": [{"key": k, "operator": "In", "values": list(v)}]}
        for k, v in ACCELERATOR_NODE_LABELS[accelerator_type].items()
    ]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def network_policy(cluster: str, labels: dict, submitter_job: str | None = None, serve: bool = False) -> dict:
    """Ingress to the pods of one Ray cluster (head and workers): from its own pods on any port (Ray's
    head <-> worker traffic uses GCS, raylet, object manager and worker ports), from the KubeRay
    operator to the dashboard, from the RayJob's submitter pod (label `job-name`, set by Kubernetes)
    to the dashboard, and, for a RayService, from the ingress namespace to the Serve port.
    Everything else, 6379 / 8265 / 10001 from other pods included, is dropped. Egress stays open
    (model downloads). `kubectl port-forward` reaches the pod through the kubelet, not this policy."""
    own = {"podSelector": {"matchLabels": {CLUSTER_LABEL: cluster}}}
    dashboard = [{"port": 8265, "protocol": "TCP"}]
    rules = [
        {"from": [own]},
        {
            "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}],
            "ports": dashboard,
        },
    ]
    if submitter_job:
        rules.append({"from": [{"podSelector": {"matchLabels": {"job-name": submitter_job}}}], "ports": dashboard})
    if serve:
        rules.append(
            {
                "from": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SERVE_CLIENT_NAMESPACE}}}
                ],
                "ports": [{"port": 8000, "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": cluster, "labels": dict(labels)},
        "spec": {
            "podSelector": {"matchLabels": {CLUSTER_LABEL: cluster}},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


# -- manifests -------------------------------------------------------------------------------------
def rayjob(recipe: Recipe, stage: str) -> dict:
    cfg_path = f"{recipe.configs}/{stage}.yaml"
    cfg = load_config(stage, ROOT / cfg_path)
    need = gpus_needed(stage, cfg)
    pods = max(1, -(-need // recipe.gpus_per_pod))
    name = rayjob_name(recipe, stage)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "labels": rayjob_labels(recipe, stage)},
        "spec": {
            "entrypoint": f"python -m pipelines.{stage} --config {IMAGE_ROOT}/{cfg_path}",
            # A failed or preempted run is submitted again on a fresh cluster: the stage resumes from
            # the Parquet parts / Ray Train checkpoints already on the shared volume.
            "backoffLimit": 2,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "authOptions": auth_options(),
                "headGroupSpec": head_group(name, serve=False),
                "workerGroupSpecs": [
                    gpu_group(
                        name, "gpu", recipe.gpus_per_pod, recipe.cpus_per_pod, recipe.memory_per_pod, pods, pods, pods
                    )
                ],
            },
        },
    }


def rayjob_name(recipe: Recipe, stage: str) -> str:
    return f"specexit-{recipe.name}-{stage.replace('_', '-')}"


def rayjob_labels(recipe: Recipe, stage: str) -> dict:
    return {"app.kubernetes.io/part-of": "specexit", "specexit/stage": stage, "specexit/model": recipe.name}


def trained_draft(recipe: Recipe) -> str:
    return load_config("train_draft", ROOT / recipe.configs / "train_draft.yaml").output


def recipe_named(name: str) -> Recipe:
    (recipe,) = [r for r in RECIPES if r.name == name]
    return recipe


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


def serve_variant(variant: ServeVariant) -> dict:
    """cluster/serve/<variant.name>.yaml: serve_app/gpu_tp2.yaml with the variant's overrides applied."""
    doc = read_yaml(ROOT / SERVE_GPU_CONFIG)
    (app,) = doc["applications"]
    app["args"] = _merge(app["args"], variant.overrides, recipe_named(variant.recipe))
    return doc


def serve_doc(recipe: Recipe) -> dict:
    if recipe.rayservice_config == SERVE_GPU_CONFIG:
        return read_yaml(ROOT / SERVE_GPU_CONFIG)
    return serve_variant(SERVE_VARIANT[Path(recipe.rayservice_config).stem])


def serve_group(cluster: str, applications: list, vols: list, mounts: list) -> dict:
    """The RayService's GPU workers, from its Serve config: one engine replica per pod (its
    tensor-parallel GPUs, STRICT_PACK on one node), as many pods as the app has replicas (Serve
    autoscaling asks, the KubeRay autoscaler adds the pods), on nodes of the pinned accelerator."""
    from serve_app.config import load_args

    gpu_args = [a for a in (load_args(app.get("args")) for app in applications) if a.model.accelerator == "gpu"]
    if len(gpu_args) != 1:
        raise ValueError(f"a RayService serves one GPU model, got {len(gpu_args)}")
    (args,) = gpu_args
    tp, scale = args.model.tensor_parallel_size, args.autoscaling
    return gpu_group(
        cluster,
        "gpu",
        tp,
        SERVE_CPUS_PER_GPU * tp,
        f"{SERVE_MEMORY_GIB_PER_GPU * tp}Gi",
        max(1, scale.min_replicas),
        scale.min_replicas,
        scale.max_replicas,
        vols,
        mounts,
        accelerator_type=args.model.accelerator_type,
        termination_grace_s=math.ceil(args.shutdown_timeout_s) + POD_STOP_MARGIN_S,
    )


def serve_pod_extras(recipe: Recipe, applications: list) -> tuple[list, list]:
    """Volumes and mounts the Serve replicas need beyond the shared volume."""
    volumes, mounts = [], []
    for app in applications:
        args = app.get("args") or {}
        draft = (args.get("model") or {}).get("draft")
        trained = trained_draft(recipe)
        if draft and draft != trained and not draft.startswith(STORAGE_MOUNT + "/"):
            # the Serve config reads the draft elsewhere: show it the one the recipe trained
            mounts.append(
                {"name": "storage", "mountPath": draft, "readOnly": True, "subPath": trained[len(STORAGE_MOUNT) + 1 :]}
            )
        auth = args.get("auth") or {}
        if auth.get("enabled") and auth.get("api_keys_file"):
            key_file = Path(auth["api_keys_file"])
            volumes.append(
                {
                    "name": "api-keys",
                    "secret": {
                        "secretName": API_KEYS_SECRET,
                        "optional": True,  # no Secret: no keys, every request 401
                        "items": [{"key": "api-keys", "path": key_file.name}],
                    },
                }
            )
            mounts.append({"name": "api-keys", "mountPath": str(key_file.parent), "readOnly": True})
    return volumes, mounts


def rayservice_name(recipe: Recipe) -> str:
    return f"specexit-{recipe.name}"


def rayservice_labels(recipe: Recipe) -> dict:
    return {"app.kubernetes.io/part-of": "specexit", "specexit/model": recipe.name}


def rayservice(recipe: Recipe) -> dict:
    applications = serve_doc(recipe)["applications"]
    vols, mounts = serve_pod_extras(recipe, applications)
    name = rayservice_name(recipe)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "labels": rayservice_labels(recipe)},
        "spec": {
            # = the `applications` of the recipe's Serve config (tests/integration/test_cluster_kuberay.py checks it)
            "serveConfigV2": yaml.safe_dump({"applications": applications}, sort_keys=False, width=1000),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "authOptions": auth_options(),
                "enableInTreeAutoscaling": True,  # Serve autoscaling adds / removes GPU worker pods
                # a head restart keeps the job table, the Serve app and its replicas (docs/runbook.md)
                "gcsFaultToleranceOptions": gcs_fault_tolerance(),
                "headGroupSpec": head_group(name, serve=True, extra_volumes=vols, extra_mounts=mounts),
                "workerGroupSpecs": [serve_group(name, applications, vols, mounts)],
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


def redis() -> list[dict]:
    """The RayServices' GCS store: one Redis pod (password from the Secret, append-only file on the
    pod's emptyDir: it survives a container restart, not a rescheduled pod), its Service and a
    NetworkPolicy admitting only the RayServices' heads and KubeRay's Redis cleanup Jobs."""
    password = {"valueFrom": {"secretKeyRef": {"name": REDIS_SECRET, "key": REDIS_PASSWORD_KEY}}}
    conf = "/usr/local/etc/redis/redis.conf"
    # The password goes into a config file on a memory emptyDir, not onto redis-server's command line
    # (`ps` would show it). Use a password without spaces or quotes: `openssl rand -hex 32`.
    start = (
        f"printf 'requirepass %s\\n' \"$REDIS_PASSWORD\" > {conf} && "
        f"exec redis-server {conf} --dir /data --appendonly yes --maxmemory 1536mb --maxmemory-policy noeviction"
    )
    res = {"cpu": "1", "memory": "2Gi"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": REDIS_NAME, "labels": dict(REDIS_LABELS)},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two Redis pods on one store
            "selector": {"matchLabels": dict(REDIS_LABELS)},
            "template": {
                "metadata": {"labels": dict(REDIS_LABELS)},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": REDIS_UID,
                        "runAsGroup": REDIS_UID,
                        "fsGroup": REDIS_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "redis",
                            "image": REDIS_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", start],
                            "env": [{"name": "REDIS_PASSWORD", **password}],
                            "ports": [{"containerPort": REDIS_PORT, "name": "redis"}],
                            "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
                            "livenessProbe": {
                                "tcpSocket": {"port": "redis"},
                                "initialDelaySeconds": 10,
                                "periodSeconds": 10,
                            },
                            "resources": {"requests": dict(res), "limits": dict(res)},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": "data", "mountPath": "/data"},
                                {"name": "config", "mountPath": str(Path(conf).parent)},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "data", "emptyDir": {}},
                        {"name": "config", "emptyDir": {"medium": "Memory"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": REDIS_NAME, "labels": dict(REDIS_LABELS)},
        "spec": {
            "selector": dict(REDIS_LABELS),
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}],
        },
    }
    clients = [
        {"podSelector": {"matchLabels": {CLUSTER_LABEL: rayservice_name(r), "ray.io/node-type": t}}}
        for r in RECIPES
        for t in REDIS_CLIENT_NODE_TYPES
    ]
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": REDIS_NAME, "labels": dict(REDIS_LABELS)},
        "spec": {
            "podSelector": {"matchLabels": dict(REDIS_LABELS)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": clients, "ports": [{"port": REDIS_PORT, "protocol": "TCP"}]}],
        },
    }
    return [deployment, service, policy]


# -- files -----------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # plain repeated blocks, no &id001 anchors
        return True


def _str(dumper, s: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)

HEADER = (
    "# Generated by `python -m cluster.render_kuberay` -- edit that, not this file.\n"
    "# Apply: envsubst '$SPECEXIT_IMAGE' < {path} | kubectl apply -f -   (docs/runbook.md)\n"
)


def dump(docs: dict | list, rel: str, note: str = "") -> str:
    docs = docs if isinstance(docs, list) else [docs]
    return (
        HEADER.format(path=rel)
        + (f"# {note}\n" if note else "")
        + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=1000)
    )


def _serve_note(svc: dict) -> str:
    (group,) = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    pin = group["rayStartParams"].get("resources")
    return f"one replica per {gpus}-GPU pod, {group['minReplicas']}..{group['maxReplicas']} pods" + (
        f"; the pods declare {pin} and run on such nodes" if pin else ""
    )


def render() -> dict[str, str]:
    """{path relative to the repo root: text}. Needs serve_app/gpu_tp2.yaml for the Serve files."""
    files = {
        "cluster/kuberay/storage.yaml": dump(
            storage(),
            "cluster/kuberay/storage.yaml",
            "Shared volume for traces, labels, checkpoints, drafts and the HF cache.",
        ),
        "cluster/kuberay/redis.yaml": dump(
            redis(),
            "cluster/kuberay/redis.yaml",
            f"GCS fault tolerance store of the RayServices. Needs the Secret {REDIS_SECRET} (key"
            f" {REDIS_PASSWORD_KEY}; docs/runbook.md).\n# A single pod without persistent storage, for a"
            " start: in production use a managed Redis with persistence\n# (Memorystore, ElastiCache, ...),"
            " set REDIS_ADDRESS in cluster/render_kuberay.py to it and rerender.",
        ),
    }
    for recipe in RECIPES:
        for stage in STAGES:
            rel = f"cluster/kuberay/{recipe.name}/rayjob-{stage.replace('_', '-')}.yaml"
            name = rayjob_name(recipe, stage)
            policy = network_policy(name, rayjob_labels(recipe, stage), submitter_job=name)
            files[rel] = dump(
                [rayjob(recipe, stage), policy],
                rel,
                f"{recipe.name}, stage {stage}: {recipe.gpu_note}. Its NetworkPolicy comes with it.",
            )
    if not (ROOT / SERVE_GPU_CONFIG).exists():
        return files
    for variant in SERVE_VARIANTS:
        rel = f"cluster/serve/{variant.name}.yaml"
        changed = ", ".join(sorted(_flat(variant.overrides)))
        files[rel] = SERVE_HEADER.format(use=variant.use, changed=changed) + yaml.safe_dump(
            serve_variant(variant), sort_keys=False, width=1000
        )
    for recipe in RECIPES:
        rel = f"cluster/kuberay/{recipe.name}/rayservice.yaml"
        svc = rayservice(recipe)
        policy = network_policy(rayservice_name(recipe), rayservice_labels(recipe), serve=True)
        files[rel] = dump(
            [svc, policy],
            rel,
            f"serveConfigV2 = applications of {recipe.rayservice_config}; "
            f"{_serve_note(svc)}. Its NetworkPolicy comes with it.",
        )
    return files


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


SERVE_HEADER = """# Serve config: {use}.
# Generated by `python -m cluster.render_kuberay` from serve_app/gpu_tp2.yaml -- edit that or
# SERVE_VARIANTS in cluster/render_kuberay.py, not this file. Changed args: {changed}.
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
