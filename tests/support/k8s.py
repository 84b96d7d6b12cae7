"""Rendering deploy/kubernetes with real kubectl kustomize, and reading its pod templates."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from support.paths import REPO

K8S_VERSION = "1.30.0"  # oldest Kubernetes the manifests claim (policy/v1 PDB, PSA labels)
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}



K8S = REPO / "deploy" / "kubernetes"


# Every kustomization, not components (kind: Component renders only inside another kustomization).
KUSTOMIZATIONS = sorted(p.parent.relative_to(K8S).as_posix() for p in K8S.rglob("kustomization.yaml")
                        if yaml.safe_load(p.read_text()).get("kind", "Kustomization") == "Kustomization")


@dataclass(frozen=True)
class Identity:
    uid: int | None
    gid: int | None
    groups: frozenset[int]  # supplementary: fsGroup and supplementalGroups


def kubectl() -> str | None:
    return shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def render(directory: Path) -> list[dict]:
    res = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"kubectl kustomize {directory}: {res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def pod_templates(objs: list[dict]) -> list[tuple[str, dict]]:
    """(kind/name, pod spec) of every object that runs pods."""
    out = []
    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "Pod":
            spec = o["spec"]
        elif kind in {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "ReplicationController"}:
            spec = o["spec"]["template"]["spec"]
        elif kind == "CronJob":
            spec = o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        else:
            continue
        out.append((f"{kind}/{name}", spec))
    return out


def identity(spec: dict, container: dict) -> Identity:
    pod_sc = spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    groups = set(pod_sc.get("supplementalGroups", []))
    if "fsGroup" in pod_sc:
        groups.add(pod_sc["fsGroup"])
    return Identity(uid, gid, frozenset(groups))
