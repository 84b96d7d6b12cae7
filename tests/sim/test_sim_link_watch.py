"""The simulator's agents watch their links between polls as the real agent does: at a 5 s interval a
link that goes down at t=11.3 is in a batch at the 1 s watch tick t=12 (not at the poll at t=15), in
tree mode (the real agents' LinkWatch over rendered trees decides) and in memory mode alike, and the
aggregator opens FabricLinkDown at that batch's sample time."""

from __future__ import annotations

import pytest

from fabricmon.aggregator.engine import Engine
from fabricmon.batch import NodeBatch
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import ClusterSpec, Fault, Scenario

IV = 5.0
NODE, RAIL = "node-002", 3


def _run(mode: str, faults: list[Fault], link_watch: float = 1.0, duration: float = 20.0):
    scn = Scenario(ClusterSpec(nodes=4, layout="ib", nodes_per_unit=4, seed=3), duration=duration, faults=tuple(faults))
    sim = SimulatedCluster(scn, mode=mode, interval=IV, job=None, link_watch=link_watch)
    eng = Engine(sim.topology, cluster="t")
    batches: list[NodeBatch] = []
    watch_ticks: list[float] = []

    def ingest(b: NodeBatch) -> None:
        batches.append(b)
        assert eng.ingest(b), (b.node, b.seq, b.ts)

    def tick(ts: float) -> None:
        watch_ticks.append(ts - sim.cluster.ts(0))
        eng.tick(ts)

    try:
        sim.on_watch_tick = tick
        sim.start()
        for h in sim.hellos():
            eng.hello(h)
        sim.on_batch = ingest
        while sim.t + IV <= duration + 1e-9:
            sim.step()
            eng.tick(sim.now())
        epoch = sim.cluster.ts(0)
        watch_batches = sim.watch.batches if sim.watch is not None else 0
    finally:
        sim.close()
    return eng, batches, watch_ticks, epoch, watch_batches


def _down_gauge(b: NodeBatch) -> list[float]:
    return [g.value for g in b.gauges if g.family == "fabricmon_ib_port_state" and dict(g.labels)["device"] == "mlx5_3"]


@pytest.mark.parametrize("mode", ["tree", "memory"])
def test_link_down_is_in_a_batch_at_the_next_watch_tick(mode):
    eng, batches, ticks, epoch, n = _run(mode, [Fault("link_down", start=11.3, node=NODE, rail=RAIL)])
    off = [b for b in batches if round(b.ts - epoch, 6) % IV]
    assert [(b.node, round(b.ts - epoch, 6), round(b.interval_seconds, 6)) for b in off] == [(NODE, 12.0, 2.0)]
    assert n == 1 and ticks == [12.0]
    assert _down_gauge(off[0]) == [1.0]  # DOWN, read by the off-cadence poll
    # the next regular batch of that node covers 3 s, the others' 5 s; seqs stay per node
    nxt = [b for b in batches if b.node == NODE and round(b.ts - epoch, 6) == 15.0]
    assert len(nxt) == 1 and round(nxt[0].interval_seconds, 6) == 3.0 and nxt[0].seq == off[0].seq + 1
    down = [i for i in eng.incidents() if i.alertname == "FabricLinkDown"]
    assert [(i.component, round(i.first_seen - epoch, 6)) for i in down] == [(f"{NODE}/mlx5_3/1", 12.0)]


def test_without_the_watch_the_link_waits_for_the_next_poll():
    eng, batches, ticks, epoch, n = _run("memory", [Fault("link_down", start=11.3, node=NODE, rail=RAIL)],
                                         link_watch=0.0)
    assert n == 0 and ticks == [] and all(round(b.ts - epoch, 6) % IV == 0 for b in batches)
    down = [i for i in eng.incidents() if i.alertname == "FabricLinkDown"]
    assert [round(i.first_seen - epoch, 6) for i in down] == [15.0]


@pytest.mark.parametrize("mode", ["tree", "memory"])
def test_a_flapping_link_polls_off_cadence_at_most_once_per_interval(mode):
    # down 1 s, up 1 s: a change at every watch tick
    eng, batches, _, epoch, n = _run(mode, [Fault("link_flap", start=10.5, node=NODE, rail=RAIL, period=2.0)],
                                     duration=20.0)
    off = [round(b.ts - epoch, 6) for b in batches if round(b.ts - epoch, 6) % IV]
    assert all(b.node == NODE for b in batches if round(b.ts - epoch, 6) % IV)
    # one off-cadence poll in each interval since the flapping began, never two
    assert off == [11.0, 16.0] and n == 2
    assert [i.alertname for i in eng.incidents() if i.component == f"{NODE}/mlx5_3/1"][:1] in (
        ["FabricLinkDown"], ["FabricLinkFlapping"])
