"""Switch-side evidence at the aggregator: uplinks as components with the link detectors and no ``node``
label, the leaf end of a host cable as evidence on that host's link (also for a host whose agent does not
run), and switch-side series accepted only from ``auth.switch_sources``.  The topology is imported from
real ibnetdiscover output against ibsim (tests/fixtures/ib_switches/README.md): leaves leaf-00/01 with
hosts on ports 1-2, uplink k on port 3+k to spine-0k."""

from __future__ import annotations

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.batch import NodeBatch
from fabricmon.cli import main
from fabricmon.model import CounterDelta, Sample
from fabricmon.topology import load_topology
from support.paths import FIXTURES

SWEEPER = "node-000"  # the tools attach to the first host's HCA: it sweeps
CABLES = {("leaf-00", 1): ("node-000", 1, "host"), ("leaf-00", 2): ("node-001", 1, "host"),
          ("leaf-00", 3): ("spine-00", 1, "switch"), ("leaf-00", 4): ("spine-01", 1, "switch"),
          ("leaf-01", 1): ("node-002", 1, "host"), ("leaf-01", 2): ("node-003", 1, "host"),
          ("leaf-01", 3): ("spine-00", 2, "switch"), ("leaf-01", 4): ("spine-01", 2, "switch"),
          ("spine-00", 1): ("leaf-00", 3, "switch"), ("spine-00", 2): ("leaf-01", 3, "switch"),
          ("spine-01", 1): ("leaf-00", 4, "switch"), ("spine-01", 2): ("leaf-01", 4, "switch")}


def _engine(tmp_path) -> Engine:
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(FIXTURES / "ib_switches" / "ibnetdiscover-cache.out"),
                 "-o", str(out)]) == 0
    engine = Engine(load_topology(out), DetectionSettings())
    engine.switch_side.sources = frozenset({SWEEPER})
    return engine


def _first(node: str, ts: float) -> NodeBatch:
    gauges = [Sample("fabricmon_switch_sweep_seconds", (), 0.1)]
    for (sw, port), (peer, pport, ptype) in CABLES.items():
        gauges.append(Sample("fabricmon_switch_port_info", (
            ("switch", sw), ("switch_guid", "0x0"), ("port", str(port)), ("peer", peer), ("peer_port", str(pport)),
            ("peer_type", ptype)), 1.0))
        gauges.append(Sample("fabricmon_switch_port_up", (("switch", sw), ("port", str(port))), 1.0))
    return NodeBatch(node, 1, ts, 1.0, gauges=tuple(gauges))


def _sweep(node: str, seq: int, ts: float, errors: dict[tuple[str, int], float], down=()) -> NodeBatch:
    deltas = tuple(CounterDelta("fabricmon_switch_port_errors_total",
                                (("switch", sw), ("port", str(p)), ("counter", "symbol_error")), v)
                   for (sw, p), v in errors.items())
    gauges = [Sample("fabricmon_switch_sweep_seconds", (), 0.1 + seq / 1000)]
    gauges += [Sample("fabricmon_switch_port_up", (("switch", sw), ("port", str(p))), 0.0) for sw, p in down]
    return NodeBatch(node, seq, ts, 1.0, deltas=deltas, gauges=tuple(gauges))


def _run(engine: Engine, node: str, sweeps: list[tuple[dict, tuple]]) -> list:
    assert engine.ingest(_first(node, 100.0))
    engine.tick(100.0)
    for k, (errors, down) in enumerate(sweeps, 1):
        assert engine.ingest(_sweep(node, k + 1, 100.0 + k, errors, down))
        engine.tick(100.0 + k)
    return engine.open_incidents()


def test_symbol_errors_on_a_leaf_uplink_are_an_uplink_incident_without_node(tmp_path):
    engine = _engine(tmp_path)
    incs = _run(engine, SWEEPER, [({("leaf-00", 3): 200.0}, ())] * 3)
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLinkErrors", "uplink", "leaf-00/p3")]
    lab = incs[0].labels
    assert (lab["leaf"], lab["spine"], lab["spine_port"]) == ("leaf-00", "spine-00", "1")
    assert "node" not in lab


def test_errors_counted_at_the_spine_end_are_the_same_uplink(tmp_path):
    engine = _engine(tmp_path)
    incs = _run(engine, SWEEPER, [({("spine-01", 2): 200.0}, ())] * 3)
    assert [(i.component_type, i.component) for i in incs] == [("uplink", "leaf-01/p4")]


def test_a_pulled_uplink_is_link_down_on_that_uplink_within_two_sweeps(tmp_path):
    engine = _engine(tmp_path)
    incs = _run(engine, SWEEPER, [({}, ()), ({}, (("leaf-00", 4), ("spine-01", 1)))])
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLinkDown", "uplink", "leaf-00/p4")]
    assert "node" not in incs[0].labels


def test_leaf_end_errors_of_a_host_without_agent_are_that_host_links_incident(tmp_path):
    engine = _engine(tmp_path)
    incs = _run(engine, SWEEPER, [({("leaf-00", 2): 200.0}, ())] * 3)
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLinkErrors", "link", "node-001/mlx5_0/1")]
    assert not engine.nodes["node-001"].ever_seen  # no agent: the evidence came from the switch end alone


def test_switch_series_from_a_node_not_listed_are_ignored_and_counted(tmp_path):
    engine = _engine(tmp_path)
    incs = _run(engine, "node-002", [({("leaf-00", 3): 200.0}, (("leaf-00", 4), ("spine-01", 1)))] * 3)
    assert incs == []
    assert engine.switch_side.refused_batches == 4
    assert engine.views.metrics_snapshot()["switch_side"]["refused_batches"] == 4
    from fabricmon.aggregator.http_api import AggregatorCollector

    exported = {s.name: s.value for fam in AggregatorCollector(engine).collect() for s in fam.samples}
    assert exported["fabricmon_switch_series_refused_batches_total"] == 4
    assert exported["fabricmon_switch_uplinks"] == 0


def test_transmit_wait_on_a_switch_port_is_congestion_on_its_uplink(tmp_path):
    engine = _engine(tmp_path)
    assert engine.ingest(_first(SWEEPER, 100.0))
    engine.tick(100.0)
    for k in range(1, 6):
        wait = CounterDelta("fabricmon_switch_port_transmit_wait_total", (("switch", "spine-00"), ("port", "2")),
                            5e8)
        assert engine.ingest(NodeBatch(SWEEPER, k + 1, 100.0 + k, 1.0, deltas=(wait,),
                                       gauges=(Sample("fabricmon_switch_sweep_seconds", (), 0.1 + k / 1000),)))
        engine.tick(100.0 + k)
    incs = engine.open_incidents()
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricCongestion", "uplink", "leaf-01/p3")]
    assert "node" not in incs[0].labels


def test_one_spines_uplinks_to_several_leaves_bad_together_are_the_spines_fault(tmp_path):
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(FIXTURES / "ib_switches" / "ibnetdiscover-cache.out"),
                 "-o", str(out)]) == 0
    engine = Engine(load_topology(out), DetectionSettings(leaf_fold_min_links=2))  # two leaves in this fabric
    engine.switch_side.sources = frozenset({SWEEPER})
    incs = _run(engine, SWEEPER, [({("leaf-00", 3): 200.0, ("spine-00", 2): 200.0}, ())] * 3)
    spine = [i for i in incs if i.alertname == "FabricSpineDegraded"]
    assert [(i.component_type, i.component, i.severity) for i in spine] == [("spine", "spine-00", "critical")]
    assert spine[0].labels["spine"] == "spine-00" and "node" not in spine[0].labels
    others = {(i.alertname, i.component) for i in incs if i.alertname != "FabricSpineDegraded"}
    assert others <= {("FabricLinkErrors", "leaf-00/p3"), ("FabricLinkErrors", "leaf-01/p3")}
    # one bad uplink alone is not the spine's
    engine = _engine(tmp_path)
    assert not [i for i in _run(engine, SWEEPER, [({("leaf-00", 3): 200.0}, ())] * 3)
                if i.alertname == "FabricSpineDegraded"]
