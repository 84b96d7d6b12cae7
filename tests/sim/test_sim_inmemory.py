"""In-memory batches equal the real agent pipeline's, and 4,096 nodes build without touching the disk."""

from __future__ import annotations

import os
import time

import pytest

from fabricmon.metrics import SPECS
from fabricmon.sim.agents import make_sim_agent
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.inmemory import BatchBuilder, GaugeFilter, batch_from_snapshot
from fabricmon.sim.scenario import ClusterSpec, Scenario, default_scenario
from fabricmon.sim.tree import NodeTree
from support.simrig import faults_for


def keyed_deltas(batch):
    return {(d.family, d.labels): (d.delta, d.saturated, d.reset) for d in batch.deltas}


def keyed_gauges(batch):
    return {(s.family, s.labels): s.value for s in batch.gauges}


@pytest.mark.parametrize("layout", ["ib", "roce"])
def test_inmemory_batches_equal_the_real_agent_pipeline(tmp_path, layout):
    scn = Scenario(ClusterSpec(4, layout, 2, seed=3), 30, faults_for(layout))
    c = ClusterState(scn)
    tree = NodeTree(c, 1, tmp_path / "node-001")
    tree.render()
    builder = BatchBuilder(c)
    agent = make_sim_agent(tree, c.ts)
    filt = GaugeFilter()
    compared = saw_reset = saw_sat = 0
    try:
        for step in range(12):
            if step:
                c.advance(1.0)
                tree.render()
            real = batch_from_snapshot(agent.poller.poll_once(), filt, step + 1)
            mem = builder.build()[1]
            assert (mem.node, mem.ts, mem.interval_seconds) == (real.node, real.ts, real.interval_seconds)
            assert keyed_deltas(mem) == keyed_deltas(real), f"step {step}"
            assert keyed_gauges(mem) == keyed_gauges(real), f"step {step}"
            assert [(d.family, d.labels) for d in mem.deltas] == [(d.family, d.labels) for d in real.deltas]
            compared += len(real.deltas) + len(real.gauges)
            saw_reset += sum(d.reset for d in real.deltas)
            saw_sat += sum(d.saturated for d in real.deltas)
    finally:
        agent.stop()
    assert compared > 4000 and saw_reset > 100  # the comparison covered a reset, not just quiet traffic


def test_family_and_label_names_are_the_spec_order():
    c = ClusterState(Scenario(ClusterSpec(2, "roce", 2), 60))
    b = BatchBuilder(c)
    first = b.build()[0]
    c.advance(1.0)
    second = b.build()[0]
    items = [(d.family, d.labels) for d in second.deltas] + [(s.family, s.labels) for s in first.gauges]
    for fam, labels in items:
        spec = SPECS.get(fam)
        assert spec is not None, fam
        assert tuple(k for k, _ in labels) == spec.labels, (fam, labels)
    assert first.deltas == () and len(first.gauges) > 400 and len(second.gauges) < 50


def test_flaky_cable_deltas_only_on_its_port_from_its_start():
    scn = default_scenario(32, 40)  # flaky cable node-017 rail 3 from t=10 to 24
    c = ClusterState(scn)
    b = BatchBuilder(c)
    b.build()
    seen = []
    for _ in range(30):
        c.advance(1.0)
        for batch in b.build():
            for d in batch.deltas:
                if d.family == "fabricmon_ib_port_errors_total" and d.labels[2] == ("counter", "symbol_error"):
                    seen.append((batch.node, d.labels[0][1], batch.ts - c.epoch))
    nodes_ports = {(n, dev) for n, dev, _ in seen}
    assert ("node-017", "mlx5_3") in nodes_ports
    leaf_nodes = {n for n, dev, _ in seen if dev == "mlx5_5"}  # the leaf fault: unit 0, rail 5, from t=18
    assert nodes_ports - {("node-017", "mlx5_3")} == {(n, "mlx5_5") for n in leaf_nodes}
    assert leaf_nodes <= {f"node-{i:03d}" for i in range(16)}
    assert min(t for n, dev, t in seen if dev == "mlx5_3") == 10.0


def test_4096_nodes_in_memory_without_touching_the_file_system(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    c = ClusterState(default_scenario(4096, 600))
    b = BatchBuilder(c)
    hellos = b.hellos()
    b.build()
    c.advance(1.0)
    batches = b.build()
    elapsed = time.perf_counter() - t0
    assert len(hellos) == len(batches) == 4096
    assert hellos[17].node == "node-0017" and len(hellos[17].nics) == 9
    assert sum(len(x.deltas) for x in batches) > 4096 * 300
    assert os.listdir(tmp_path) == []
    assert elapsed < 60, f"4,096-node in-memory build took {elapsed:.1f} s"
