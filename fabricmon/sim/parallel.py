"""Tree-mode simulation spread over worker processes, one share of the nodes each.

Rendering trees and polling real agents is CPU-bound Python, so one process
is limited to one core.  The simulation is deterministic (seeded), so every
worker advances the whole cluster state and job (cheap, vectorized) and renders
and polls only its own nodes; the parent advances its own copy for the clock,
topology and ground truth and receives the NodeBatches each worker's agents
produced.  Workers are started with ``spawn`` (no threads or locks inherited)
and always told to stop; a worker that dies ends the run with its error (``sim_workers.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..batch import NodeBatch, NodeHello
from ..model import CounterDelta, Sample
from .collector import settle
from .runner import SimulatedCluster, StepStats
from .scenario import Scenario
from .sim_workers import ParentState, SimWorkers, answering


# Pickling frozen slotted dataclasses goes through dataclasses' generic __setstate__, which cost
# the parent ~170 ms per step for 32 nodes: batches travel as plain tuples instead.
def _pack(b: NodeBatch) -> tuple:
    return (b.node, b.seq, b.ts, b.interval_seconds,
            [(d.family, d.labels, d.delta, d.saturated, d.reset) for d in b.deltas],
            [(g.family, g.labels, g.value) for g in b.gauges], b.ranks, b.layouts, b.heartbeats)


def _unpack(t: tuple) -> NodeBatch:
    node, seq, ts, interval, deltas, gauges, ranks, layouts, heartbeats = t
    return NodeBatch(node, seq, ts, interval, tuple(CounterDelta(*d) for d in deltas),
                     tuple(Sample(*g) for g in gauges), ranks, layouts, heartbeats=heartbeats)


def _worker(conn: Connection, scenario: Scenario, interval: float, base_dir: str, epoch: float,
            nodes: list[int], log_level: str, rank_intake: bool = False) -> None:
    from ..logs import configure_logging

    configure_logging("auto", log_level)  # a spawned interpreter starts with structlog's defaults
    batches: list[NodeBatch] = []
    sim = SimulatedCluster(scenario, mode="tree", interval=interval, base_dir=base_dir, epoch=epoch,
                           nodes=nodes, poll_workers=1, on_batch=batches.append, rank_intake=rank_intake)
    try:
        with answering(conn):
            sim.start()
            # Each step allocates tens of thousands of short-lived objects (readings, samples, deltas)
            # over a heap of long-lived tracker state: move what exists now out of the collector's
            # view and collect young objects less often (about 10 % of a worker's CPU otherwise).
            settle()  # sim/collector.py
            conn.send(("started", sim.hellos(), [_pack(b) for b in batches]))
            batches.clear()
            while conn.recv() == "step":
                st = sim.step()
                conn.send(("step", st, [_pack(b) for b in batches]))
                batches.clear()
    finally:
        sim.close()
        agents = sim.tree_agents  # tree mode: always there
        if agents is not None:
            for i in nodes:  # each worker removes its own trees: in parallel, and before the parent's rmtree
                shutil.rmtree(agents.node_root(sim.cluster.names[i]), ignore_errors=True)
        conn.close()


class ParallelTreeCluster(ParentState):
    """The part of SimulatedCluster's interface the demo uses, over ``workers`` processes."""

    def __init__(self, scenario: Scenario, *, interval: float = 1.0, base_dir: str | None = None,
                 epoch: float, workers: int = 2, on_batch: Callable[[NodeBatch], object] | None = None,
                 log_level: str = "warning", rank_intake: bool = False) -> None:
        from .tree import default_base_dir

        self.scenario = scenario
        self.interval = float(interval)
        self.on_batch: Callable[[NodeBatch], object] | None = on_batch
        # never called: a worker's link-watch batches come back with its step's, ticked with them
        self.on_watch_tick: Callable[[float], None] | None = None
        self._own_base = base_dir is None
        self.base_dir = str(base_dir or default_base_dir())
        self.driver = SimulatedCluster(scenario, mode="tree", interval=interval, base_dir=self.base_dir,
                                       epoch=epoch, nodes=[])
        self.topology = self.driver.topology
        n = scenario.cluster.nodes
        workers = max(1, min(workers, n))
        shares = [list(range(w, n, workers)) for w in range(workers)]
        worker_epoch = self.driver.cluster.ts() - self.driver.t
        self._workers = SimWorkers(_worker, [(scenario, self.interval, self.base_dir, worker_epoch, share, log_level,
                                              rank_intake) for share in shares],
                                   [f"sim-worker-{share[0]}" for share in shares],
                                   duration=scenario.duration, interval=self.interval)
        self._hellos: list[NodeHello] = []
        self._pending: list[NodeBatch] = []
        self.agents_count = n
        self.steps = 0
        self._started = True

    # -- the SimulatedCluster surface the demo uses (the clock and truths: ParentState)
    def hellos(self) -> list[NodeHello]:
        self._await_started()
        return list(self._hellos)

    def start(self) -> None:
        """Spawn the workers and return; they build their trees while the caller sets up."""
        if self._workers.started:
            return
        os.makedirs(self.base_dir, exist_ok=True)
        self._start_workers()

    def _await_started(self) -> None:
        if self._started:
            return
        for conn in self._workers.conns:
            _, hellos, batches = self._workers.recv(conn)
            self._hellos.extend(hellos)
            self._pending.extend(_unpack(b) for b in batches)
        self._started = True

    def step(self) -> StepStats:
        self._await_started()
        self._workers.ask_ahead(self.driver.t)
        st = self.driver.step()  # clock, job and state of the parent, while the workers work
        results = [self._workers.recv(conn) for conn in self._workers.conns]
        self._workers.collected()
        self._workers.ask_ahead(self.driver.t)
        stats = [r[1] for r in results]
        st.render_s = max(s.render_s for s in stats)
        st.poll_s = max(s.poll_s for s in stats)
        st.files_written = sum(s.files_written for s in stats)
        st.rank_timings = sum(s.rank_timings for s in stats) // max(len(stats), 1)
        batches = [_unpack(b) for r in results for b in r[2]]
        st.batches = len(batches)
        if self.on_batch is not None:
            pending, self._pending = self._pending, []
            for b in pending + batches:
                self.on_batch(b)
        self.steps += 1
        return st

    def close(self) -> None:
        self._stop_workers()
        if self._own_base:
            shutil.rmtree(self.base_dir, ignore_errors=True)
