"""Ethernet switches over gNMI at the aggregator: the switch end of each RoCE cable (the topology's
``leaf_port``, a port name as the LLDP import writes it) as evidence on the host's link, a PFC storm
blamed on the end that emits pauses, and the host's RoCE priority compared with the switch port's PFC and
ECN settings (FabricConfigDrift check=pfc_mismatch / ecn_mismatch naming both ends)."""

from __future__ import annotations

import yaml

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.batch import NodeBatch
from fabricmon.model import CounterDelta, Sample
from fabricmon.topology import load_topology

SWITCH_AGENT = "gnmi-agent"


def _engine(tmp_path, **settings) -> Engine:
    doc = {"version": 2, "cluster": "roce-a", "layout": "roce", "rail_optimized": True,
           "leaves": {"leaf-01": {"spines": []}},
           "nodes": [{"name": "h1", "nics": [{"device": "mlx5_0", "interface": "ens3f0np0", "leaf": "leaf-01",
                                              "leaf_port": "Ethernet1/1", "rail": 0}]},
                     {"name": "h2", "nics": [{"device": "mlx5_0", "interface": "ens3f0np0", "leaf": "leaf-01",
                                              "leaf_port": "Ethernet1/2", "rail": 0}]},
                     {"name": SWITCH_AGENT, "nics": []}]}
    f = tmp_path / "topology.yaml"
    f.write_text(yaml.safe_dump(doc))
    engine = Engine(load_topology(f), DetectionSettings(**settings))
    engine.switch_side.sources = frozenset({SWITCH_AGENT})
    return engine


def _lossless(port: str, pfc_on: set[int], ecn_on: set[int]) -> list[Sample]:
    sp = (("switch", "leaf-01"), ("port", port))
    return [Sample("fabricmon_switch_port_pfc_enabled_priorities", sp, float(sum(1 << p for p in pfc_on))),
            Sample("fabricmon_switch_port_ecn_marking_queues", sp, float(sum(1 << q for q in ecn_on)))]


def _run(engine: Engine, batches: list[tuple[tuple[CounterDelta, ...], list[Sample]]], start: int = 0) -> list:
    for k, (deltas, gauges) in enumerate(batches, start):
        gauges = [Sample("fabricmon_switch_gnmi_sample_interval_seconds", (), 1.0), *gauges]
        assert engine.ingest(NodeBatch(SWITCH_AGENT, k + 1, 100.0 + k, 1.0, deltas=deltas, gauges=tuple(gauges)))
        engine.tick(100.0 + k)
    return engine.open_incidents()


def test_a_pfc_priority_missing_on_the_switch_port_is_pfc_mismatch_naming_both_ends(tmp_path):
    engine = _engine(tmp_path)
    first = _lossless("Ethernet1/1", {4}, {3, 4}) + _lossless("Ethernet1/2", {3, 4}, {3, 4})
    incs = _run(engine, [((), first)] + [((), [])] * 4)
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricConfigDrift", "config", "h1/mlx5_0@leaf-01/Ethernet1_1")]
    lab = incs[0].labels
    assert (lab["check"], lab["node"], lab["device"], lab["leaf"], lab["switch_port"], lab["rail"]) == (
        "pfc_mismatch", "h1", "mlx5_0", "leaf-01", "Ethernet1/1", "0")
    text = " ".join(incs[0].evidence)
    assert "host end h1/mlx5_0: RoCE priority 3" in text
    assert "switch end leaf-01 Ethernet1/1: PFC off on priority 3" in text
    assert "PFC on priority 4" in text
    # the operator enables priority 3 on the port: the finding resolves after its hold
    _run(engine, [((), _lossless("Ethernet1/1", {3, 4}, {3, 4}))] + [((), [])] * 15, start=5)
    assert not [i for i in engine.open_incidents() if i.alertname == "FabricConfigDrift"]


def test_ecn_off_on_the_roce_queue_is_ecn_mismatch(tmp_path):
    engine = _engine(tmp_path)
    first = _lossless("Ethernet1/1", {3, 4}, {3, 4}) + _lossless("Ethernet1/2", {3, 4}, {4})
    incs = _run(engine, [((), first)] + [((), [])] * 4)
    assert [(i.component, i.labels["check"]) for i in incs] == [("h2/mlx5_0@leaf-01/Ethernet1_2", "ecn_mismatch")]


def test_the_roce_priority_is_the_configured_one(tmp_path):
    engine = _engine(tmp_path, roce_priority=4)
    first = _lossless("Ethernet1/1", {4}, {3, 4}) + _lossless("Ethernet1/2", {4}, {4})
    assert _run(engine, [((), first)] + [((), [])] * 4) == []


def _errors(port: str, counter: str, v: float) -> CounterDelta:
    return CounterDelta("fabricmon_switch_port_errors_total",
                        (("switch", "leaf-01"), ("port", port), ("counter", counter)), v)


def test_interface_errors_at_the_switch_end_are_the_host_links_incident(tmp_path):
    engine = _engine(tmp_path)
    incs = _run(engine, [((), [])] + [((_errors("Ethernet1/2", "in_errors", 200.0),), [])] * 3)
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLinkErrors", "link", "h2/mlx5_0/1")]


def _pfc(port: str, direction: str, frames: float, priority: int = 3) -> CounterDelta:
    return CounterDelta("fabricmon_switch_pfc_frames_total", (
        ("switch", "leaf-01"), ("port", port), ("priority", str(priority)), ("direction", direction)), frames)


def test_pauses_the_switch_port_receives_are_a_storm_of_the_host_that_sends_them(tmp_path):
    engine = _engine(tmp_path)
    # the switch receives XOFF on priority 3 from h1 most of every second and sends none back: h1's NIC
    # emits pauses and receives none: the storm is h1's link, seen from the switch end only
    storm = (_pfc("Ethernet1/1", "rx", 20_000.0), _pfc("Ethernet1/1", "tx", 0.0),
             CounterDelta("fabricmon_switch_pfc_watchdog_storms_total",
                          (("switch", "leaf-01"), ("port", "Ethernet1/1"), ("priority", "3")), 1.0))
    incs = _run(engine, [((), [])] + [(storm, [])] * 3)
    assert [(i.alertname, i.component) for i in incs] == [("FabricPFCStorm", "h1/mlx5_0/1")]
    assert "emits PFC pause" in incs[0].evidence[0] and "priority 3" in incs[0].evidence[0]


def test_pauses_the_switch_port_sends_do_not_blame_the_host(tmp_path):
    engine = _engine(tmp_path)
    # the switch pauses h2 (congestion behind the switch): h2 receives pauses, it emits none
    incs = _run(engine, [((), [])] + [((_pfc("Ethernet1/2", "tx", 20_000.0),), [])] * 4)
    assert not [i for i in incs if i.alertname == "FabricPFCStorm"]


def test_drops_and_ecn_marks_on_a_switch_queue_are_congestion_on_the_cable(tmp_path):
    engine = _engine(tmp_path)
    drops = CounterDelta("fabricmon_switch_queue_dropped_packets_total",
                         (("switch", "leaf-01"), ("port", "Ethernet1/2"), ("queue", "3")), 200.0)
    incs = _run(engine, [((), [])] + [((drops,), [])] * 5)
    assert [(i.alertname, i.component) for i in incs] == [("FabricCongestion", "h2/mlx5_0/1")]


def test_errors_on_a_port_whose_lldp_neighbour_is_a_spine_are_an_uplink_incident(tmp_path):
    engine = _engine(tmp_path)
    info = Sample("fabricmon_switch_port_info", (("switch", "leaf-01"), ("switch_guid", ""), ("port", "Ethernet1/9"),
                                                 ("peer", "spine-01"), ("peer_port", "Ethernet3/1"),
                                                 ("peer_type", "unknown")), 1.0)
    incs = _run(engine, [((), [info])] + [((_errors("Ethernet1/9", "fcs", 200.0),), [])] * 3)
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLinkErrors", "uplink", "leaf-01/pEthernet1_9")]
    lab = incs[0].labels
    assert (lab["leaf"], lab["spine"], lab["spine_port"]) == ("leaf-01", "spine-01", "Ethernet3/1")
    assert "node" not in lab


def test_an_lldp_neighbour_that_is_a_host_without_leaf_port_is_not_an_uplink(tmp_path):
    engine = _engine(tmp_path)
    info = Sample("fabricmon_switch_port_info", (("switch", "leaf-01"), ("switch_guid", ""), ("port", "Ethernet1/8"),
                                                 ("peer", "h2"), ("peer_port", "ens3f1np1"), ("peer_type", "unknown")),
                  1.0)
    assert _run(engine, [((), [info])] + [((_errors("Ethernet1/8", "fcs", 200.0),), [])] * 3) == []
