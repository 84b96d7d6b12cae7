"""deploy/kubernetes/sharded: the StatefulSet and headless Service agents derive their shard's name from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fabricmon.shardmap import kubernetes_aggregator

MANIFEST = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "sharded" / "aggregator-statefulset.yaml"


def _objs():
    return {o["kind"]: o for o in yaml.safe_load_all(MANIFEST.read_text()) if o}


def test_manifests_validate():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    for o in _objs().values():
        kv.validate(o, "1.30.0", strict=True)


def test_agent_derived_name_resolves_to_a_replica_of_the_statefulset():
    objs = _objs()
    svc, sts = objs["Service"], objs["StatefulSet"]
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
