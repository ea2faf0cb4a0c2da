"""KubeRay manifests (cluster/kuberay/) and the `ray up` Serve configs (cluster/serve/): they
parse, have the right kinds and fields, are in sync with their sources (`python -m
cluster.render_kuberay --check`), give each stage the GPUs its config asks for; each RayService's
`serveConfigV2` is exactly the `applications` of its Serve config (cluster/serve/qwen3-4b-h100.yaml
for Qwen3-4B, cluster/serve/r1-llama-8b.yaml for the 8B, both serve_app/gpu_tp2.yaml with declared
changes) and builds, through Serve's own builder path and the app's typed validation, the same
application; the Serve replicas see the draft the recipe trains; each RayService runs GCS fault
tolerance on the rendered Redis (cluster/kuberay/redis.yaml) with the password from a Secret, the
RayJobs without it. Scaling (tests/unit/
test_cluster_scaling.py) and auth / NetworkPolicy / NFS (tests/unit/test_cluster_security.py) have
their own tests. Seconds (~20 s for the app builds), no cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster import render_kuberay as rk
from support.paths import REPO_ROOT

KDIR = REPO_ROOT / "cluster" / "kuberay"
SERVE_GPU = REPO_ROOT / "serve_app" / "gpu_tp2.yaml"
needs_serve_config = pytest.mark.skipif(
    not SERVE_GPU.exists(), reason="serve_app/gpu_tp2.yaml not written yet (issue #6)"
)


def _docs(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, path
    return docs


def _doc(path: Path, kind: str) -> dict:
    """The one `kind` document of a file (a RayJob / RayService file also holds its NetworkPolicy)."""
    (doc,) = [d for d in _docs(path) if d["kind"] == kind]
    return doc


def _containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def _gpus(group: dict) -> int:
    return sum(int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) for c in _containers(group["template"]))


def _check_cluster_spec(spec: dict, serve: bool):
    assert spec["rayVersion"] == "2.60.0"
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0" and _gpus(head) == 0  # CPU head
    ports = {p["containerPort"] for c in _containers(head["template"]) for p in c.get("ports", [])}
    assert {6379, 8265, 10001} <= ports and (8000 in ports) == serve
    for group in [head, *spec["workerGroupSpecs"]]:
        for c in _containers(group["template"]):
            assert c["image"] == "${SPECEXIT_IMAGE}"
            assert {"name": "storage", "mountPath": "/mnt/cluster_storage"} in c["volumeMounts"]
            assert c["resources"]["requests"] == c["resources"]["limits"]
        vols = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        assert vols["storage"]["persistentVolumeClaim"]["claimName"] == "specexit-storage"
    for w in spec["workerGroupSpecs"]:
        assert w["minReplicas"] <= w["replicas"] <= w["maxReplicas"] and _gpus(w) > 0


def test_manifests_are_in_sync_with_their_sources():
    if not SERVE_GPU.exists():
        pytest.skip("serve_app/gpu_tp2.yaml not in this checkout: the Serve files cannot be rendered")
    r = subprocess.run(
        [sys.executable, "-m", "cluster.render_kuberay", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    expected = set(rk.render())
    rendered = [*KDIR.rglob("*.yaml"), *(REPO_ROOT / "cluster" / "serve").glob("*.yaml")]
    on_disk = {str(p.relative_to(REPO_ROOT)) for p in rendered}
    assert on_disk == expected  # nothing stale left behind either


def test_every_manifest_parses_with_the_right_kind():
    kinds = {}
    for p in sorted(KDIR.rglob("*.yaml")):
        for d in _docs(p):
            kinds.setdefault(d["kind"], []).append(str(p.relative_to(KDIR)))
            assert d["apiVersion"] == {
                "PersistentVolumeClaim": "v1",
                "NetworkPolicy": "networking.k8s.io/v1",
                "Deployment": "apps/v1",
                "Service": "v1",
            }.get(d["kind"], "ray.io/v1")
            assert d["metadata"]["name"]
    assert sorted(kinds["RayJob"]) == sorted(
        f"{r.name}/rayjob-{s}.yaml" for r in rk.RECIPES for s in ("traces", "labels", "train-draft")
    )
    assert kinds["PersistentVolumeClaim"] == ["storage.yaml"]
    assert sorted(kinds["RayService"]) == sorted(f"{r.name}/rayservice.yaml" for r in rk.RECIPES)
    assert kinds["Deployment"] == kinds["Service"] == ["redis.yaml"]  # the RayServices' GCS store
    # one each; no Secret anywhere (passwords and tokens are created with kubectl, never committed)
    assert sorted(kinds["NetworkPolicy"]) == sorted(kinds["RayJob"] + kinds["RayService"] + ["redis.yaml"])
    assert set(kinds) == {"RayJob", "RayService", "NetworkPolicy", "PersistentVolumeClaim", "Deployment", "Service"}


@pytest.mark.parametrize("recipe", rk.RECIPES, ids=lambda r: r.name)
@pytest.mark.parametrize("stage", rk.STAGES)
def test_rayjob_runs_the_stage_config_with_its_gpus(recipe, stage):
    from pipelines.stages import load_stage_config

    job = _doc(KDIR / recipe.name / f"rayjob-{stage.replace('_', '-')}.yaml", "RayJob")
    spec = job["spec"]
    cfg_rel = f"{recipe.configs}/{stage}.yaml"
    assert spec["entrypoint"] == f"python -m pipelines.{stage} --config /home/ray/specexit/{cfg_rel}"
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] >= 1
    _check_cluster_spec(spec["rayClusterSpec"], serve=False)
    cfg = load_stage_config(stage, str(REPO_ROOT / cfg_rel))
    need = rk.gpus_needed(stage, cfg)
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert need > 0 and group["replicas"] * _gpus(group) == need  # exactly what the config runs at once
    if stage != "train_draft":  # a tensor-parallel engine must fit inside one pod
        assert cfg.engine.tensor_parallel_size <= _gpus(group)


def test_storage_claim_is_shared():
    (pvc,) = _docs(KDIR / "storage.yaml")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def _serve_recipes():
    return [pytest.param(r, id=r.name, marks=needs_serve_config) for r in rk.RECIPES]


def test_the_4b_rayservice_carries_the_gpu_app_config_at_tp1():
    """The Qwen3-4B RayService serves serve_app/gpu_tp2.yaml (H100 pin included) at TP=1: one H100
    holds the 4B model; the declared-changes test below checks nothing else differs."""
    assert rk.RECIPES[0].name == "qwen3-4b" and rk.RECIPES[0].rayservice_config == "cluster/serve/qwen3-4b-h100.yaml"
    assert rk.SERVE_VARIANT["qwen3-4b-h100"].overrides == {"model": {"tensor_parallel_size": 1}}


@pytest.mark.parametrize("recipe", _serve_recipes())
def test_rayservice_serves_exactly_the_serve_config(recipe):
    svc = _doc(KDIR / recipe.name / "rayservice.yaml", "RayService")
    serve_cfg = yaml.safe_load(svc["spec"]["serveConfigV2"])  # a YAML string inside the manifest
    source = yaml.safe_load((REPO_ROOT / recipe.rayservice_config).read_text())
    assert serve_cfg == {"applications": source["applications"]}
    _check_cluster_spec(svc["spec"]["rayClusterConfig"], serve=True)
    assert svc["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True


REDIS_FILE = KDIR / "redis.yaml"
REDIS_PASSWORD_REF = {"valueFrom": {"secretKeyRef": {"name": "specexit-redis", "key": "password"}}}


@pytest.mark.parametrize("recipe", _serve_recipes())
def test_rayservice_runs_gcs_fault_tolerance_on_the_rendered_redis(recipe):
    """KubeRay >= 1.3's gcsFaultToleranceOptions: the Redis address is the rendered Service (its
    port reaches the Redis container), the password comes from the Secret, and none of the older
    ways KubeRay rejects next to the options (ft-enabled annotation, RAY_REDIS_ADDRESS /
    REDIS_PASSWORD env or `redis-password` on the head) is used."""
    svc = _doc(KDIR / recipe.name / "rayservice.yaml", "RayService")
    spec = svc["spec"]["rayClusterConfig"]
    ft = spec["gcsFaultToleranceOptions"]
    assert ft == {"redisAddress": "specexit-redis:6379", "redisPassword": REDIS_PASSWORD_REF}
    assert "value" not in ft["redisPassword"]  # never inline
    host, port = ft["redisAddress"].split(":")
    service, deployment = _doc(REDIS_FILE, "Service"), _doc(REDIS_FILE, "Deployment")
    assert service["metadata"]["name"] == host  # same namespace: the Service's short name resolves
    (svc_port,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (redis,) = pod["spec"]["containers"]
    assert {"containerPort": int(port), "name": svc_port["targetPort"]} in redis["ports"]
    assert "ray.io/ft-enabled" not in (svc["metadata"].get("annotations") or {})
    head = spec["headGroupSpec"]
    assert not {"redis-password", "redis-username"} & set(head["rayStartParams"])
    for c in _containers(head["template"]):
        assert not {"RAY_REDIS_ADDRESS", "REDIS_PASSWORD", "REDIS_USERNAME"} & {e["name"] for e in c["env"]}


@pytest.mark.parametrize("recipe", rk.RECIPES, ids=lambda r: r.name)
@pytest.mark.parametrize("stage", rk.STAGES)
def test_rayjobs_run_without_gcs_fault_tolerance(recipe, stage):
    """One-shot clusters: a head restart kills the driver either way; the resubmitted job resumes
    from the shared volume (render_kuberay's docstring)."""
    job = _doc(KDIR / recipe.name / f"rayjob-{stage.replace('_', '-')}.yaml", "RayJob")
    assert "gcsFaultToleranceOptions" not in job["spec"]["rayClusterSpec"]
    assert "redis" not in (KDIR / recipe.name / f"rayjob-{stage.replace('_', '-')}.yaml").read_text().lower()


def test_redis_takes_its_password_from_the_secret():
    """The Redis pod reads the same Secret as the RayServices; the password is in no manifest and
    not on redis-server's command line (a config file on a memory volume); one pod, non-root."""
    deployment = _doc(REDIS_FILE, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (redis,) = pod["containers"]
    env = {e["name"]: e for e in redis["env"]}
    assert env["REDIS_PASSWORD"] == {"name": "REDIS_PASSWORD", **REDIS_PASSWORD_REF}
    start = redis["command"][-1]
    assert "requirepass %s" in start and '"$REDIS_PASSWORD" > /usr/local/etc/redis/redis.conf' in start
    assert "exec redis-server /usr/local/etc/redis/redis.conf " in start and "--requirepass" not in start
    assert "--maxmemory-policy noeviction" in start  # GCS tables must never be evicted
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["config"] == {"name": "config", "emptyDir": {"medium": "Memory"}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert redis["resources"]["requests"] == redis["resources"]["limits"]
    assert "password:" not in REDIS_FILE.read_text().replace("key: password", "")


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_behind():
    """Building a Serve application may start Ray in this process; stop it, or its fixed default
    ports (dashboard agent) stay taken for the private clusters later tests start."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _build(app_cfg: dict):
    """What `serve run` / `serve deploy` / KubeRay do with one `applications` entry: import the
    builder, call it with `args` (the app's typed validation runs here), flatten the application.
    Returns comparable facts per deployment. No Ray cluster, no GPU, no model download."""
    from serve_app.ray_llm import build_like_serve_run

    built = build_like_serve_run(app_cfg)
    out = {}
    for d in built.deployments:
        rc = d._replica_config
        out[d.name] = {
            "config": d._deployment_config.model_dump(exclude={"user_configured_option_names"}),
            "bundles": rc.placement_group_bundles,
            "strategy": rc.placement_group_strategy,
            "actor_options": rc.ray_actor_options,
        }
    return out


@pytest.mark.parametrize("recipe", _serve_recipes())
def test_rayservice_builds_the_same_application_as_the_serve_config(recipe):
    """serveConfigV2 goes through the Serve app's own builder and validation and yields the same
    deployments as the Serve config it was rendered from; one GPU replica is one worker pod."""
    from serve_app.config import load_args

    svc = _doc(KDIR / recipe.name / "rayservice.yaml", "RayService")
    apps = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
    source = yaml.safe_load((REPO_ROOT / recipe.rayservice_config).read_text())["applications"]
    assert [a["name"] for a in apps] == [a["name"] for a in source]
    (group,) = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for app, src in zip(apps, source):
        assert app["import_path"].startswith("serve_app.")
        args = load_args(app.get("args"))
        assert args.model.accelerator == "gpu"
        built = _build(app)
        assert built == _build(src)
        gpu_deps = [d for d in built.values() if any(b.get("GPU") for b in d["bundles"] or [])]
        assert len(gpu_deps) == 1, built.keys()
        bundles = gpu_deps[0]["bundles"]
        assert sum(b["GPU"] for b in bundles) == args.model.tensor_parallel_size == _gpus(group)
        assert gpu_deps[0]["strategy"] == "STRICT_PACK"
        assert (group["minReplicas"], group["maxReplicas"]) == (
            args.autoscaling.min_replicas,
            args.autoscaling.max_replicas,
        )


def _leaves(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("recipe", _serve_recipes())
def test_rayservice_pods_see_the_draft_the_recipe_trains(recipe):
    """docs/runbook.md serves right after train_draft: the replicas must find that draft at the
    path their Serve config names."""
    from pipelines.stages import load_stage_config
    from serve_app.config import load_args

    train = load_stage_config("train_draft", str(REPO_ROOT / recipe.configs / "train_draft.yaml"))
    svc = _doc(KDIR / recipe.name / "rayservice.yaml", "RayService")
    (app,) = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
    args = load_args(app["args"])
    assert args.model.source == train.target
    (group,) = svc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (worker,) = _containers(group["template"])
    if args.model.draft == train.output:
        assert train.output.startswith("/mnt/cluster_storage/")  # on the shared volume every pod mounts
    else:  # a sub-path of the shared volume mounted where the Serve config looks
        assert {
            "name": "storage",
            "mountPath": args.model.draft,
            "readOnly": True,
            "subPath": train.output.removeprefix("/mnt/cluster_storage/"),
        } in worker["volumeMounts"]
    if args.auth.enabled and args.auth.api_keys_file:  # the key file comes from the Secret
        key = Path(args.auth.api_keys_file)
        assert {"name": "api-keys", "mountPath": str(key.parent), "readOnly": True} in worker["volumeMounts"]
        vols = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        assert vols["api-keys"]["secret"]["secretName"] == "specexit-api-keys"
        assert vols["api-keys"]["secret"]["items"] == [{"key": "api-keys", "path": key.name}]


@pytest.mark.parametrize("variant", [pytest.param(v, id=v.name, marks=needs_serve_config) for v in rk.SERVE_VARIANTS])
def test_generated_serve_configs_are_the_gpu_app_with_declared_changes(variant):
    """cluster/serve/<name>.yaml differs from serve_app/gpu_tp2.yaml only in the declared fields,
    serves the trained draft (where the pods see it), and builds. The `ray up` ones run on any of
    those clusters' GPUs (no accelerator pin) at TP=2; the Qwen3-4B RayService's one at TP=1 on H100."""
    from pipelines.stages import load_stage_config
    from serve_app.config import load_args

    variant_doc = yaml.safe_load((REPO_ROOT / "cluster" / "serve" / f"{variant.name}.yaml").read_text())
    base = yaml.safe_load(SERVE_GPU.read_text())
    assert {k: v for k, v in variant_doc.items() if k != "applications"} == {
        k: v for k, v in base.items() if k != "applications"
    }
    (app,), (base_app,) = variant_doc["applications"], base["applications"]
    assert {k: v for k, v in app.items() if k != "args"} == {k: v for k, v in base_app.items() if k != "args"}
    got, want = _leaves(app["args"]), _leaves(base_app["args"])
    changed = {k for k in got.keys() | want.keys() if got.get(k, "<absent>") != want.get(k, "<absent>")}
    assert changed <= set(rk._flat(variant.overrides)), changed
    args = load_args(app["args"])
    recipe = rk.recipe_named(variant.recipe)
    train = load_stage_config("train_draft", str(REPO_ROOT / recipe.configs / "train_draft.yaml"))
    assert args.model.source == train.target and args.model.accelerator == "gpu"
    if variant.name == "qwen3-4b-h100":  # KubeRay: the pods mount the trained draft where this looks
        assert (args.model.accelerator_type, args.model.tensor_parallel_size) == ("H100", 1)
        assert recipe.rayservice_config == f"cluster/serve/{variant.name}.yaml"
    else:  # `ray up`: the draft on the shared NFS volume, any GPU
        assert args.model.draft == train.output
        assert (args.model.accelerator_type, args.model.tensor_parallel_size) == (None, 2)
    built = _build(app)
    assert any(any(b.get("GPU") for b in d["bundles"] or []) for d in built.values())


CRD_DIR = os.environ.get(
    "SPECEXIT_KUBERAY_CRDS"
)  # a folder with KubeRay's ray.io_rayjobs.yaml, ray.io_rayservices.yaml (checked: v1.6.0, v1.7.0, master)


def _strict(schema):
    """The CRD's openAPI schema with unknown fields forbidden everywhere (the API server would prune
    them silently; here a misspelt field must fail)."""
    if isinstance(schema, dict):
        s = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if s.get("type") == "object" and "properties" in s and "additionalProperties" not in s:
            s["additionalProperties"] = False
        return s
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    return schema


@pytest.mark.skipif(not CRD_DIR, reason="set SPECEXIT_KUBERAY_CRDS to KubeRay's ray-operator/config/crd/bases")
def test_manifests_validate_against_the_kuberay_crds():
    import jsonschema

    schemas = {}
    for kind, file in (("RayJob", "ray.io_rayjobs.yaml"), ("RayService", "ray.io_rayservices.yaml")):
        crd = yaml.safe_load((Path(CRD_DIR) / file).read_text())
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schemas[kind] = _strict(v1["schema"]["openAPIV3Schema"])
    validated = []
    for p in sorted(KDIR.rglob("*.yaml")):
        for d in _docs(p):
            if d["kind"] in schemas:
                jsonschema.validate(d, schemas[d["kind"]])
                validated.append(d["kind"])
    # the RayServices' gcsFaultToleranceOptions (redisAddress, redisPassword.valueFrom.secretKeyRef)
    # are among what the strict schema checked: an unknown or misspelt field there fails above
    assert validated.count("RayService") == len(rk.RECIPES) and validated.count("RayJob") == 3 * len(rk.RECIPES)
    ft = schemas["RayService"]["properties"]["spec"]["properties"]["rayClusterConfig"]["properties"]
    assert {"redisAddress", "redisPassword"} <= set(ft["gcsFaultToleranceOptions"]["properties"])
