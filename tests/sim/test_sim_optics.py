"""The simulator's optics: module readings reach the real agent through the tree exactly as the
in-memory batches carry them, and FEC-corrected bits follow each link's BER over its data rate."""

from __future__ import annotations

import numpy as np
import pytest

from fabricmon.sim.agents import make_sim_agent
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import K
from fabricmon.sim.inmemory import BatchBuilder
from fabricmon.sim.link_optics import MODULE_INTERVAL_S
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree


@pytest.mark.parametrize("layout", ["ib", "roce"])
def test_module_gauges_through_the_tree_equal_the_inmemory_ones_after_a_refresh(tmp_path, layout):
    scn = Scenario(ClusterSpec(2, layout, 2, seed=4), 600) \
        .with_fault("cable_degrading", node="node-001", rail=2, start=0, fails_at=500)
    c = ClusterState(scn)
    for _ in range(int(MODULE_INTERVAL_S) + 1):
        c.advance(1.0)
    assert c.optics.module_taken_at == MODULE_INTERVAL_S
    tree = NodeTree(c, 1, tmp_path / "node-001")
    tree.render()
    agent = make_sim_agent(tree, c.ts)
    try:
        snap = agent.poller.poll_once()
    finally:
        agent.stop()
    real = {(s.family, s.labels): s.value for s in snap.samples if s.family.startswith("fabricmon_transceiver_")}
    mem = {(s.family, s.labels): s.value for s in BatchBuilder(c).build()[1].gauges
           if s.family.startswith("fabricmon_transceiver_")}
    assert real == mem
    assert len(real) == 8 * (3 + 3 * 4)  # 8 rail NICs: temperature, Vcc, age + 3 readings x 4 lanes
    # the degrading lane already reads lower than its own start
    lane = c.optics.bad_lane[id(scn.faults[0])]
    key = ("fabricmon_transceiver_rx_power_watts", (("device", "mlx5_2"), ("port", "1"), ("lane", str(lane))))
    assert 10 * np.log10(real[key] * 1e3) < c.optics.rx_dbm0[1, 2, lane] - 0.05


def test_corrected_bits_follow_ber_and_lanes_add_up():
    scn = Scenario(ClusterSpec(4, "roce", 4, seed=2), 600)
    c = ClusterState(scn)
    before = c.counters.C.copy()
    c.advance(10.0)
    d = c.counters.C - before
    corr = d[K["eth:rx_corrected_bits_phy"]]
    lanes = sum(d[K[f"eth:rx_err_lane_{i}_phy"]] for i in range(4))
    assert (corr == lanes).all()
    eth = c.links.eth_mask
    ber = corr[:, eth] / (c.links.gbps()[:, eth] * 1e9 * 0.97 * 10)
    assert (ber > 1e-9).all() and (ber < 1e-5).all()  # healthy NDR links: far below the FEC limit
    assert (corr[:, ~eth] == 0).all()  # IB ports have no ethtool FEC counters
