"""deploy/kubernetes: render base + overlays without kubectl, validate offline, check the CLI contract."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from promtools import REPO

K8S = REPO / "deploy" / "kubernetes"
OVERLAYS = ["ib", "roce"]
K8S_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}
CLUSTER_SCOPED = {"Namespace"}
# List fields merged by `name` in strategic merge patches (the ones our manifests use).
MERGE_BY_NAME = {"containers", "initContainers", "volumes", "volumeMounts", "env", "ports"}


# ------------------------------------------------------------ a tiny kustomize

def _merge(base, patch, key: str | None = None):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = _merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_BY_NAME:
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            for i, existing in enumerate(out):
                if existing.get("name") == item.get("name"):
                    out[i] = _merge(existing, item)
                    break
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(directory: Path) -> list[dict]:
    """resources + namespace + strategic-merge `patches` (path form): what our kustomizations use."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kust) - {"apiVersion", "kind", "namespace", "resources", "patches"}
    assert not unknown, f"{directory}: kustomization uses {unknown}; teach render() or drop them"
    objs: list[dict] = []
    for res in kust.get("resources", []):
        p = directory / res
        objs.extend(render(p) if p.is_dir() else _load_docs(p))
    for patch in kust.get("patches", []):
        assert set(patch) == {"path"}, patch
        for doc in _load_docs(directory / patch["path"]):
            matches = [i for i, o in enumerate(objs)
                       if o["kind"] == doc["kind"] and o["metadata"]["name"] == doc["metadata"]["name"]]
            assert len(matches) == 1, f"patch {patch['path']} matches {len(matches)} objects"
            objs[matches[0]] = _merge(objs[matches[0]], doc)
    if "namespace" in kust:
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = kust["namespace"]
    return objs


def _by_kind(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.fixture(params=["base", *OVERLAYS], scope="module")
def rendered(request) -> tuple[str, list[dict]]:
    path = K8S / "base" if request.param == "base" else K8S / "overlays" / request.param
    return request.param, render(path)


# ------------------------------------------------------------ validation

def test_schemas(rendered) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    _, objs = rendered
    for o in objs:
        if o["kind"] in CRD_KINDS:
            continue
        kv.validate(o, K8S_VERSION, strict=True)


def test_monitoring_crds_structurally(rendered) -> None:
    _, objs = rendered
    monitors = [o for o in objs if o["kind"] in CRD_KINDS]
    assert {o["kind"] for o in monitors} == CRD_KINDS
    for o in monitors:
        assert o["apiVersion"] == "monitoring.coreos.com/v1"
        spec = o["spec"]
        assert spec["selector"]["matchLabels"]
        endpoints = spec["podMetricsEndpoints"] if o["kind"] == "PodMonitor" else spec["endpoints"]
        allowed = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings", "metricRelabelings", "scheme"}
        for ep in endpoints:
            assert set(ep) <= allowed, set(ep) - allowed
            assert ep["path"] == "/metrics"
            assert ep["honorLabels"] is True  # agent `node` and training `job` labels must survive
            for r in ep.get("relabelings", []):
                assert set(r) <= {"sourceLabels", "targetLabel", "regex", "replacement", "action", "separator"}
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints",
                             "attachMetadata", "sampleLimit", "labelLimit", "jobLabel"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: renderer not cross-checked")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_render_matches_kubectl_kustomize(overlay: str) -> None:
    res = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    theirs = _by_kind([d for d in yaml.safe_load_all(res.stdout) if d])
    ours = _by_kind(render(K8S / "overlays" / overlay))
    assert theirs == ours


# ------------------------------------------------------------ contract consistency

def _container(objs: list[dict], kind: str, name: str, container: str) -> tuple[dict, dict]:
    o = _by_kind(objs)[(kind, name)]
    spec = o["spec"]["template"]["spec"]
    return spec, next(c for c in spec["containers"] if c["name"] == container)


def _port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def _parse_cli(args: list[str]):
    from fabricmon.cli import build_parser

    return build_parser().parse_args(args)


def test_agent_daemonset_contract(rendered, tmp_path) -> None:
    from fabricmon.config import load_agent_config

    _, objs = rendered
    spec, c = _container(objs, "DaemonSet", "fabricmon-agent", "agent")
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["automountServiceAccountToken"] is False
    ns = _parse_cli(c["args"])
    assert ns.command == "agent"
    assert ns.listen == "0.0.0.0:9720"
    assert ns.node_name == "$(NODE_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Port, probes and --listen agree.
    assert _port_number(c, "metrics") == 9720
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert _port_number(c, c[probe]["httpGet"]["port"]) == int(ns.listen.rsplit(":", 1)[1])
    # /sys read-only, at --sysfs-root.
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["sys"]["readOnly"] is True and mounts["sys"]["mountPath"] == ns.sysfs_root
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["sys"]["hostPath"]["path"] == "/sys"
    # Non-root, read-only root fs, no capabilities.
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # The config file loads and agrees with the mounts and flags.
    cm = _by_kind(objs)[("ConfigMap", "fabricmon-agent-config")]
    f = tmp_path / "agent.yaml"
    f.write_text(cm["data"]["agent.yaml"])
    cfg = load_agent_config(f)
    assert cfg.listen == ns.listen and cfg.sysfs_root == ns.sysfs_root
    assert cfg.intake.socket.startswith(mounts["run"]["mountPath"] + "/")
    assert cfg.stream.spool_dir.startswith(mounts["state"]["mountPath"] + "/")
    assert cfg.stream.token_file.startswith(mounts["token"]["mountPath"] + "/")
    host, port = cfg.aggregator.rsplit(":", 1)
    svc = _by_kind(objs)[("Service", "fabricmon-aggregator")]
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert int(port) in {p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"}


def test_aggregator_contract(rendered, tmp_path) -> None:
    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.topology import load_topology

    name, objs = rendered
    spec, c = _container(objs, "Deployment", "fabricmon-aggregator", "aggregator")
    ns = _parse_cli(c["args"])
    assert ns.command == "aggregator" and ns.config == "/etc/fabricmon/aggregator.yaml"
    assert _port_number(c, "grpc") == 9721 and _port_number(c, "http") == 9722
    for probe in ("livenessProbe", "readinessProbe"):
        assert _port_number(c, c[probe]["httpGet"]["port"]) == 9722
    svc = _by_kind(objs)[("Service", "fabricmon-aggregator")]
    assert {(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        ("grpc", 9721, "grpc"), ("http", 9722, "http")}
    pod_labels = _by_kind(objs)[("Deployment", "fabricmon-aggregator")]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    sm = _by_kind(objs)[("ServiceMonitor", "fabricmon-aggregator")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "http"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # Config and topology load as mounted (topology relative to the config file).
    cm = _by_kind(objs)[("ConfigMap", "fabricmon-aggregator-config")]
    (tmp_path / "aggregator.yaml").write_text(cm["data"]["aggregator.yaml"])
    (tmp_path / "topology.yaml").write_text(cm["data"]["topology.yaml"])
    cfg = load_aggregator_config(tmp_path / "aggregator.yaml")
    assert cfg.grpc_listen.endswith(":9721") and cfg.http_listen.endswith(":9722")
    topo = load_topology(cfg.topology)
    if name != "base":
        assert topo.layout == name
    secret = _by_kind(objs)[("Secret", "fabricmon-token")]
    assert "token" in secret["stringData"]
    assert cfg.auth.token_file == "/etc/fabricmon/token/token"


def test_podmonitor_targets_agent_pods(rendered) -> None:
    _, objs = rendered
    pm = _by_kind(objs)[("PodMonitor", "fabricmon-agent")]
    ds = _by_kind(objs)[("DaemonSet", "fabricmon-agent")]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    _, c = _container(objs, "DaemonSet", "fabricmon-agent", "agent")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in c["ports"]}
    # The FabricmonAgentDown rule selects up{job=~".*fabricmon-agent.*"}; the operator names
    # the job <namespace>/<podmonitor name>.
    assert "fabricmon-agent" in pm["metadata"]["name"]
