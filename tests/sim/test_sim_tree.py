"""Rendered trees: the fixture writer's layout, incremental atomic rewrites, and parsed by the real agent."""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path

import pytest

from fabricmon.sim.agents import make_sim_agent
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.fixture import write_fixture
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree
from fabricmon.sources.infiniband import classify as ib_classify


def listing(root: Path) -> set[str]:
    out = set()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            # module EEPROM images are the simulator's (the fixture writer's snapshots have no modules)
            if not rel.startswith(".sim-tmp") and rel != "fixture.json" and not rel.endswith(".module.bin"):
                out.add(rel)
    return out


@pytest.mark.parametrize("layout", ["ib", "roce"])
def test_layout_and_formats_match_the_fixture_writer(tmp_path, layout):
    write_fixture(tmp_path / "fx", layout=layout)
    c = ClusterState(Scenario(ClusterSpec(4, layout, 4), 60))
    NodeTree(c, 0, tmp_path / "sim").render()
    fx, sim = tmp_path / "fx", tmp_path / "sim"
    assert listing(fx) == listing(sim)
    for rel in sorted(listing(fx)):
        a, b = fx / rel, sim / rel
        assert a.is_symlink() == b.is_symlink(), rel
        if a.is_symlink():
            assert os.readlink(a) == os.readlink(b), rel
        elif a.is_file():
            ta, tb = a.read_text(), b.read_text()
            assert ta.endswith("\n") and tb.endswith("\n"), rel
            if ta.strip().isdigit():
                assert tb.strip().isdigit(), rel  # same kind of value
            elif rel.endswith(("rate", "state", "phys_state", "link_layer", "pfc.txt", "mtu", "speed",
                               "hca_type", "fw_ver", "numa_node", "node_type", "cap_mask", "operstate")):
                assert ta == tb, rel
    ethtool = [r for r in listing(fx) if r.startswith("ethtool/") and r.endswith(".txt") and "pfc" not in r]
    # Where the shared fixture tool still writes what real inbox drivers do not (rx_bits_phy) or an
    # old name (dev_out_of_buffer), the simulator follows the driver (tests/fixtures/realformat/README.md).
    real = {"rx_bits_phy": None, "dev_out_of_buffer": "dev_internal_queue_oob"}
    for rel in ethtool:
        def names(p: Path, rel: str = rel) -> list[str]:
            return [ln.split(":")[0].strip() for ln in (p / rel).read_text().splitlines()]

        assert [real.get(n, n) for n in names(fx) if real.get(n, n)] == names(sim)


def test_only_changed_files_are_rewritten_atomically(tmp_path):
    c = ClusterState(Scenario(ClusterSpec(2, "roce", 2), 60))
    tree = NodeTree(c, 1, tmp_path / "n")
    first = tree.render()
    assert first > 500
    assert tree.render() == 0  # nothing changed: nothing written
    state = tmp_path / "n/sys/class/infiniband/mlx5_2/ports/1/state"
    ino = os.stat(state).st_ino
    data = tmp_path / "n/sys/class/infiniband/mlx5_2/ports/1/counters/port_xmit_data"
    before = data.read_text()
    c.advance(1.0)
    n = tree.render()
    assert 0 < n < first // 2
    assert data.read_text() != before
    assert os.stat(state).st_ino == ino  # unchanged file: not rewritten
    assert os.listdir(tmp_path / "n/.sim-tmp") == []  # no temporary left behind
    assert not [f for f in os.listdir(data.parent) if f.startswith(".")]


def test_rendered_tree_parses_with_real_sources_to_the_state(tmp_path):
    scn = Scenario(ClusterSpec(4, "roce", 4, seed=11), 60) \
        .with_fault("flaky_cable", node="node-002", rail=3, start=0) \
        .with_fault("nvlink_errors", node="node-002", gpu=1, link=4, start=0) \
        .with_fault("config_drift", node="node-002", rail=5, start=0) \
        .with_fault("link_down", node="node-002", rail=6, start=0)
    c = ClusterState(scn)
    c.advance(1.0)
    tree = NodeTree(c, 2, tmp_path / "node-002")
    tree.render()
    agent = make_sim_agent(tree, c.ts)
    try:
        snap = agent.poller.poll_once()
    finally:
        agent.stop()
    assert snap.node == "node-002" and snap.ts == c.ts()
    assert all(s.up and s.errors_total == 0 for s in snap.sources), snap.sources
    v = {(s.family, s.labels): s.value for s in snap.samples}
    dp = (("device", "mlx5_3"), ("port", "1"))
    raw = c.counters.raw
    assert v[("fabricmon_ib_port_errors_total", dp + (("counter", "symbol_error"),))] == raw("pma:symbol_error", 2, 3)
    # a float sample: above 2**53 bytes it is exact only to its 53-bit mantissa
    assert v[("fabricmon_ib_port_transmit_bytes_total", dp)] == pytest.approx(4 * raw("pma:port_xmit_data", 2, 3),
                                                                              rel=2 ** -52)
    hw_family = ib_classify("hw_counters", "out_of_sequence").families[0][0]  # the every-hw_counters family
    assert v[(hw_family, dp + (("counter", "out_of_sequence"),))] == \
        c.counters.raw("hw:out_of_sequence", 2, 3)
    assert v[("fabricmon_pfc_pause_seconds_total", (("interface", "enp94s0np0"), ("priority", "3"),
                                                    ("direction", "tx")))] == \
        pytest.approx(c.counters.raw("eth:tx_prio3_pause_duration", 2, 3) * 1e-6)
    assert v[("fabricmon_nvlink_errors_total", (("gpu", "1"), ("link", "4"), ("type", "replay")))] == \
        int(c.gpus.nvl[2, 2, 1, 4]) > 0
    assert v[("fabricmon_nvlink_transmit_bytes_total", (("gpu", "0"), ("link", "0")))] == \
        1024 * int(c.gpus.nvl[0, 2, 0, 0])
    assert v[("fabricmon_ib_port_state", (("device", "mlx5_6"), ("port", "1")))] == 1
    assert v[("fabricmon_ib_port_state", (("device", "mlx5_5"), ("port", "1")))] == 4
    cfg = {s.labels[2][1]: s.value for s in snap.samples
           if s.family == "fabricmon_fabric_config_ok" and s.labels[0] == ("device", "mlx5_5")}
    assert cfg == {"pfc": 0, "trust": 1, "ecn_np": 0, "ecn_rp": 0, "mtu": 1, "rate": 1}  # RoCE: no width check
    ok4 = {s.labels[2][1] for s in snap.samples if s.family == "fabricmon_fabric_config_ok"
           and s.labels[0] == ("device", "mlx5_4") and s.value == 1}
    assert ok4 == {"pfc", "trust", "ecn_np", "ecn_rp", "mtu", "rate"}


def test_counter_reset_decreases_counters_but_agent_totals_stay_monotonic(tmp_path):
    scn = Scenario(ClusterSpec(2, "roce", 2, seed=6), 60).with_fault("counter_reset", node="node-001", start=3)
    c = ClusterState(scn)
    tree = NodeTree(c, 1, tmp_path / "node-001")
    tree.render()
    agent = make_sim_agent(tree, c.ts)
    raw_before = c.counters.raw("pma:port_xmit_data", 1, 0)
    totals: list[dict] = []
    resets = 0
    try:
        for _ in range(6):
            snap = agent.poller.poll_once()
            totals.append({(s.family, s.labels): s.value for s in snap.samples if s.family.endswith("_total")})
            resets += sum(1 for d in snap.deltas if d.reset)
            assert all(d.delta >= 0 for d in snap.deltas)
            c.advance(1.0)
            tree.render()
    finally:
        agent.stop()
    assert c.counters.raw("pma:port_xmit_data", 1, 0) < raw_before  # the hardware counter went backwards ...
    for a, b in pairwise(totals):
        for key, value in a.items():
            if key in b:
                assert b[key] >= value, key  # ... the exported totals never do
    assert resets > 100  # recognised as a reset of every counter group, not as a wrap
