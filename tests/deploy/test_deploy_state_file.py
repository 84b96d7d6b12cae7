"""The shipped aggregators keep their open incidents across a restart (#25: restarts page nobody).

An aggregator with `state_file` persists its open incidents and what it sent, and reconciles them
with Alertmanager at start (aggregator/incident_store.py).  That only helps if every shipped
deployment sets it and the file's directory is writable where the process runs:

- Kubernetes (every kustomization, rendered with the real kustomize): each aggregator container's
  config (from the ConfigMap it mounts) names a `state_file` whose directory is a mounted,
  writable volume (the root filesystem is read-only), not a ConfigMap or Secret.
- systemd: the config's `state_file` lies in the unit's StateDirectory=, the only writable place
  under ProtectSystem=strict with DynamicUser=.
"""

from __future__ import annotations

import configparser
from pathlib import PurePosixPath

import pytest
import yaml

from support.k8s import K8S, KUSTOMIZATIONS, kubectl, pod_templates, render
from support.paths import REPO

WRITABLE_VOLUME_KINDS = ("emptyDir", "persistentVolumeClaim", "ephemeral")


def _aggregator_state_dirs(objs: list[dict]) -> list[tuple[str, str, dict | None, dict]]:
    """(workload, state_file, the volume holding its directory or None, the container) per aggregator."""
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    out = []
    for where, spec in pod_templates(objs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("containers", []):
            args = c.get("args", [])
            if not args or args[0] != "aggregator":
                continue
            cfg_path = args[args.index("--config") + 1]
            mount = next(m for m in c["volumeMounts"] if m["mountPath"] == cfg_path)
            cm = configmaps[volumes[mount["name"]]["configMap"]["name"]]
            cfg = yaml.safe_load(cm["data"][mount["subPath"]])
            state_file = cfg.get("state_file", "")
            directory = PurePosixPath(state_file).parent
            # the mount that holds the directory: the longest mountPath that is it or above it
            holders = [m for m in c["volumeMounts"]
                       if directory == PurePosixPath(m["mountPath"])
                       or PurePosixPath(m["mountPath"]) in directory.parents]
            holder = max(holders, key=lambda m: len(m["mountPath"]), default=None)
            volume = None
            if holder is not None and not holder.get("readOnly") and "subPath" not in holder:
                volume = volumes.get(holder["name"])
            out.append((where, state_file, volume, c))
    return out


@pytest.mark.skipif(kubectl() is None, reason="kubectl not installed (pip install '.[test]')")
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_aggregator_persists_its_incidents_on_a_writable_volume(kustomization: str) -> None:
    found = _aggregator_state_dirs(render(K8S / kustomization))
    if kustomization.startswith("examples/") and not found:
        return  # an example of training pods only: no aggregator to check (one that runs an aggregator is)
    assert found, f"{kustomization}: no aggregator container found"
    for where, state_file, volume, c in found:
        assert state_file, f"{kustomization} {where}: aggregator config sets no state_file"
        assert volume is not None, (f"{kustomization} {where}: {state_file}'s directory is on no writable "
                                    f"volume mount (read-only root filesystem: "
                                    f"{c['securityContext'].get('readOnlyRootFilesystem')})")
        kinds = [k for k in WRITABLE_VOLUME_KINDS if k in volume]
        assert kinds, f"{kustomization} {where}: {state_file} is on volume {volume['name']}, not a writable kind"


def test_model_catches_a_missing_or_read_only_state_volume() -> None:
    """The check above fails when it should: no mount, or a read-only one."""
    cm = {"kind": "ConfigMap", "metadata": {"name": "cfg"},
          "data": {"aggregator.yaml": "topology: t.yaml\nstate_file: /var/lib/fabricmon/incidents.json\n"}}

    def deployment(mounts: list[dict], volumes: list[dict]) -> dict:
        c = {"name": "a", "args": ["aggregator", "--config", "/etc/fabricmon/aggregator.yaml"],
             "volumeMounts": [{"name": "config", "mountPath": "/etc/fabricmon/aggregator.yaml",
                               "subPath": "aggregator.yaml"}, *mounts], "securityContext": {}}
        return {"kind": "Deployment", "metadata": {"name": "agg"},
                "spec": {"template": {"spec": {"containers": [c], "volumes": [
                    {"name": "config", "configMap": {"name": "cfg"}}, *volumes]}}}}

    state = {"name": "state", "emptyDir": {}}
    ok = _aggregator_state_dirs([cm, deployment([{"name": "state", "mountPath": "/var/lib/fabricmon"}], [state])])
    assert ok[0][2] == state
    none = _aggregator_state_dirs([cm, deployment([], [state])])
    assert none[0][2] is None
    ro = _aggregator_state_dirs([cm, deployment([{"name": "state", "mountPath": "/var/lib", "readOnly": True}],
                                                [state])])
    assert ro[0][2] is None


def test_systemd_state_file_is_in_the_units_state_directory() -> None:
    cfg = yaml.safe_load((REPO / "systemd" / "etc" / "fabricmon" / "aggregator.yaml").read_text())
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((REPO / "systemd" / "fabricmon-aggregator.service").read_text())
    state_dir = unit["Service"]["StateDirectory"].split()[0]
    assert cfg.get("state_file"), "systemd/etc/fabricmon/aggregator.yaml sets no state_file"
    assert PurePosixPath(cfg["state_file"]).parent == PurePosixPath("/var/lib") / state_dir, (
        f"state_file {cfg['state_file']} is not in StateDirectory={state_dir} (/var/lib/{state_dir}), the one "
        "writable directory of the unit")
