"""Switch-side faults from the simulator through the aggregator (memory mode: the sweeping node's batch
carries the sweep, as its agent streams it): an uplink going down is one FabricLinkDown on the uplink
naming both ends of its cable, and the stragglers of the job whose rings cross it are its impact, never
pages of their own; a spine whose uplinks all count errors is one FabricSpineDegraded; transmit wait on
a switch port is FabricCongestion naming that port; a flaky host cable counting at both ends is one
incident, and a host link going down once (counted at both ends) is one FabricLinkDown, not a flap."""

from __future__ import annotations

import pytest

from fabricmon.aggregator.engine import Engine
from fabricmon.sim.drive import Drive
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import load_scenario

CLUSTER = "cluster: {nodes: 32, layout: ib, nodes_per_unit: 8, seed: 5, spines: 4, uplinks_per_leaf: 4}\n"
STRAGGLER_PAGES = ("StragglerRank", "SlowRanksSharedComponent")


def _run(tmp_path, faults: str, duration: float) -> list:
    p = tmp_path / "scn.yaml"
    p.write_text(f"{CLUSTER}duration: {duration}\nfaults:\n{faults}")
    sim = SimulatedCluster(load_scenario(p), mode="memory")
    engine = Engine(sim.topology, cluster="t")
    drive = Drive(sim, engine=engine)
    drive.connect()
    try:
        drive.run()
    finally:
        sim.close()
    return engine.incidents()


def _pages(incidents) -> list:
    return [i for i in incidents if i.severity in ("warning", "critical")]


@pytest.fixture(scope="module")
def uplink_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("uplink"),
                "  - {kind: uplink_down, leaf: leaf-u1-r3, spine: spine-0, start: 10, end: 55}\n"
                "  - {kind: flaky_cable, node: node-020, rail: 6, start: 10, end: 40}\n"
                "  - {kind: switch_congestion, leaf: leaf-u3-r5, port: 10, start: 10, end: 55}\n"
                "  - {kind: link_down, node: node-009, rail: 2, start: 10, end: 40}\n", 60)


def test_an_uplink_down_is_one_alert_on_the_uplink_and_its_stragglers_ride_on_it(uplink_run):
    down = [i for i in uplink_run if i.component == "leaf-u1-r3/p9"]
    assert [i.alertname for i in down] == ["FabricLinkDown"]
    inc = down[0]
    assert inc.component_type == "uplink" and "node" not in inc.labels
    assert inc.labels["spine"] == "spine-0" and inc.labels["leaf"] == "leaf-u1-r3"
    assert inc.description.startswith("Cable: leaf-u1-r3 port 9 <-> spine-0 port ")
    assert list(inc.jobs) == ["llm-7b"] and inc.ranks  # the job whose rail-3 ring crosses it: its impact
    assert not [i for i in _pages(uplink_run) if i.alertname in STRAGGLER_PAGES], \
        [(i.alertname, i.component) for i in _pages(uplink_run)]


def test_a_flaky_host_cable_counting_at_both_ends_is_one_incident(uplink_run):
    on_cable = [i for i in uplink_run if "node-020" in i.component or i.component.startswith("leaf-u2-r6")]
    assert [(i.alertname, i.component) for i in on_cable] == [("FabricLinkErrors", "node-020/mlx5_6/1")]


def test_a_host_link_going_down_once_is_not_a_flap_though_both_ends_count_it(uplink_run):
    # LinkDownedCounter at the host and at the leaf count the one going down: one end says it
    on_cable = [(i.alertname, i.component) for i in uplink_run if i.component.startswith("node-009/")]
    assert on_cable == [("FabricLinkDown", "node-009/mlx5_2/1")]


def test_transmit_wait_on_a_switch_port_is_congestion_naming_that_port(uplink_run):
    cong = [i for i in uplink_run if i.alertname == "FabricCongestion"]
    assert [i.component for i in cong] == ["leaf-u3-r5/p10"]
    assert any(e.startswith("transmit wait at switch port leaf-u3-r5 port 10") for e in cong[0].evidence)


def test_a_spine_with_errors_on_every_uplink_is_one_spine_alert(tmp_path):
    incidents = _run(tmp_path, "  - {kind: spine_degraded, spine: spine-2, start: 10, end: 45, magnitude: 2}\n", 50)
    pages = _pages(incidents)
    assert [(i.alertname, i.component) for i in pages if not i.related_to] == [("FabricSpineDegraded", "spine-2")]
    spine = next(i for i in pages if i.component == "spine-2")
    # every ring crosses uplinks (the job spans units): all slower together, no straggler, and the cost is
    # the spine's, measured on the job whose traffic crosses it
    assert [x.job for x in spine.impact] == ["llm-7b"] and spine.impact[0].step_slowdown > 0.01
    assert not [i for i in pages if i.alertname in STRAGGLER_PAGES]
