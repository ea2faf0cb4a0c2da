"""The clusters are locked down, checked without a cloud (nothing here has run on a real cloud account
or Kubernetes cluster):

- KubeRay: every Ray cluster (RayJob, RayService) runs Ray token auth with the token from the
  Secret `specexit-ray-token` (never inline), on the head and on every worker;
- KubeRay: every RayJob / RayService file carries a NetworkPolicy selecting all of that cluster's
  pods, head included; evaluated here with NetworkPolicy's rules: the head's GCS / dashboard /
  client ports admit only the cluster's own pods (plus the operator and the job submitter on the
  dashboard port), the Serve port the ingress namespace;
- KubeRay: the RayServices' GCS fault-tolerance Redis (cluster/kuberay/redis.yaml) admits only the
  RayServices' head pods and KubeRay's Redis cleanup Jobs, on its port only;
- `ray up`: the head exports /mnt/cluster_storage over NFS to the VPC / subnet CIDR read from the
  instance metadata (the command is run here against fake metadata), root squashed, and the
  directory is not world-writable.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster import render_kuberay as rk
from support.paths import REPO_ROOT

KDIR = REPO_ROOT / "cluster" / "kuberay"
RAY_UP = sorted(p for d in ("aws", "gcp") for p in (REPO_ROOT / "cluster" / d).glob("*.yaml"))
NAMESPACE = "specexit"  # where the manifests are applied (any one namespace)


def _cluster_files() -> list[Path]:
    """The files of the Ray clusters (a RayJob / RayService and its NetworkPolicy each)."""
    return sorted(p for p in KDIR.rglob("*.yaml") if p.name not in ("storage.yaml", "redis.yaml"))


def _docs(path: Path) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), (path, kinds)
    return {d["kind"]: d for d in docs}


def _ray_cluster(docs: dict) -> tuple[dict, dict]:
    """(the RayJob / RayService, its RayCluster spec)."""
    if "RayJob" in docs:
        return docs["RayJob"], docs["RayJob"]["spec"]["rayClusterSpec"]
    return docs["RayService"], docs["RayService"]["spec"]["rayClusterConfig"]


def _groups(spec: dict) -> list[tuple[str, dict]]:
    return [("head", spec["headGroupSpec"]), *(("worker", g) for g in spec["workerGroupSpecs"])]


def _pod_labels(group: dict, node_type: str) -> dict:
    """What KubeRay puts on the group's pods: the template's labels plus its own (not overridable)."""
    labels = dict(group["template"].get("metadata", {}).get("labels", {}))
    labels.update({"ray.io/node-type": node_type, "ray.io/cluster": "generated-name", "ray.io/is-ray-node": "yes"})
    return labels


@pytest.mark.parametrize("path", _cluster_files(), ids=lambda p: str(p.relative_to(KDIR)))
def test_ray_token_auth_from_the_secret_on_head_and_workers(path):
    _, spec = _ray_cluster(_docs(path))
    assert spec["authOptions"] == {"mode": "token", "secretName": rk.RAY_TOKEN_SECRET}  # KubeRay >= 1.6
    assert tuple(int(x) for x in spec["rayVersion"].split(".")) >= (2, 52, 0)  # token auth exists
    for _, group in _groups(spec):
        for c in group["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in c["env"]}
            assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, c["name"]
            assert env["RAY_AUTH_TOKEN"] == {
                "name": "RAY_AUTH_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": rk.RAY_TOKEN_SECRET, "key": rk.RAY_TOKEN_KEY}},
            }, c["name"]  # not optional, not inline
    assert "RAY_AUTH_TOKEN_PATH" not in path.read_text()


# -- NetworkPolicy, evaluated ---------------------------------------------------------------------
def _matches(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # this evaluator knows matchLabels only
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_admits(peer: dict, ns: str, ns_labels: dict, pod_labels: dict) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, peer  # no ipBlock
    assert peer, "an empty peer admits everything"
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], ns_labels):
            return False
    elif ns != NAMESPACE:  # podSelector alone: the policy's namespace only
        return False
    return _matches(peer.get("podSelector", {}), pod_labels)


def _admits(policy: dict, ns: str, pod_labels: dict, port: int) -> bool:
    """Whether `policy` lets a pod (namespace ns, pod_labels) reach a selected pod's TCP `port`."""
    ns_labels = {"kubernetes.io/metadata.name": ns}
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), "a rule without `from` admits every source"
        ports = rule.get("ports")
        if ports is not None and not any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports):
            continue
        if any(_peer_admits(peer, ns, ns_labels, pod_labels) for peer in rule["from"]):
            return True
    return False


@pytest.mark.parametrize("path", _cluster_files(), ids=lambda p: str(p.relative_to(KDIR)))
def test_network_policy_selects_the_clusters_pods_and_admits_only_its_peers(path):
    docs = _docs(path)
    owner, spec = _ray_cluster(docs)
    policy = docs["NetworkPolicy"]
    assert policy["apiVersion"] == "networking.k8s.io/v1" and "Ingress" in policy["spec"]["policyTypes"]
    name, serve = owner["metadata"]["name"], owner["kind"] == "RayService"
    for node_type, group in _groups(spec):  # head and workers (Serve proxies and Ray ports on every node)
        assert _matches(policy["spec"]["podSelector"], _pod_labels(group, node_type)), (path, node_type)
    head_labels = _pod_labels(spec["headGroupSpec"], "head")
    worker_labels = _pod_labels(spec["workerGroupSpecs"][0], "worker")
    other_cluster = {**worker_labels, rk.CLUSTER_LABEL: "specexit-some-other-cluster"}
    operator = dict(rk.OPERATOR_POD_LABELS)
    submitter = {"job-name": name, "batch.kubernetes.io/job-name": name}
    admits = lambda ns, labels, port: _admits(policy, ns, labels, port)  # noqa: E731
    for port in (6379, 8265, 10001, 8076, 52365, 23456):  # GCS, dashboard, client, and Ray's other ports
        assert admits(NAMESPACE, worker_labels, port) and admits(NAMESPACE, head_labels, port)
    for port in (6379, 8265, 10001):
        assert not admits(NAMESPACE, other_cluster, port)
        assert not admits(NAMESPACE, {"app": "anything"}, port)
        assert not admits("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}, port)
        assert not admits("somewhere", {}, port)
        assert admits("kuberay-system", operator, port) == (port == 8265)  # Serve config, job status
        assert admits(NAMESPACE, submitter, port) == (port == 8265 and not serve)  # `ray job submit`
    assert not admits("kuberay-system", operator, 8000)
    assert admits(rk.SERVE_CLIENT_NAMESPACE, {}, 8000) == serve
    assert not admits("somewhere", {}, 8000) and not admits(NAMESPACE, {"app": "anything"}, 8000)


def test_network_policies_are_one_per_cluster():
    names = [_docs(p)["NetworkPolicy"]["metadata"]["name"] for p in _cluster_files()]
    owners = [_ray_cluster(_docs(p))[0]["metadata"]["name"] for p in _cluster_files()]
    assert names == owners and len(set(names)) == len(names)


def test_redis_admits_only_the_rayservice_heads_and_their_cleanup_jobs():
    """GCS FT's Redis holds every RayService's cluster state: only the heads (their GCS) and KubeRay's
    Redis cleanup Job (a copy of the head pod, node type `redis-cleanup`) reach it, on 6379 only. The
    GPU workers, the RayJobs' pods, the operator and the ingress do not. Its pod is no Ray cluster's."""
    docs = _docs(KDIR / "redis.yaml")
    policy, deployment = docs["NetworkPolicy"], docs["Deployment"]
    assert policy["metadata"]["name"] == rk.REDIS_NAME and policy["spec"]["policyTypes"] == ["Ingress"]
    redis_pod = deployment["spec"]["template"]["metadata"]["labels"]
    assert _matches(policy["spec"]["podSelector"], redis_pod)
    assert rk.CLUSTER_LABEL not in redis_pod  # no Ray cluster's policy selects (and opens) it
    admits = lambda ns, labels, port=rk.REDIS_PORT: _admits(policy, ns, labels, port)  # noqa: E731
    services = [_ray_cluster(_docs(KDIR / r.name / "rayservice.yaml")) for r in rk.RECIPES]
    for owner, spec in services:
        head = _pod_labels(spec["headGroupSpec"], "head")
        cleanup = {**head, "ray.io/node-type": "redis-cleanup"}  # KubeRay's buildRedisCleanupJob
        assert admits(NAMESPACE, head) and admits(NAMESPACE, cleanup), owner["metadata"]["name"]
        assert not admits(NAMESPACE, head, 6380) and not admits(NAMESPACE, head, 8265)
        assert not admits("elsewhere", head)  # the manifests' own namespace only
        for group in spec["workerGroupSpecs"]:
            assert not admits(NAMESPACE, _pod_labels(group, "worker"))
    for path in _cluster_files():
        owner, spec = _ray_cluster(_docs(path))
        if owner["kind"] == "RayJob":  # no GCS FT: their pods have no business with Redis
            assert not admits(NAMESPACE, _pod_labels(spec["headGroupSpec"], "head"))
    assert not admits("kuberay-system", dict(rk.OPERATOR_POD_LABELS))
    assert not admits(rk.SERVE_CLIENT_NAMESPACE, {})
    assert not admits(NAMESPACE, {"app": "anything"}) and not admits(NAMESPACE, {})
    assert not admits(NAMESPACE, {rk.CLUSTER_LABEL: "specexit-some-other-cluster", "ray.io/node-type": "head"})


# -- `ray up`: the head's NFS export ----------------------------------------------------------------
FAKE_METADATA = {  # what the shimmed curl answers, by URL suffix
    "aws": {
        "/api/token": "tok",
        "/meta-data/mac": "0a:1b:2c:3d:4e:5f",
        "/meta-data/network/interfaces/macs/0a:1b:2c:3d:4e:5f/vpc-ipv4-cidr-blocks": "172.31.0.0/16\n10.1.0.0/16",
    },
    "gcp": {"/network-interfaces/0/ip": "10.128.0.7", "/network-interfaces/0/subnetmask": "255.255.240.0"},
}
EXPECTED_EXPORTS = {
    "aws": [
        "/mnt/cluster_storage 172.31.0.0/16(rw,sync,no_subtree_check,root_squash)",
        "/mnt/cluster_storage 10.1.0.0/16(rw,sync,no_subtree_check,root_squash)",
    ],
    "gcp": ["/mnt/cluster_storage 10.128.0.0/20(rw,sync,no_subtree_check,root_squash)"],
}


def _head_init(path: Path) -> list[str]:
    return yaml.safe_load(path.read_text())["initialization_commands"]


@pytest.mark.parametrize("path", RAY_UP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nfs_export_is_not_world_open(path):
    text = " ".join(_head_init(path))
    for wide in (
        "no_root_squash",
        "*(",
        "0.0.0.0/0",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "insecure",
        "1777",
        "777",
        "a+w",
        "o+w",
    ):
        assert wide not in text, wide
    assert "root_squash" in text and "chmod 0755 /mnt/cluster_storage" in text
    assert "chown 1000:100 /mnt/cluster_storage" in text  # the containers' `ray` user writes


def _shims(tmp: Path, cloud: str, metadata_ok: bool) -> dict:
    """PATH with fake curl / sudo / dpkg; sudo runs mkdir / tee / sed / touch with /etc/... and
    /mnt/... mapped under tmp/root and only logs the rest, so the head's commands run unchanged."""
    bin_, root = tmp / "bin", tmp / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "exports").write_text("# /etc/exports\n/mnt/cluster_storage 10.0.0.0/8(rw,no_root_squash)\n")
    bin_.mkdir()
    answers = "\n".join(f'  *"{k}") printf "%s" "{v}" ;;' for k, v in FAKE_METADATA[cloud].items())
    curl = f'#!/bin/bash\nfor a in "$@"; do case "$a" in http*) url="$a" ;; esac; done\n[ "{int(metadata_ok)}" = 1 ] || exit 22\ncase "$url" in\n{answers}\n  *) exit 22 ;;\nesac\n'
    sudo = f'''#!/bin/bash
echo "sudo $*" >> "{tmp}/sudo.log"
args=()
for a in "$@"; do case "$a" in /etc/*|/mnt/*) a="{root}$a" ;; esac; args+=("$a"); done
case "$1" in
  mkdir|tee|sed|touch) "${{args[@]}}" ;;
  *) ;;  # chown, chmod, apt-get, exportfs, systemctl: logged only
esac
'''
    for name, body in (("curl", curl), ("sudo", sudo), ("dpkg", "#!/bin/bash\nexit 0\n")):
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}


@pytest.mark.parametrize("path", RAY_UP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nfs_export_is_the_cidr_from_the_instance_metadata(path, tmp_path):
    cloud = path.parent.name
    env = _shims(tmp_path, cloud, metadata_ok=True)
    for cmd in _head_init(path):  # what `ray up` runs on the head's host, one shell per command
        r = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (cmd, r.stderr)
    exports = tmp_path / "root" / "etc" / "exports.d" / "specexit.exports"
    assert exports.read_text().splitlines() == EXPECTED_EXPORTS[cloud]
    assert "/mnt/cluster_storage" not in (tmp_path / "root" / "etc" / "exports").read_text()  # old line dropped
    log = (tmp_path / "sudo.log").read_text()
    assert "sudo exportfs -ra" in log and "sudo chmod 0755 /mnt/cluster_storage" in log


@pytest.mark.parametrize("path", RAY_UP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_metadata_no_export(path, tmp_path):
    env = _shims(tmp_path, path.parent.name, metadata_ok=False)
    (export_cmd,) = [c for c in _head_init(path) if "exports.d/specexit.exports" in c]
    r = subprocess.run(["bash", "-c", export_cmd], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0  # `ray up` stops here instead of exporting to a guessed range
    assert not (tmp_path / "root" / "etc" / "exports.d" / "specexit.exports").exists()
