"""Scenario files: loading, file:field errors, ground truth, default and random scenarios."""

from __future__ import annotations

import pytest

from fabricmon.configload import ConfigError
from fabricmon.sim.scenario import (
    KINDS,
    SWITCH_KINDS,
    ClusterSpec,
    Fault,
    Scenario,
    default_scenario,
    load_scenario,
    random_scenario,
)

DESIGN_EXAMPLE = """\
cluster: {nodes: 64, layout: ib, nodes_per_unit: 16, seed: 7}
duration: 600          # simulated seconds
faults:
  - {kind: flaky_cable, node: node-017, rail: 3, start: 120, end: 300}
  - {kind: leaf_degraded, unit: 1, rail: 5, start: 200, end: 400}
  - {kind: slow_gpu, node: node-040, gpu: 2, start: 100, end: 500}
  - {kind: counter_reset, node: node-003, start: 250}
"""


def write(tmp_path, text, name="scn.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_design_example_loads_with_ground_truth(tmp_path):
    scn = load_scenario(write(tmp_path, DESIGN_EXAMPLE))
    assert scn.cluster == ClusterSpec(64, "ib", 16, 7)
    assert scn.duration == 600.0
    gt = [(g.component_type, g.component, g.alertname, g.start, g.end) for g in scn.ground_truth()]
    assert gt == [
        ("link", "node-017/mlx5_3/1", "FabricLinkErrors", 120, 300),
        ("leaf", "leaf-u1-r5", "FabricLeafDegraded", 200, 400),
        ("gpu", "node-040/gpu2", "StragglerRank", 100, 500),
        (None, None, None, 250, None),
    ]
    assert scn.ground_truth()[0].leaf == "leaf-u1-r3"


@pytest.mark.parametrize("fault, message", [
    ("{kind: flaky_cable, node: node-999, rail: 3, start: 1}",
     "scn.yaml: faults[1].node: node-999 is not in a 64-node cluster"),
    ("{kind: flaky_cabel, node: node-001, rail: 3, start: 1}", "scn.yaml: faults[1].kind: unknown fault kind"),
    ("{kind: flaky_cable, node: node-001, start: 1}", "scn.yaml: faults[1].rail: required for flaky_cable"),
    ("{kind: flaky_cable, node: node-001, rail: 9, start: 1}", "scn.yaml: faults[1].rail: rails are 0..7"),
    ("{kind: flaky_cable, node: node-001, rail: 3, gpu: 1, start: 1}",
     "scn.yaml: faults[1].gpu: does not apply to flaky_cable"),
    ("{kind: flaky_cable, node: node-001, rail: 3, start: 10, end: 5}", "scn.yaml: faults[1].end: must be after"),
    ("{kind: leaf_degraded, unit: 4, rail: 3, start: 1}", "scn.yaml: faults[1].unit: unit 4 is not in"),
    ("{kind: nvlink_errors, node: node-001, gpu: 2, link: 18, start: 1}", "scn.yaml: faults[1].link: NVLinks"),
    ("{kind: config_drift, node: node-001, rail: 2, start: 1}",
     "scn.yaml: faults[1].kind: config_drift needs layout roce"),
    ("{kind: counter_reset, node: node-001, start: 1, end: 5}", "scn.yaml: faults[1].end: does not apply"),
    ("{kind: slow_gpu, node: node-001, gpu: 1, start: 700}", "scn.yaml: faults[1].start: 700.0 is not before"),
    ("{kind: flaky_cable, node: node-001, rail: 3, start: 1, colour: red}", "scn.yaml: faults[1].colour: unknown key"),
    ("{kind: slow_gpu, node: node-001, gpu: 1, start: soon}", "scn.yaml: faults[1].start: expected a number"),
])
def test_errors_name_file_and_field(tmp_path, fault, message):
    text = DESIGN_EXAMPLE.split("faults:")[0] + "faults:\n  - {kind: slow_gpu, node: node-040, gpu: 2, start: 1}\n" \
        + f"  - {fault}\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_scenario(path)
    # the message names the file as given, then the key path
    assert str(ei.value).startswith(message.replace("scn.yaml", str(path), 1)), str(ei.value)


def test_cluster_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"scn.yaml: cluster.layout: must be ib or roce"):
        load_scenario(write(tmp_path, "cluster: {nodes: 4, layout: eth}\nduration: 10\n"))
    with pytest.raises(ConfigError, match=r"scn.yaml: duration: must be > 0"):
        load_scenario(write(tmp_path, "cluster: {nodes: 4}\nduration: 0\n"))
    with pytest.raises(ConfigError, match=r"scn.yaml: line 2: invalid YAML"):
        load_scenario(write(tmp_path, "cluster: {nodes: 4\n"))


def test_node_names_follow_cluster_size(tmp_path):
    text = "cluster: {nodes: 4096}\nduration: 60\nfaults:\n  - {kind: link_down, node: node-017, rail: 1, start: 1}\n"
    with pytest.raises(ConfigError,
                       match=r"node-017 is not in a 4096-node cluster \(nodes are node-0000\.\.node-4095\)"):
        load_scenario(write(tmp_path, text))
    scn = load_scenario(write(tmp_path, text.replace("node-017", "node-0017")))
    assert scn.ground_truth()[0].component == "node-0017/mlx5_1/1"
    assert scn.ground_truth()[0].alertname == "FabricLinkDown"


def test_ground_truth_of_every_kind():
    scn = Scenario(ClusterSpec(32, "roce", 16), 100)
    want = {
        "flaky_cable": ({"node": "node-017", "rail": 3}, "link", "node-017/mlx5_3/1", "FabricLinkErrors"),
        "link_down": ({"node": "node-017", "rail": 3}, "link", "node-017/mlx5_3/1", "FabricLinkDown"),
        "link_flap": ({"node": "node-017", "rail": 3}, "link", "node-017/mlx5_3/1", "FabricLinkFlapping"),
        "link_degraded": ({"node": "node-017", "rail": 3}, "link", "node-017/mlx5_3/1", "FabricLinkDegraded"),
        "pfc_storm": ({"node": "node-017", "rail": 4}, "link", "node-017/mlx5_4/1", "FabricPFCStorm"),
        "rdma_retransmits": ({"node": "node-017", "rail": 0}, "link", "node-017/mlx5_0/1", "RDMARetransmits"),
        "leaf_degraded": ({"unit": 1, "rail": 5}, "leaf", "leaf-u1-r5", "FabricLeafDegraded"),
        "ecn_congestion": ({"unit": 0, "rail": 2}, "leaf", "leaf-u0-r2", "FabricCongestion"),
        "nvlink_errors": ({"node": "node-017", "gpu": 2, "link": 5}, "nvlink", "node-017/gpu2/nvlink5", "NVLinkErrors"),
        "nvlink_down": ({"node": "node-017", "gpu": 2, "link": 5}, "nvlink", "node-017/gpu2/nvlink5", "NVLinkDown"),
        "slow_gpu": ({"node": "node-017", "gpu": 6}, "gpu", "node-017/gpu6", "StragglerRank"),
        "config_drift": ({"node": "node-017", "rail": 3}, "config", "node-017/mlx5_3", "FabricConfigDrift"),
        "counter_reset": ({"node": "node-017"}, None, None, None),
        "cable_degrading": ({"node": "node-017", "rail": 3, "fails_at": 50}, "link", "node-017/mlx5_3/1",
                            "FabricCableDegrading"),
        "rank_hang": ({"node": "node-017", "gpu": 5}, "gpu", "node-017/gpu5", "JobHung"),
    }
    assert set(want) == set(KINDS) - set(SWITCH_KINDS)  # those need spines: tests/sim/test_sim_switches.py
    for kind, (kw, ctype, comp, alert) in want.items():
        g = scn.with_fault(kind, start=10, **kw).ground_truth()[-1]
        assert (g.component_type, g.component, g.alertname) == (ctype, comp, alert), kind
    whole = scn.with_fault("config_drift", node="node-017", start=1).ground_truth()[-1]
    assert (whole.component_type, whole.component) == ("config", "node-017")
    ib = Scenario(ClusterSpec(32, "ib", 16), 100).with_fault("pfc_storm", node="node-017", start=1)
    assert ib.ground_truth()[-1].component == "node-017/mlx5_8/1"  # the frontend: the only Ethernet NIC on ib


def test_api_validates_like_a_file():
    scn = Scenario(ClusterSpec(8), 60)
    with pytest.raises(ConfigError, match=r"<api>: faults\[0\].node: node-008 is not in a 8-node cluster"):
        scn.with_fault("slow_gpu", node="node-008", gpu=1, start=1)
    with pytest.raises(ConfigError, match=r"faults\[0\].gpu: required for slow_gpu"):
        scn.with_fault("slow_gpu", node="node-001", start=1)
    s2 = scn.with_fault("slow_gpu", node="node-001", gpu=1, start=1)
    assert scn.faults == () and len(s2.faults) == 1  # frozen: a copy


@pytest.mark.parametrize("nodes, duration", [(64, 600), (8, 100), (4096, 1800)])
def test_default_scenario_matches_design(nodes, duration):
    scn = default_scenario(nodes, duration)
    flaky, leaf = scn.faults
    assert (flaky.kind, flaky.rail, flaky.start, flaky.end) == ("flaky_cable", 3, 0.25 * duration, 0.60 * duration)
    assert (leaf.kind, leaf.start, leaf.end) == ("leaf_degraded", 0.45 * duration, 0.80 * duration)
    assert not scn.active_faults(0.2 * duration) and not scn.active_faults(0.85 * duration)
    if scn.cluster.units >= 2:
        assert leaf.unit != scn.unit_of(flaky.node)
    scn.validate("", "x")


def test_random_scenarios_are_valid_and_varied():
    kinds, counts = set(), set()
    for seed in range(200):
        scn = random_scenario(seed, nodes=48, duration=300)
        assert scn == random_scenario(seed, nodes=48, duration=300)  # reproducible
        counts.add(len(scn.faults))
        for f, g in zip(scn.faults, scn.ground_truth(), strict=True):
            kinds.add(f.kind)
            assert 0 <= f.start < 300
            assert g.kind == f.kind
            assert (g.component is None) == (f.kind == "counter_reset")
    assert counts == {0, 1, 2}
    # benchmarks/bench_cable_lead.py draws cable_degrading, bench_detection's workload scenarios rank_hang
    assert kinds == set(KINDS) - {"cable_degrading", "rank_hang"} - set(SWITCH_KINDS)


def test_round_trip_to_dict(tmp_path):
    import yaml

    scn = load_scenario(write(tmp_path, DESIGN_EXAMPLE))
    again = load_scenario(write(tmp_path, yaml.safe_dump(scn.to_dict()), "again.yaml"))
    assert again == scn


def test_fault_activity_window():
    f = Fault("link_down", node="node-001", rail=1, start=10, end=20)
    assert [f.active(t) for t in (9.99, 10, 19.99, 20)] == [False, True, True, False]
