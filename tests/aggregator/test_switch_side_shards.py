"""Sharded switch side through two shard engines (A: unit 0 = leaf-00, B: unit 1 = leaf-01 of the topology
imported from real ibnetdiscover output against ibsim: tests/fixtures/ib_switches/README.md), both fed the
sweeper's same batches as its fan-out stream gives them (agent/sweep_fanout.py): each keeps only the
switch ports of its own leaves and hosts, and FabricSpineDegraded is decided from the shards' summaries:
A reads B's open uplink alerts as Alertmanager holds them (the JSON B's AlertmanagerClient posts, through
``parse_active``, what remote_evidence.AlertmanagerEvidence does with ``GET /api/v2/alerts``)."""

from __future__ import annotations

import json

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.remote_evidence import parse_active
from fabricmon.batch import NodeBatch
from fabricmon.cli import main
from fabricmon.model import CounterDelta, Sample
from fabricmon.topology import load_topology
from support.paths import FIXTURES

SWEEPER = "sweeper-0"
CABLES = {("leaf-00", 1): ("node-000", 1, "host"), ("leaf-00", 2): ("node-001", 1, "host"),
          ("leaf-00", 3): ("spine-00", 1, "switch"), ("leaf-00", 4): ("spine-01", 1, "switch"),
          ("leaf-01", 1): ("node-002", 1, "host"), ("leaf-01", 2): ("node-003", 1, "host"),
          ("leaf-01", 3): ("spine-00", 2, "switch"), ("leaf-01", 4): ("spine-01", 2, "switch"),
          ("spine-00", 1): ("leaf-00", 3, "switch"), ("spine-00", 2): ("leaf-01", 3, "switch"),
          ("spine-01", 1): ("leaf-00", 4, "switch"), ("spine-01", 2): ("leaf-01", 4, "switch")}


class Remote:
    """A's view of the other shard's open alerts (a RemoteSource)."""

    def __init__(self, sender: AlertmanagerClient, other: Engine, topo, own: frozenset[int]) -> None:
        self.sender, self.other, self.topo, self.own = sender, other, topo, own

    def incidents(self):
        body = json.loads(json.dumps([self.sender.payload(self.sender._snapshot(i))
                                      for i in self.other.open_incidents()]))
        incs, bad = parse_active(body, cluster="c1", topo=self.topo, own_units=self.own)
        assert bad == 0
        return tuple(incs)

    def snapshot(self):
        return {}


def _shards(tmp_path):
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(FIXTURES / "ib_switches" / "ibnetdiscover-cache.out"),
                 "-o", str(out)]) == 0
    topo = load_topology(out)
    s = DetectionSettings(leaf_fold_min_links=2)  # two leaves in this fabric
    a = Engine(topo, s, cluster="c1", shard_units=(0,))
    b = Engine(topo, s, cluster="c1", shard_units=(1,))
    for e in (a, b):
        e.switch_side.sources = frozenset({SWEEPER})
    return topo, a, b


def _feed(engines, errors: dict[tuple[str, int], float], sweeps: int = 3, start: int = 0) -> None:
    """The map and ``sweeps`` sweeps, from sample time 100 + ``start`` (sequence numbers from there)."""
    gauges = [Sample("fabricmon_switch_sweep_seconds", (), 0.1)]
    for (sw, port), (peer, pport, ptype) in CABLES.items():
        gauges.append(Sample("fabricmon_switch_port_info", (
            ("switch", sw), ("switch_guid", "0x0"), ("port", str(port)), ("peer", peer),
            ("peer_port", str(pport)), ("peer_type", ptype)), 1.0))
        gauges.append(Sample("fabricmon_switch_port_up", (("switch", sw), ("port", str(port))), 1.0))
    for e in engines:  # the same batch to every shard: the sweeper's fan-out
        assert e.ingest(NodeBatch(SWEEPER, start + 1, 100.0 + start, 1.0, gauges=tuple(gauges)))
        e.tick(100.0 + start)
    for k in range(1, sweeps + 1):
        deltas = tuple(CounterDelta("fabricmon_switch_port_errors_total",
                                    (("switch", sw), ("port", str(p)), ("counter", "symbol_error")), v)
                       for (sw, p), v in errors.items())
        for e in engines:
            assert e.ingest(NodeBatch(SWEEPER, start + k + 1, 100.0 + start + k, 1.0, deltas=deltas,
                                      gauges=(Sample("fabricmon_switch_sweep_seconds", (), 0.1 + k / 1000),)))
            e.tick(100.0 + start + k)


def _open(e: Engine) -> set[tuple[str, str]]:
    return {(i.alertname, i.component) for i in e.open_incidents()}


def test_each_shard_keeps_the_switch_ports_of_the_leaves_and_hosts_it_owns(tmp_path):
    _, a, b = _shards(tmp_path)
    # errors on both leaves' uplinks to spine-01 (counted at the spine end for leaf-01) and both host cables
    _feed((a, b), {("leaf-00", 4): 200.0, ("spine-01", 2): 200.0, ("leaf-00", 2): 200.0, ("leaf-01", 1): 200.0})
    assert _open(a) == {("FabricLinkErrors", "leaf-00/p4"), ("FabricLinkErrors", "node-001/mlx5_0/1")}
    assert _open(b) == {("FabricLinkErrors", "leaf-01/p4"), ("FabricLinkErrors", "node-002/mlx5_0/1")}
    # A leaves B's leaf-01 ports and the spine ends of leaf-01's uplinks to B, and the other way round
    assert a.switch_side.stats()["ports_elsewhere"] == b.switch_side.stats()["ports_elsewhere"] == 6
    from fabricmon.aggregator.http_api import AggregatorCollector

    exported = {s.name: s.value for fam in AggregatorCollector(a).collect() for s in fam.samples}
    assert exported["fabricmon_switch_ports_elsewhere"] == 6


def test_spine_degraded_is_decided_from_the_shards_summaries(tmp_path):
    topo, a, b = _shards(tmp_path)
    sender_b = AlertmanagerClient(["http://127.0.0.1:9/"], cluster="c1", shard="units 1")
    sender_a = AlertmanagerClient(["http://127.0.0.1:9/"], cluster="c1", shard="units 0")
    a.remote = Remote(sender_b, b, topo, frozenset({0}))
    b.remote = Remote(sender_a, a, topo, frozenset({1}))
    # one spine's uplinks to two leaves, one in each shard: alone each shard sees one leaf, not a spine fault
    _feed((a, b), {("leaf-00", 3): 200.0, ("leaf-01", 3): 200.0}, sweeps=4)
    # decided by the shard of the first bad leaf (A: leaf-00), once: one sender per alert
    spine = [i for i in a.open_incidents() if i.alertname == "FabricSpineDegraded"]
    assert [(i.component, i.severity, i.labels["spine"]) for i in spine] == [("spine-00", "critical", "spine-00")]
    assert "leaf-01" in " ".join(spine[0].evidence) and "other shards" in " ".join(spine[0].evidence)
    # B leaves it to A and keeps its uplink alert, which the spine's hides in Alertmanager (equal: [cluster,
    # spine]: tests/deploy/test_alertmanager_inhibitions.py)
    assert _open(b) == {("FabricLinkErrors", "leaf-01/p3")}
    for r in range(3):  # stable: neither shard's decision takes away what the other one read
        _feed((a, b), {("leaf-00", 3): 200.0, ("leaf-01", 3): 200.0}, sweeps=2, start=10 * (r + 1))
        assert ("FabricSpineDegraded", "spine-00") in _open(a) and _open(b) == {("FabricLinkErrors", "leaf-01/p3")}
    # without the other shard's summary (no remote source) a shard does not decide it
    _, a2, b2 = _shards(tmp_path)
    _feed((a2, b2), {("leaf-00", 3): 200.0, ("leaf-01", 3): 200.0}, sweeps=4)
    assert not any(i.alertname == "FabricSpineDegraded" for e in (a2, b2) for i in e.open_incidents())
    # and another shard's bad uplink alone, with none of this spine's here, is not this shard's spine fault
    _, a3, b3 = _shards(tmp_path)
    a3.remote = Remote(sender_b, b3, topo, frozenset({0}))
    _feed((a3, b3), {("leaf-01", 3): 200.0, ("leaf-00", 4): 200.0}, sweeps=4)
    assert not any(i.alertname == "FabricSpineDegraded" for i in a3.open_incidents())
