"""Fault injection changes exactly the components the ground truth names (state, trees, real agent)."""

from __future__ import annotations

import os
from itertools import pairwise

import numpy as np
import pytest

from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import HW_Q32, HW_ROCE_ACCL32, NDEV, PMA_ERR_WIDTH, K, pci_device_path
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree

ERRORS = [f"pma:{n}" for n in PMA_ERR_WIDTH if n != "port_xmit_wait"]
HW_ERRORS = [f"hw:{n}" for n in HW_Q32 + HW_ROCE_ACCL32 if not n.startswith("rx_")]


def run(scn: Scenario, seconds: int) -> ClusterState:
    c = ClusterState(scn)
    for _ in range(seconds):
        c.advance(1.0)
    return c


def moved(a: ClusterState, b: ClusterState, names) -> set[tuple[str, int, int]]:
    """(counter, node, device) whose value differs between two runs of the same cluster."""
    out = set()
    for name in names:
        diff = a.counters.C[K[name]] != b.counters.C[K[name]]
        out |= {(name, int(n), int(d)) for n, d in zip(*np.nonzero(diff), strict=True)}
    return out


def test_flaky_cable_raises_exactly_that_ports_symbol_errors():
    base = Scenario(ClusterSpec(32, "ib", 16, seed=5), 60)
    clean = run(base, 20)
    faulty = run(base.with_fault("flaky_cable", node="node-017", rail=3, start=5, end=15), 20)
    sym = moved(clean, faulty, ["pma:symbol_error"])
    assert sym == {("pma:symbol_error", 17, 3)}
    assert faulty.counters.C[K["pma:symbol_error"], 17, 3] - clean.counters.C[K["pma:symbol_error"], 17, 3] > 100
    # every other error counter moved on that port only, and traffic elsewhere is untouched
    assert {(n, d) for _, n, d in moved(clean, faulty, ERRORS + HW_ERRORS)} == {(17, 3)}
    assert not moved(clean, faulty, ["pma:port_xmit_data"]) - {("pma:port_xmit_data", 17, 3)}


def test_flaky_cable_stops_rising_after_end():
    scn = Scenario(ClusterSpec(4, "roce", 4, seed=1), 60).with_fault("flaky_cable", node="node-001", rail=2,
                                                                   start=3, end=6)
    c = ClusterState(scn)
    seen = []
    for _ in range(10):
        c.advance(1.0)
        seen.append(int(c.counters.C[K["pma:symbol_error"], 1, 2]))
    assert seen[0] == seen[1]  # before start (t = 1, 2)
    assert seen[2] < seen[4]  # rising while active
    assert seen[6] == seen[9]  # flat after end
    assert c.counters.C[K["eth:rx_crc_errors_phy"], 1, 2] > 0 or c.counters.C[K["eth:rx_pcs_symbol_err_phy"], 1, 2] > 0


@pytest.mark.parametrize("layout", ["ib", "roce"])
def test_leaf_fault_touches_exactly_its_units_ports_on_that_rail(layout):
    base = Scenario(ClusterSpec(48, layout, 16, seed=2), 60)
    clean = run(base, 12)
    faulty = run(base.with_fault("leaf_degraded", unit=1, rail=5, start=2, end=10), 12)
    touched = {(n, d) for _, n, d in moved(clean, faulty, ["pma:symbol_error", "pma:port_xmit_wait"])}
    assert touched == {(n, 5) for n in range(16, 32)}


def test_ecn_congestion_on_a_roce_leaf_marks_its_ports_only():
    base = Scenario(ClusterSpec(32, "roce", 16, seed=2), 60)
    clean = run(base, 8)
    faulty = run(base.with_fault("ecn_congestion", unit=0, rail=1, start=2), 8)
    touched = {(n, d) for _, n, d in moved(clean, faulty, ["hw:np_cnp_sent", "hw:np_ecn_marked_roce_packets"])}
    assert touched == {(n, 1) for n in range(16)}
    assert not moved(clean, faulty, ["hw:rp_cnp_ignored"])  # congestion control stays on


def test_slow_gpu_leaves_fabric_counters_clean():
    base = Scenario(ClusterSpec(8, "roce", 8, seed=4), 60)
    clean = run(base, 10)
    faulty = run(base.with_fault("slow_gpu", node="node-003", gpu=2, start=2), 10)
    assert np.array_equal(clean.counters.C, faulty.counters.C)  # every NIC counter, errors and traffic alike
    assert np.array_equal(clean.gpus.nvl, faulty.gpus.nvl)
    assert faulty.gpus.throttle[3, 2] == 0x60 and int(faulty.gpus.throttle.sum()) == 0x60
    assert (faulty.gpus.util >= 88).all()
    eff = faulty.effects()
    assert eff.gpu_slow[3, 2] == 1.5 and (eff.nic_bw == 1).all()


def test_link_down_and_recovery():
    scn = Scenario(ClusterSpec(4, "ib", 4, seed=1), 60).with_fault("link_down", node="node-002", rail=6, start=3, end=6)
    c = ClusterState(scn)
    downed0 = int(c.counters.C[K["pma:link_downed"], 2, 6])
    states, data = [], []
    for _ in range(8):
        c.advance(1.0)
        states.append(bool(c.links.up[2, 6]))
        data.append(int(c.counters.C[K["pma:port_xmit_data"], 2, 6]))
    assert states == [True, True, False, False, False, True, True, True]
    assert data[2] == data[3] == data[4]  # no traffic while down
    assert int(c.counters.C[K["pma:link_downed"], 2, 6]) == downed0 + 1
    assert c.links.up.sum() == 4 * NDEV


def test_link_flap_alternates_and_counts_each_down():
    scn = Scenario(ClusterSpec(2, "roce", 2), 60).with_fault("link_flap", node="node-001", rail=0, start=2, end=14,
                                                          period=4)
    c = ClusterState(scn)
    downed0 = int(c.counters.C[K["pma:link_downed"], 1, 0])
    states = []
    for _ in range(16):
        c.advance(1.0)
        states.append(bool(c.links.up[1, 0]))
    assert states[:6] == [True, False, False, True, True, False]
    downs = sum(1 for a, b in pairwise([True, *states]) if a and not b)
    assert int(c.counters.C[K["pma:link_downed"], 1, 0]) - downed0 == downs == 3
    assert int(c.counters.C[K["eth:link_down_events_phy"], 1, 0]) >= downs


def test_link_degraded_halves_width_and_caps_traffic():
    scn = Scenario(ClusterSpec(2, "ib", 2), 60).with_fault("link_degraded", node="node-000", rail=1, start=1)
    c = ClusterState(scn)
    c.advance(1.0)
    assert c.links.rate_text(0, 1) == "200 Gb/sec (2X NDR)" and c.links.rate_text(0, 2) == "400 Gb/sec (4X NDR)"
    before = int(c.counters.C[K["pma:port_xmit_data"], 0, 1])
    c.advance(1.0, rail_bytes_per_second=np.full((2, 8), 45e9))  # more than 200 Gb/s offered
    assert (int(c.counters.C[K["pma:port_xmit_data"], 0, 1]) - before) * 4 <= 200e9 / 8 * 0.97 + 1
    assert c.effects().nic_bw[0, 1] == 0.5


def _tree_files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def test_config_drift_changes_exactly_that_nics_pfc_and_ecn_files(tmp_path):
    base = Scenario(ClusterSpec(2, "roce", 2, seed=3), 60)
    a, b = ClusterState(base), ClusterState(base.with_fault("config_drift", node="node-001", rail=4, start=1, end=3))
    ta, tb = NodeTree(a, 1, tmp_path / "a"), NodeTree(b, 1, tmp_path / "b")
    for c in (a, b):
        c.advance(1.0)
    ta.render()
    tb.render()
    fa, fb = _tree_files(ta.root), _tree_files(tb.root)
    assert fa.keys() == fb.keys()
    changed = {k for k in fa if fa[k] != fb[k]}
    nd = f"sys/devices/{pci_device_path('0000:9a:00.0')}/net/enp154s0np0"
    assert changed == {"ethtool/enp154s0np0.pfc.txt", f"{nd}/ecn/roce_np/enable/3", f"{nd}/ecn/roce_rp/enable/3"}
    assert b"enabled     0   0   0   0   0   0   0   0" in fb["ethtool/enp154s0np0.pfc.txt"]
    # after the end the profile is restored
    for _ in range(3):
        b.advance(1.0)
    tb.render()
    assert b"enabled     0   0   0   1   0   0   0   0" in _tree_files(tb.root)["ethtool/enp154s0np0.pfc.txt"]


def test_config_drift_without_rail_drifts_every_rail_nic_not_the_frontend():
    scn = Scenario(ClusterSpec(2, "roce", 2), 60).with_fault("config_drift", node="node-000", start=0)
    c = ClusterState(scn)
    c.advance(1.0)
    assert not c.links.pfc[0, :8, 3].any() and c.links.pfc[0, 8, 3] and c.links.pfc[1, :, 3].all()


def test_pfc_storm_slow_receiver_emits_pauses():
    scn = Scenario(ClusterSpec(2, "roce", 2), 60).with_fault("pfc_storm", node="node-001", rail=2, start=1)
    c = ClusterState(scn)
    dur0 = int(c.counters.C[K["eth:tx_prio3_pause_duration"], 1, 2])
    rx0 = int(c.counters.C[K["eth:rx_prio3_pause_duration"], 1, 2])
    other0 = int(c.counters.C[K["eth:tx_prio3_pause_duration"], 0, 2])
    for _ in range(10):
        c.advance(1.0)
    paused = (int(c.counters.C[K["eth:tx_prio3_pause_duration"], 1, 2]) - dur0) / 1e6  # seconds of 10
    assert 8.0 < paused < 9.0  # ~85% of each interval
    assert int(c.counters.C[K["eth:rx_prio3_pause_duration"], 1, 2]) - rx0 < 1000  # receives only background pauses
    assert c.counters.C[K["eth:tx_pause_storm_warning_events"], 1, 2] > 0
    assert int(c.counters.C[K["eth:outbound_pci_stalled_wr"], 1, 2]) >= 60
    assert int(c.counters.C[K["eth:tx_prio3_pause_duration"], 0, 2]) - other0 < 1000  # its partner: background only


def test_counter_reset_restarts_every_mlx5_counter_of_the_node_only():
    scn = Scenario(ClusterSpec(3, "roce", 3, seed=9), 60).with_fault("counter_reset", node="node-001", start=3)
    c = ClusterState(scn)
    c.advance(1.0)
    before = c.counters.C.copy()
    for _ in range(3):
        c.advance(1.0)
    data = K["pma:port_xmit_data"]
    assert (c.counters.C[data, 1, :] < before[data, 1, :]).all()
    C = c.counters.C
    assert (C[data, 0, :] > before[data, 0, :]).all() and (C[data, 2, :] > before[data, 2, :]).all()
    assert c.links.up.all()
