"""The simulated switch side (sim/switch_layout.py, sim/switches.py, sim/sweep_feed.py): which port each
cable ends on, what each switch-side fault counts and where, their job effect, scenario validation with
file:field errors, and the sweep as the sweeping node streams it or writes it for the agent."""

from __future__ import annotations

import numpy as np
import pytest

from fabricmon.configload import ConfigError
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.job import SyntheticJob
from fabricmon.sim.scenario import ClusterSpec, Scenario, load_scenario
from fabricmon.sim.sweep_feed import SweepFeed
from fabricmon.sources.ib_switches.backend_fake import FakeSweep
from fabricmon.sources.ib_switches.source import sweep_readings

CLUSTER = "cluster: {nodes: 32, layout: ib, nodes_per_unit: 8, seed: 3, spines: 4, uplinks_per_leaf: 4}\n"


def _scn(tmp_path, faults: str, cluster: str = CLUSTER, duration: float = 60):
    p = tmp_path / "scn.yaml"
    p.write_text(f"{cluster}duration: {duration}\nfaults:\n{faults}")
    return load_scenario(p)


def test_generated_leaves_cable_hosts_in_node_order_then_uplinks_to_spines_in_turn(tmp_path):
    scn = _scn(tmp_path, "  []\n")
    lay = scn.cluster.switch_layout()
    assert lay is not None and lay.spines == ("spine-0", "spine-1", "spine-2", "spine-3")
    hosts = sorted((h.port, h.node) for h in lay.host_ports if h.leaf == "leaf-u1-r3")
    assert hosts == [(p, 8 + p - 1) for p in range(1, 9)]  # ports 1..nodes_per_unit: node-008.. in order
    ups = [(u.port, u.spine) for u in lay.by_leaf["leaf-u1-r3"]]
    assert ups == [(9, "spine-0"), (10, "spine-1"), (11, "spine-2"), (12, "spine-3")]
    # the aggregator's topology names the same ports: the switch end of a host cable finds its link
    topo = scn.cluster.build_topology()
    assert topo.nic_on_leaf_port("leaf-u1-r3", 2)[0] == "node-009"
    assert topo.shape.spines_of("leaf-u1-r3") == ("spine-0", "spine-1", "spine-2", "spine-3")
    spine_ports = sorted(u.spine_port for u in lay.by_spine["spine-2"])
    assert spine_ports == list(range(1, len(lay.leaves) + 1))  # one per leaf, in leaf order


@pytest.mark.parametrize("fault, where, problem", [
    ("{kind: uplink_flaky, leaf: leaf-u1-r3, port: 3, start: 5}", "faults[0].port", "not an uplink (its uplinks: 9"),
    ("{kind: uplink_flaky, leaf: leaf-u1-r3, port: 9, spine: spine-0, start: 5}", "faults[0].port", "one of them"),
    ("{kind: uplink_down, leaf: leaf-u9-r3, port: 9, start: 5}", "faults[0].leaf", "not a leaf of this cluster"),
    ("{kind: spine_degraded, spine: spine-7, start: 5}", "faults[0].spine", "not a spine of this cluster"),
    ("{kind: switch_congestion, leaf: leaf-u1-r3, port: 40, start: 5}", "faults[0].port", "is not cabled"),
    ("{kind: switch_congestion, leaf: leaf-u1-r3, start: 5}", "faults[0].port", "required"),
    ("{kind: spine_degraded, spine: spine-1, node: node-001, start: 5}", "faults[0].node", "does not apply"),
])
def test_switch_faults_are_validated_with_file_and_field(tmp_path, fault, where, problem):
    with pytest.raises(ConfigError) as err:
        _scn(tmp_path, f"  - {fault}\n")
    assert f"scn.yaml: {where}: " in str(err.value) and problem in str(err.value)


def test_switch_faults_need_the_switch_side(tmp_path):
    with pytest.raises(ConfigError, match=r"scn.yaml: faults\[0\].kind: uplink_down needs the switch side"):
        _scn(tmp_path, "  - {kind: uplink_down, leaf: leaf-u1-r3, port: 9, start: 5}\n",
             cluster="cluster: {nodes: 32, nodes_per_unit: 8}\n")
    with pytest.raises(ConfigError, match=r"scn.yaml: cluster.uplinks_per_leaf: given without spines"):
        _scn(tmp_path, "  []\n", cluster="cluster: {nodes: 32, uplinks_per_leaf: 2}\n")


def test_ground_truth_of_the_switch_kinds(tmp_path):
    scn = _scn(tmp_path, "  - {kind: uplink_flaky, leaf: leaf-u1-r3, spine: spine-2, start: 5}\n"
                         "  - {kind: uplink_down, leaf: leaf-u0-r1, port: 12, start: 5}\n"
                         "  - {kind: spine_degraded, spine: spine-1, start: 5}\n"
                         "  - {kind: switch_congestion, leaf: leaf-u2-r5, port: 10, start: 5}\n"
                         "  - {kind: switch_congestion, leaf: leaf-u2-r5, port: 3, start: 5}\n")
    got = [(g.component_type, g.component, g.alertname) for g in scn.ground_truth()]
    assert got == [("uplink", "leaf-u1-r3/p11", "FabricLinkErrors"), ("uplink", "leaf-u0-r1/p12", "FabricLinkDown"),
                   ("spine", "spine-1", "FabricSpineDegraded"), ("uplink", "leaf-u2-r5/p10", "FabricCongestion"),
                   ("link", "node-018/mlx5_5/1", "FabricCongestion")]  # port 3 of unit 2: its third host


def _run(scn: Scenario, seconds: int) -> ClusterState:
    c = ClusterState(scn)
    for _ in range(seconds):
        c.advance(1.0)
    return c


def _errors(snap, switch: str, port: int) -> int:
    r = next(r for r in snap.switches if r.switch.name == switch)
    return r.ports[port].errors["symbol_error"][0]


def test_uplink_faults_count_on_both_ends_of_their_cable_only(tmp_path):
    scn = _scn(tmp_path, "  - {kind: uplink_flaky, leaf: leaf-u1-r3, port: 10, start: 5}\n"
                         "  - {kind: flaky_cable, node: node-020, rail: 6, start: 5}\n"
                         "  - {kind: uplink_down, leaf: leaf-u0-r0, port: 9, start: 5}\n")
    c = _run(scn, 20)
    assert c.switches is not None
    snap = c.switches.snapshot(c.ts(), 0.1)
    up = c.switches.layout.uplink_at("leaf-u1-r3", 10)
    assert up is not None and up.spine == "spine-1" and up.spine_port == 12  # leaf-u1-r3 is the 12th leaf
    assert _errors(snap, "leaf-u1-r3", 10) > 0 and _errors(snap, "spine-1", 12) > 0
    assert _errors(snap, "leaf-u2-r6", 5) > 0  # node-020 is the fifth host of unit 2: its leaf's port 5
    noisy = [(r.switch.name, p) for r in snap.switches for p, s in r.ports.items() if s.errors["symbol_error"][0]]
    assert sorted(noisy) == [("leaf-u1-r3", 10), ("leaf-u2-r6", 5), ("spine-1", 12)]
    down = [(r.switch.name, p) for r in snap.switches for p, s in r.states.items() if not s.up]
    assert sorted(down) == [("leaf-u0-r0", 9), ("spine-0", 1)]
    leaf = next(r for r in snap.switches if r.switch.name == "leaf-u0-r0")
    assert leaf.ports[9].errors["link_downed"][0] == c.switches.uc[3, 0, 0] and leaf.switch.cables[9].peer == "spine-0"


def test_a_job_crossing_a_down_uplink_loses_its_share_and_one_under_one_leaf_does_not(tmp_path):
    scn = _scn(tmp_path, "  - {kind: uplink_down, leaf: leaf-u1-r3, port: 9, start: 5}\n")
    c = _run(scn, 6)
    eff = c.effects()
    assert eff.uplink_bw is not None and np.isclose(eff.uplink_bw[8, 3], 0.75) and eff.uplink_bw[0, 3] == 1.0
    across = SyntheticJob(c.names[:16])  # units 0 and 1: rail 3 crosses leaf-u1-r3's uplinks
    inside = SyntheticJob(c.names[8:16], index=list(range(8, 16)))  # unit 1 only: stays in its leaves
    healthy = ClusterState(_scn(tmp_path, "  []\n")).effects()
    for job, slower in ((across, True), (inside, False)):
        t_bad = job.simulate_step(eff)["transfer"][0, 3]
        t_ok = job.simulate_step(healthy)["transfer"][0, 3]
        assert bool(t_bad > t_ok * 1.2) is slower and t_bad >= t_ok


def test_memory_mode_streams_the_sweep_in_the_sweeping_nodes_batch_and_tree_mode_writes_the_file(tmp_path):
    from fabricmon.sim.runner import SimulatedCluster

    scn = _scn(tmp_path, "  - {kind: uplink_flaky, leaf: leaf-u1-r3, port: 10, start: 2}\n", duration=30)
    sim = SimulatedCluster(scn, mode="memory", job=None)
    got = []
    sim.on_batch = got.append
    sim.start()
    for _ in range(11):
        sim.step()
    assert sim.switch_sources == ("node-000",)
    sweeping = [b for b in got if b.node == "node-000"]
    errs = [d for b in sweeping for d in b.deltas if d.family == "fabricmon_switch_port_errors_total" and d.delta]
    assert {dict(d.labels)["switch"] for d in errs} == {"leaf-u1-r3", "spine-1"}
    assert not any(d.family.startswith("fabricmon_switch_") for b in got if b.node != "node-000" for d in b.deltas)
    # the file the sweeping node's agent reads (tree mode) holds the same sweep
    feed = SweepFeed(sim.cluster.switches, "node-000")
    path = tmp_path / "sweep.json"
    feed.write(sim.t, sim.now(), str(path))
    snap = FakeSweep(str(path)).snapshot()
    up = sim.cluster.switches.layout.uplink_at("leaf-u1-r3", 10)
    assert not snap.problem and _errors(snap, "leaf-u1-r3", 10) == int(sim.cluster.switches.uc[0, up.index, 0]) > 0
    assert len(sweep_readings(snap, sim.now())) > 1000
    sim.close()


def test_without_spines_nothing_changes():
    c = ClusterState(Scenario(ClusterSpec(16, "ib", 8), 30))
    assert c.switches is None and c.effects().uplink_bw is None


def test_tree_mode_the_sweeping_nodes_real_agent_reads_the_fake_sweep_file(tmp_path):
    from fabricmon.sim.runner import SimulatedCluster

    cluster = "cluster: {nodes: 4, layout: ib, nodes_per_unit: 2, seed: 3, spines: 2, uplinks_per_leaf: 2}\n"
    scn = _scn(tmp_path, "  - {kind: uplink_flaky, leaf: leaf-u1-r3, spine: spine-1, start: 2}\n", cluster,
               duration=30)
    got = []
    with SimulatedCluster(scn, mode="tree", base_dir=tmp_path / "trees", job=None, sweep_interval=2.0) as sim:
        sim.on_batch = got.append
        sim.start()
        for _ in range(4):  # sweeps at 0, 2 and 4 s: the fault's errors from 2 s in the last
            sim.step()
        assert sim.switch_file() is not None and (tmp_path / "trees" / "switch-sweep.json").exists()
        up = sim.cluster.switches.layout.uplink_to("leaf-u1-r3", "spine-1")
    errs = {(dict(d.labels)["switch"], dict(d.labels)["port"]) for b in got if b.node == "node-000"
            for d in b.deltas if d.family == "fabricmon_switch_port_errors_total" and d.delta}
    assert errs == {("leaf-u1-r3", str(up.port)), ("spine-1", str(up.spine_port))}  # both ends of that uplink
    assert not any(d.family.startswith("fabricmon_switch_") for b in got if b.node != "node-000" for d in b.deltas)


def test_an_imported_fabric_gets_uplinks_to_its_own_spines_after_its_host_ports():
    from support.promtools import REPO

    scn = load_scenario(REPO / "examples/scenarios/imported-uplink.yaml")
    lay = scn.cluster.switch_layout()
    assert lay is not None
    assert [(u.leaf, u.port, u.spine, u.spine_port) for u in lay.uplinks] == [
        ("leaf-0", 9, "switch-00000c42f0000000", 1), ("leaf-0", 10, "switch-00000c42f0000001", 1),
        ("leaf-1", 9, "switch-00000c42f0000000", 2), ("leaf-1", 10, "switch-00000c42f0000001", 2)]
    assert sorted(p for (leaf, p) in lay.host_by_port if leaf == "leaf-0") == list(range(1, 9))
    [truth] = scn.ground_truth()
    assert (truth.component_type, truth.component) == ("uplink", "leaf-0/p10")
    topo = scn.cluster.build_topology()  # the aggregator's: every host cable's leaf port stated
    assert topo.nic_on_leaf_port("leaf-0", 1) is not None
