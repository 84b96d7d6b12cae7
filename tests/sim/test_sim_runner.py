"""SimulatedCluster: tree mode with real agents, memory mode, simulated clock, topology, bounds."""

from __future__ import annotations

import os
import shutil
import urllib.request

import pytest

from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import ClusterSpec, Scenario, default_scenario
from fabricmon.sim.tree import default_base_dir
from fabricmon.topology import load_topology


def test_tree_mode_streams_batches_on_the_simulated_clock(tmp_path):
    scn = default_scenario(4, 20, nodes_per_unit=2)  # flaky cable on node-003 rail 3 from t=5 to 12
    batches, snaps = [], []
    trees = default_base_dir("fabricmon-test-")  # tmpfs when there is one: trees are rewritten every second
    try:
        with SimulatedCluster(scn, base_dir=trees, on_batch=batches.append,
                              on_snapshot=lambda n, s, r: snaps.append((n, s, r))) as sim:
            sim.write_topology(tmp_path / "topology.yaml")
            assert sim.run(until=8) == 8
            hellos = sim.hellos()
        assert os.path.isdir(os.path.join(trees, "node-003", "sys"))  # a caller's directory is kept
    finally:
        shutil.rmtree(trees, ignore_errors=True)
    assert len(snaps) == 4 * 9 and all(s.node == n for n, s, _ in snaps)
    assert [h.node for h in hellos] == ["node-000", "node-001", "node-002", "node-003"]
    assert {n.rail for n in hellos[0].nics} == {str(r) for r in range(8)} | {""}
    epoch = sim.cluster.epoch
    by_node = {}
    for b in batches:
        by_node.setdefault(b.node, []).append(b)
    assert [b.ts - epoch for b in by_node["node-003"]] == [float(t) for t in range(9)]  # t=0 .. 8
    assert [b.seq for b in by_node["node-003"]] == list(range(1, 10))
    assert by_node["node-003"][0].layouts and by_node["node-003"][0].deltas == ()
    ranks = [r for b in by_node["node-003"] for r in b.ranks]
    assert ranks and {r.node for r in ranks} == {"node-003"} and {r.local_rank for r in ranks} == set(range(8))
    sym = [(b.ts - epoch, d.delta) for b in batches for d in b.deltas
           if d.labels[-1:] == (("counter", "symbol_error"),)]
    assert sym and min(t for t, _ in sym) == 5.0
    assert {b.node for b in batches for d in b.deltas if d.labels[-1:] == (("counter", "symbol_error"),
                                                                           )} == {"node-003"}
    topo = load_topology(tmp_path / "topology.yaml")
    assert topo.leaf_of("node-003", 3) == "leaf-u1-r3" and len(topo.nodes) == 4


def test_own_tree_dir_is_removed_and_http_serves_metrics():
    scn = Scenario(ClusterSpec(2, "roce", 2), 10)
    with SimulatedCluster(scn, http=True) as sim:
        base = sim.base_dir
        sim.step()
        port = sim.tree_agents.http_ports["node-001"]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'node="node-001"' in body and 'interface="enp154s0np0"' in body
        assert "fabricmon_nvlink_transmit_bytes_total" in body
    assert not os.path.exists(base)


@pytest.mark.parametrize("mode", ["tree", "memory"])
def test_sink_set_after_start_still_gets_the_first_full_batch(mode):
    sim = SimulatedCluster(Scenario(ClusterSpec(2, "roce", 2), 10), mode=mode)
    try:
        sim.start()
        assert len(sim.hellos()) == 2
        got = []
        sim.on_batch = got.append
        sim.step()
    finally:
        sim.close()
    assert [(b.node, b.seq) for b in got] == [("node-000", 1), ("node-001", 1), ("node-000", 2), ("node-001", 2)]
    assert len(got[0].gauges) > 400 and got[0].layouts  # every gauge, and the job layout, come first
    assert got[2].deltas and len(got[2].gauges) < 100


def test_memory_mode_runs_a_scenario_to_its_end():
    scn = default_scenario(64, 12)
    got = []
    sim = SimulatedCluster(scn, mode="memory", on_batch=got.append)
    steps = sim.run()
    sim.close()
    assert steps == 12 and sim.t == 12.0
    assert len(got) == 64 * 13
    # every completed step of each job, one line per rank (its nodes x 8 GPUs)
    assert sum(len(b.ranks) for b in got) == sum(j.n * 8 * j.step for j in sim.jobs.jobs)


def test_bounds():
    with pytest.raises(ValueError, match="too many for tree mode"):
        SimulatedCluster(Scenario(ClusterSpec(300), 10))
    sim = SimulatedCluster(Scenario(ClusterSpec(2), 5), mode="memory")
    assert sim.run(until=100) == 5  # never past the scenario's duration
    sim.close()


def test_speed_paces_wall_time():
    import time

    sim = SimulatedCluster(Scenario(ClusterSpec(2), 10), mode="memory", job=None)
    t0 = time.monotonic()
    sim.run(until=2, speed=4.0)  # 2 simulated seconds at 4x: about 0.5 s of wall time
    assert 0.4 < time.monotonic() - t0 < 5
    sim.close()
