"""The periodic tick skipped when nothing it reads changed (aggregator/tick_gate.py), with the same results.

Two engines fed the same batches: one ticked four times a sample second through the runtime (its gate
skips the ticks with no new input), the other ticked as often directly (every tick runs).  What they
report and the incidents they hold must be the same; and one changed input of each kind runs the next
tick.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fabricmon.aggregator import topology_reload
from fabricmon.aggregator.runtime import AggregatorRuntime
from fabricmon.nccl_ras.client import QueryResult
from fabricmon.proto.ras import RasReport
from fabricmon.topology import generate_topology
from support.enginerig import Cluster, flaky

TICKS_PER_SECOND = 4  # the runtime's default tick_seconds (0.25) at 1 s polls


def _seen(incs) -> list[tuple[str, str, bool]]:
    return [(i.alertname, i.component, i.open) for i in incs]


def test_ticks_without_new_input_are_skipped_and_find_the_same():
    gated, plain = Cluster(nodes=8, seed=5), Cluster(nodes=8, seed=5)  # the same seeds: the same batches
    rt = AggregatorRuntime(gated.engine)  # no gRPC, HTTP or sender: the ticks only
    node = next(iter(gated.feeds))
    got: dict[str, list] = {"gated": [], "plain": []}
    seconds = 50
    for s in range(seconds):
        for c in (gated, plain):
            c.feed(flaky(node, "mlx5_0") if 5 <= s < 25 else None)  # opens, then resolves after its hold
        for _ in range(TICKS_PER_SECOND):
            got["gated"] += _seen(rt.tick())
            got["plain"] += _seen(plain.engine.tick(plain.engine.newest_ts))
    assert any(a == "FabricLinkErrors" and o for a, _c, o in got["plain"]), got["plain"]  # something happened
    assert got["gated"] == got["plain"]
    key = [(i.id, i.first_seen, i.last_seen, i.resolved_at, i.open) for i in gated.engine.incidents()]
    assert key == [(i.id, i.first_seen, i.last_seen, i.resolved_at, i.open) for i in plain.engine.incidents()]
    # the first tick of each sample second runs, the three after it have nothing new
    assert gated.engine.detection.ticks_total == seconds
    assert rt.gate.skipped_total == seconds * (TICKS_PER_SECOND - 1)
    assert rt.stats()["ticks_skipped_total"] == rt.gate.skipped_total


def _hello(c: Cluster) -> None:
    c.engine.hello(next(iter(c.feeds.values())).hello())


def _disconnect(c: Cluster) -> None:
    c.engine.disconnected(next(iter(c.feeds)))


def _duplicate_batch(c: Cluster) -> None:
    f = next(iter(c.feeds.values()))
    f.seq -= 1  # a replay after a lost ack: dropped, and still what the admission counters and clock saw
    c.engine.ingest(f.batch(c.t))


def _ras_report(c: Cluster) -> None:
    c.engine.ras_report(next(iter(c.feeds)), RasReport(1, "job", "", QueryResult("ok", "", 0.1)))


def _settings(c: Cluster) -> None:
    c.engine.settings = replace(c.engine.settings)  # a reload's new object, even with the same values


def _topology_reload(c: Cluster) -> None:
    new = generate_topology(7, nodes_per_unit=8, layout="roce", cluster="test")  # the last node removed
    topology_reload.apply(c.engine, topology_reload.plan(c.engine.topology, new, "topology.yaml"), c.t)


def _binding(c: Cluster) -> None:
    topo = c.engine.topology
    name = next(iter(topo.nodes))
    topo.index.add(topo.nodes[name])  # what a hello's binding does after replacing the node's spec


@pytest.mark.parametrize("change", [_hello, _disconnect, _duplicate_batch, _ras_report, _settings,
                                    _topology_reload, _binding])
def test_one_changed_input_runs_the_next_tick(change):
    c = Cluster(nodes=8, seed=2)
    rt = AggregatorRuntime(c.engine)
    c.feed()
    rt.tick()
    rt.tick()
    assert (c.engine.detection.ticks_total, rt.gate.skipped_total) == (1, 1)
    change(c)
    rt.tick()
    assert (c.engine.detection.ticks_total, rt.gate.skipped_total) == (2, 1), change.__name__
    rt.tick()  # and nothing since
    assert (c.engine.detection.ticks_total, rt.gate.skipped_total) == (2, 2)


def test_an_explicit_time_always_ticks():
    c = Cluster(nodes=4, seed=3)
    rt = AggregatorRuntime(c.engine)
    c.feed()
    for _ in range(3):
        rt.tick(c.t)
    rt.tick()  # the first periodic tick after explicit ones runs: they are not its reference
    assert c.engine.detection.ticks_total == 4 and rt.gate.skipped_total == 0
