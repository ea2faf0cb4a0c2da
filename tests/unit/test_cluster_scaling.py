"""The KubeRay RayServices can scale out to their Serve config's max_replicas.

Serve autoscaling asks for replicas; each replica is a STRICT_PACK placement group (one bundle per
tensor-parallel rank: GPU, CPU, and `accelerator_type:<type>` when the config pins a type). The
KubeRay autoscaler adds worker pods only for demands that fit one of the node types it derives from
the RayCluster spec, with Ray's own `_derive_autoscaling_config_from_ray_cr`. Here both sides come
from Ray's code: the demands from the Serve app's builder path (no Ray cluster: only the runtime-env
lookup that needs one is stubbed), the node types from the committed RayService manifests; a small
first-fit packing checks every replica count up to max_replicas within the group's maxReplicas.
Seconds, no cluster (nothing here has run on a real Kubernetes cluster)."""

from __future__ import annotations

import copy
import types

import pytest
import yaml

from cluster import render_kuberay as rk
from support.paths import REPO_ROOT

KDIR = REPO_ROOT / "cluster" / "kuberay"
EPS = 1e-9


def _rayservice(recipe) -> dict:
    docs = [d for d in yaml.safe_load_all((KDIR / recipe.name / "rayservice.yaml").read_text()) if d]
    (svc,) = [d for d in docs if d["kind"] == "RayService"]
    return svc


def _ray_cluster_cr(svc: dict) -> dict:
    """The RayCluster the operator makes of a RayService: its spec is rayClusterConfig."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": svc["metadata"]["name"], "namespace": "default"},
        "spec": copy.deepcopy(svc["spec"]["rayClusterConfig"]),
    }


def _node_types(cr: dict) -> tuple[str, dict]:
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cfg = _derive_autoscaling_config_from_ray_cr(cr)
    return cfg["head_node_type"], cfg["available_node_types"]


@pytest.fixture
def no_runtime_context(monkeypatch):
    """ray.llm's get_deployment_options reads the driver's runtime env, which would start Ray."""
    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(runtime_env={}))


def _demands(app_cfg: dict) -> list[tuple[str, int, dict]]:
    """(deployment, max replicas, resources one replica needs on one node) per deployment, through
    the same builder path `serve deploy` / KubeRay use."""
    from serve_app.ray_llm import build_like_serve_run

    out = []
    for d in build_like_serve_run(app_cfg).deployments:
        rc, dc = d._replica_config, d._deployment_config
        if rc.placement_group_bundles:
            assert rc.placement_group_strategy == "STRICT_PACK"  # all bundles on one node
            need: dict = {}
            for bundle in rc.placement_group_bundles:
                for k, v in bundle.items():
                    need[k] = need.get(k, 0) + v
        else:
            need = {k: v for k, v in rc.resource_dict.items() if v}
        most = dc.autoscaling_config.max_replicas if dc.autoscaling_config else dc.num_replicas
        out.append((d.name, most, need))
    return out


def _fits(free: dict, need: dict) -> bool:
    return all(free.get(k, 0) + EPS >= v for k, v in need.items() if v)


def _pack(head: str, node_types: dict, replicas: list[dict]) -> dict | None:
    """First fit of the replicas onto the head and worker nodes the autoscaler may add (each type up
    to its max_workers). Returns {node type: workers used}, or None when a replica fits nowhere."""
    nodes = [dict(node_types[head]["resources"])]
    used = {t: 0 for t in node_types if t != head}
    for need in sorted(replicas, key=lambda n: -n.get("GPU", 0)):
        for free in nodes:
            if _fits(free, need):
                break
        else:
            types_ = [
                t for t in used if used[t] < node_types[t]["max_workers"] and _fits(node_types[t]["resources"], need)
            ]
            if not types_:
                return None
            used[types_[0]] += 1
            free = dict(node_types[types_[0]]["resources"])
            nodes.append(free)
        for k, v in need.items():
            free[k] = free.get(k, 0) - v
    return used


def _serve_app(svc: dict) -> dict:
    (app,) = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
    return app


@pytest.mark.parametrize("recipe", rk.RECIPES, ids=lambda r: r.name)
def test_every_replica_count_up_to_max_fits_the_derived_node_types(recipe, no_runtime_context):
    svc = _rayservice(recipe)
    head, node_types = _node_types(_ray_cluster_cr(svc))
    (group,) = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert node_types[group["groupName"]]["max_workers"] == group["maxReplicas"]
    demands = _demands(_serve_app(svc))
    (gpu,) = [d for d in demands if d[2].get("GPU")]
    others = [need for name, most, need in demands if name != gpu[0] for _ in range(most)]
    assert gpu[1] >= 2  # the config autoscales; otherwise there is nothing to check
    for n in range(1, gpu[1] + 1):
        used = _pack(head, node_types, [gpu[2]] * n + others)
        assert used is not None, f"{recipe.name}: replica {n} of {gpu[1]} ({gpu[2]}) fits no node type: {node_types}"
        assert used[group["groupName"]] <= group["maxReplicas"]
    assert used[group["groupName"]] == gpu[1]  # one replica per pod, as rendered


@pytest.mark.parametrize("recipe", rk.RECIPES, ids=lambda r: r.name)
def test_a_pinned_accelerator_is_declared_where_the_autoscaler_reads_it(recipe, no_runtime_context):
    """The custom resource a pinned `accelerator_type` becomes is offered by the derived worker
    type, and that type's pods can only land on nodes that have the accelerator."""
    svc = _rayservice(recipe)
    _, node_types = _node_types(_ray_cluster_cr(svc))
    (group,) = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (gpu_need,) = [need for _, _, need in _demands(_serve_app(svc)) if need.get("GPU")]
    pins = [k for k in gpu_need if k.startswith("accelerator_type:")]
    affinity = group["template"]["spec"].get("affinity")
    if not pins:
        assert "resources" not in group["rayStartParams"] and affinity is None
        return
    (pin,) = pins
    assert node_types[group["groupName"]]["resources"][pin] == 1
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    want = rk.ACCELERATOR_NODE_LABELS[pin.split(":", 1)[1]]
    assert {t["matchExpressions"][0]["key"]: t["matchExpressions"][0]["values"] for t in terms} == want
    assert all(len(t["matchExpressions"]) == 1 and t["matchExpressions"][0]["operator"] == "In" for t in terms)


def test_without_the_declared_resource_the_pinned_replicas_cannot_scale(no_runtime_context):
    """The check above catches issue #18's bug: the same RayService without the worker group's
    `rayStartParams.resources` leaves every pinned replica without a node type (the first one only
    ran because Ray itself detects the type on an existing pod)."""
    recipe = rk.recipe_named("qwen3-4b")
    svc = _rayservice(recipe)
    cr = _ray_cluster_cr(svc)
    (group,) = cr["spec"]["workerGroupSpecs"]
    assert "accelerator_type:H100" in group["rayStartParams"].pop("resources")
    head, node_types = _node_types(cr)
    (gpu_need,) = [need for _, _, need in _demands(_serve_app(svc)) if need.get("GPU")]
    assert _pack(head, node_types, [gpu_need]) is None


@pytest.mark.parametrize("recipe", rk.RECIPES, ids=lambda r: r.name)
def test_a_stopping_serve_pod_outlives_its_longest_request(recipe):
    """#18 item 7 / #16 item 6: the deadline covers the model's longest answer at a slow decode
    rate, Serve's graceful shutdown covers the deadline, and Kubernetes' grace period covers both
    (its default, 30 s, would cut every long generation on scale-down)."""
    from serve_app.config import load_args

    svc = _rayservice(recipe)
    args = load_args(_serve_app(svc)["args"])
    (group,) = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    grace = group["template"]["spec"]["terminationGracePeriodSeconds"]
    assert args.request_timeout_s >= args.model.max_model_len / 20  # >= 20 tokens/s per request
    assert args.shutdown_timeout_s >= args.request_timeout_s
    assert grace >= args.shutdown_timeout_s + rk.POD_STOP_MARGIN_S


@pytest.mark.parametrize("name", ["qwen3-4b.yaml", "r1-llama-8b.yaml", "qwen3-4b-h100.yaml"])
def test_ray_up_serve_configs_let_the_app_deadline_answer_first(name):
    cfg = yaml.safe_load((REPO_ROOT / "cluster" / "serve" / name).read_text())
    (app,) = cfg["applications"]
    assert cfg["http_options"]["request_timeout_s"] > app["args"]["request_timeout_s"]  # the app's 503 + message
