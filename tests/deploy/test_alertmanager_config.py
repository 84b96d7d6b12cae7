"""deploy/alertmanager/alertmanager.yml: amtool checks and inhibitions on a real Alertmanager."""

from __future__ import annotations

import datetime as dt
import re

import pytest
import yaml

from support.promtools import REPO, amtool, running_alertmanager, wait_until

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
DESIGN_ALERTS = {
    "FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded", "FabricLeafDegraded",
    "FabricPFCStorm", "FabricCongestion", "RDMARetransmits", "FabricConfigDrift", "NVLinkDown", "NVLinkErrors",
    "GPUXidFatal", "StragglerRank", "SlowRanksSharedComponent", "StageImbalance", "FabricmonAgentDown",
    "FabricmonCollectorFailing", "FabricCableDegrading", "FabricmonAggregatorDown", "FabricmonAgentStreamDown",
    "FabricSpineDegraded",
}


def _cfg() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_amtool_check_config() -> None:
    res = amtool("check-config", CONFIG)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_group_by_and_every_inhibition_has_equal() -> None:
    cfg = _cfg()
    assert cfg["route"]["group_by"] == ["cluster", "alertname", "leaf", "rail", "component"]
    rules = cfg["inhibit_rules"]
    assert rules
    for rule in rules:
        assert rule.get("equal"), rule
        assert "cluster" in rule["equal"], rule
        names = re.findall(r"[A-Z][A-Za-z]+", " ".join(rule["source_matchers"] + rule["target_matchers"]))
        assert set(names) <= DESIGN_ALERTS, names
    pairs = {(tuple(r["source_matchers"]), tuple(r["target_matchers"])): r["equal"] for r in rules}
    link_symptoms = ('alertname=~"FabricLinkErrors|FabricLinkFlapping|FabricLinkDegraded|FabricCableDegrading'
                     '|RDMARetransmits"')
    assert pairs[(('alertname="FabricLinkDown"',), (link_symptoms,))] == ["cluster", "component"]
    assert pairs[(('alertname=~"NVLinkDown|GPUXidFatal"',), ('alertname=~"NVLinkErrors|StragglerRank"',))] \
        == ["cluster", "node", "gpu"]
    # Scoped to the ranks that use the shared component (tests/deploy/test_alertmanager_inhibitions.py).
    # A fabric source hides only communication lateness: a compute straggler under it shows (issue 36).
    comm = 'lateness!="compute"'
    assert pairs[(('alertname="SlowRanksSharedComponent"', 'component_type="leaf"'),
                  ('alertname="StragglerRank"', comm))] == ["cluster", "hpc_job", "leaf"]
    assert pairs[(('alertname=~"FabricLinkDown|FabricLeafDegraded"',),
                  ('alertname=~"StragglerRank|SlowRanksSharedComponent"', comm))] == ["cluster", "rail"]
    assert pairs[(('alertname=~"FabricLinkFlapping|FabricLinkErrors"',), ('alertname="StragglerRank"', comm))] \
        == ["cluster", "leaf"]
    assert pairs[(('alertname="FabricLeafDegraded"',), ('alertname="StragglerRank"', comm))] == ["cluster", "leaf"]
    assert pairs[(('alertname="FabricSpineDegraded"',), ('component_type="uplink"',))] == ["cluster", "spine"]
    assert pairs[(('alertname="FabricmonAgentDown"',),
                  ('alertname!="FabricmonAgentDown"', 'node=~".+"', 'severity!="critical"', 'switch_end=""'))] \
        == ["cluster", "node"]


@pytest.mark.parametrize(("labels", "receiver"), [
    ({"alertname": "FabricLinkDown", "severity": "critical", "component_type": "link"}, "fabric-pager"),
    ({"alertname": "FabricLeafDegraded", "severity": "critical", "component_type": "leaf"}, "fabric-pager"),
    # the switch side: a leaf-spine cable and its spine
    ({"alertname": "FabricLinkDown", "severity": "critical", "component_type": "uplink"}, "fabric-pager"),
    ({"alertname": "FabricLinkErrors", "severity": "warning", "component_type": "uplink"}, "fabric-ticket"),
    ({"alertname": "FabricSpineDegraded", "severity": "critical", "component_type": "spine"}, "fabric-pager"),
    ({"alertname": "GPUXidFatal", "severity": "critical", "component_type": "gpu"}, "compute-pager"),
    ({"alertname": "NVLinkErrors", "severity": "warning", "component_type": "nvlink"}, "compute-ticket"),
    ({"alertname": "FabricConfigDrift", "severity": "warning", "component_type": "config"}, "fabric-ticket"),
    ({"alertname": "StageImbalance", "severity": "info", "component_type": "node"}, "blackhole"),
    ({"alertname": "FabricmonAggregatorDown", "severity": "critical", "component_type": "service"}, "monitoring-pager"),
    ({"alertname": "FabricmonAgentsDisconnected", "severity": "warning", "component_type": "service"},
     "monitoring-ticket"),
])
def test_routes(labels: dict, receiver: str) -> None:
    res = amtool("config", "routes", "test", f"--config.file={CONFIG}", *(f"{k}={v}" for k, v in labels.items()))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == receiver


def _alert(**labels: str) -> dict:
    now = dt.datetime.now(dt.UTC)
    return {"labels": {"cluster": "test", **labels},
            "annotations": {"summary": "test"},
            "startsAt": now.isoformat(),
            "endsAt": (now + dt.timedelta(minutes=10)).isoformat()}


@pytest.mark.integration
def test_inhibitions_on_a_real_alertmanager(tmp_path) -> None:
    # The real config, with receivers pointed nowhere reachable: only inhibition is under test.
    with running_alertmanager(CONFIG.read_text(), tmp_path / "am") as am:
        leaf = dict(leaf="leaf-u1-r3", rail="3")
        other_leaf = dict(leaf="leaf-u2-r3", rail="3")
        am.post_alerts([
            _alert(alertname="FabricLeafDegraded", severity="critical", component_type="leaf",
                   component="leaf-u1-r3", **leaf),
            # Under the degraded leaf: both inhibited.
            _alert(alertname="FabricLinkErrors", severity="warning", component_type="link",
                   component="node-017/mlx5_3/1", node="node-017", **leaf),
            _alert(alertname="StragglerRank", severity="warning", component_type="gpu",
                   component="node-018/gpu3", node="node-018", gpu="3", hpc_job="llm-7b", **leaf),
            # Another leaf: not inhibited.
            _alert(alertname="FabricLinkErrors", severity="warning", component_type="link",
                   component="node-040/mlx5_3/1", node="node-040", **other_leaf),
            # Link down on node-050 hides errors on that link, not on a neighbour's link.
            _alert(alertname="FabricLinkDown", severity="critical", component_type="link",
                   component="node-050/mlx5_1/1", node="node-050", leaf="leaf-u3-r1", rail="1"),
            _alert(alertname="FabricLinkErrors", severity="warning", component_type="link",
                   component="node-050/mlx5_1/1", node="node-050", leaf="leaf-u3-r1", rail="1"),
            _alert(alertname="FabricLinkErrors", severity="warning", component_type="link",
                   component="node-051/mlx5_1/1", node="node-051", leaf="leaf-u3-r1", rail="1"),
            # Sharded: another replica's slow ranks on rail 3 (node-040's link is on rail 3) are hidden,
            # slow ranks on rail 6, which no fabric alert names, are not.
            _alert(alertname="SlowRanksSharedComponent", severity="critical", component_type="rail",
                   component="rail3", rail="3", hpc_job="llm-7b"),
            _alert(alertname="SlowRanksSharedComponent", severity="critical", component_type="leaf",
                   component="leaf-u5-r6", leaf="leaf-u5-r6", rail="6", hpc_job="llm-7b"),
        ])

        def by_key() -> dict | None:
            alerts = am.get_alerts()
            if len(alerts) < 9:
                return None
            out = {(a["labels"]["alertname"], a["labels"]["component"]): a["status"] for a in alerts}
            # Inhibition is computed asynchronously: wait until the expected ones show it.
            if not out[("FabricLinkErrors", "node-017/mlx5_3/1")]["inhibitedBy"]:
                return None
            if not out[("FabricLinkErrors", "node-050/mlx5_1/1")]["inhibitedBy"]:
                return None
            if not out[("SlowRanksSharedComponent", "rail3")]["inhibitedBy"]:
                return None
            return out

        status = wait_until(by_key, 15.0, "inhibitions to be computed", interval=0.2)
        assert status[("StragglerRank", "node-018/gpu3")]["inhibitedBy"]
        assert status[("StragglerRank", "node-018/gpu3")]["state"] == "suppressed"
        assert not status[("FabricLinkErrors", "node-040/mlx5_3/1")]["inhibitedBy"]
        assert status[("FabricLinkErrors", "node-040/mlx5_3/1")]["state"] == "active"
        assert not status[("FabricLinkErrors", "node-051/mlx5_1/1")]["inhibitedBy"]
        assert not status[("FabricLeafDegraded", "leaf-u1-r3")]["inhibitedBy"]
        assert not status[("FabricLinkDown", "node-050/mlx5_1/1")]["inhibitedBy"]
        assert status[("SlowRanksSharedComponent", "rail3")]["state"] == "suppressed"
        assert not status[("SlowRanksSharedComponent", "leaf-u5-r6")]["inhibitedBy"]
        assert status[("SlowRanksSharedComponent", "leaf-u5-r6")]["state"] == "active"
