"""Tree-mode simulation spread over worker processes, one share of the nodes each.

Rendering trees and polling real agents is CPU-bound Python, so one process
is limited to one core.  The simulation is deterministic (seeded), so every
worker advances the whole cluster state and job (cheap, vectorized) and renders
and polls only its own nodes; the parent advances its own copy for the clock,
topology and ground truth and receives the NodeBatches each worker's agents
produced.  Workers are started with ``spawn`` (no threads or locks inherited)
and always told to stop; a worker that dies ends the run with its error.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..batch import NodeBatch, NodeHello
from ..model import CounterDelta, Sample
from .collector import settle
from .runner import SimulatedCluster, StepStats
from .scenario import Scenario

STEP_TIMEOUT_S = 120.0
AHEAD = 3  # steps a worker may run ahead of the caller


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
        sim.start()
        # Each step allocates tens of thousands of short-lived objects (readings, samples, deltas)
        # over a heap of long-lived tracker state: move what exists now out of the collector's
        # view and collect young objects less often (about 10 % of a worker's CPU otherwise).
        settle()  # sim/collector.py
        conn.send(("started", sim.hellos(), [_pack(b) for b in batches]))
        batches.clear()
        while True:
            cmd = conn.recv()
            if cmd != "step":
                break
            st = sim.step()
            conn.send(("step", st, [_pack(b) for b in batches]))
            batches.clear()
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:  # report, then exit: the parent raises it
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", []))
        except OSError:
            pass
    finally:
        sim.close()
        agents = sim.tree_agents  # tree mode: always there
        if agents is not None:
            for i in nodes:  # each worker removes its own trees: in parallel, and before the parent's rmtree
                shutil.rmtree(agents.node_root(sim.cluster.names[i]), ignore_errors=True)
        conn.close()


class ParallelTreeCluster:
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
        self.log_level = log_level
        self.rank_intake = rank_intake
        self._own_base = base_dir is None
        self.base_dir = str(base_dir or default_base_dir())
        self.driver = SimulatedCluster(scenario, mode="tree", interval=interval, base_dir=self.base_dir,
                                       epoch=epoch, nodes=[])
        self.topology = self.driver.topology
        n = scenario.cluster.nodes
        workers = max(1, min(workers, n))
        self._shares = [list(range(w, n, workers)) for w in range(workers)]
        self._ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list = []
        self._hellos: list[NodeHello] = []
        self._pending: list[NodeBatch] = []
        self.agents_count = n
        self.steps = 0
        self._inflight = 0  # steps already asked of the workers and not yet collected
        self._asked_until = 0.0  # simulated time the last asked step reaches

    # -- the SimulatedCluster surface the demo uses
    @property
    def t(self) -> float:
        return self.driver.t

    def now(self) -> float:
        return self.driver.now()

    def ground_truth(self) -> list[dict]:
        return self.driver.ground_truth()

    @property
    def switch_sources(self) -> tuple[str, ...]:
        return self.driver.switch_sources  # the worker rendering that node runs its sweeping agent

    def jobs_truth(self) -> list[dict]:
        return self.driver.jobs_truth()  # the parent steps the same jobs as the workers

    def decoys_truth(self) -> list[dict]:
        return self.driver.decoys_truth()

    def hellos(self) -> list[NodeHello]:
        self._await_started()
        return list(self._hellos)

    def start(self) -> None:
        """Spawn the workers and return; they build their trees while the caller sets up."""
        if self._procs:
            return
        os.makedirs(self.base_dir, exist_ok=True)
        self.driver.start()
        for share in self._shares:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker, args=(child, self.scenario, self.interval, self.base_dir,
                                                           self.driver.cluster.ts() - self.driver.t, share,
                                                           self.log_level, self.rank_intake),
                                     daemon=True, name=f"sim-worker-{share[0]}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._started = False

    def _await_started(self) -> None:
        if getattr(self, "_started", True):
            return
        for conn in self._conns:
            _, hellos, batches = self._recv(conn)
            self._hellos.extend(hellos)
            self._pending.extend(_unpack(b) for b in batches)
        self._started = True

    def _ask_ahead(self) -> None:
        # Keep up to AHEAD steps queued at every worker, so a worker that finishes early goes
        # straight on instead of waiting at a barrier for the slowest one and for the caller.
        while self._inflight < AHEAD and self._asked_until + self.interval <= self.scenario.duration + 1e-9:
            for conn in self._conns:
                conn.send("step")
            self._inflight += 1
            self._asked_until += self.interval

    def step(self) -> StepStats:
        self._await_started()
        if self._inflight == 0:
            self._asked_until = self.driver.t
        self._ask_ahead()
        st = self.driver.step()  # clock, job and state of the parent, while the workers work
        results = [self._recv(conn) for conn in self._conns]
        self._inflight -= 1
        self._ask_ahead()
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

    def _recv(self, conn: Connection):
        if not conn.poll(STEP_TIMEOUT_S):
            raise TimeoutError(f"simulation worker gave no answer in {STEP_TIMEOUT_S:.0f} s")
        try:
            msg = conn.recv()
        except EOFError:
            raise RuntimeError("a simulation worker exited without answering (its error is above)") from None
        if msg[0] == "error":
            raise RuntimeError(f"simulation worker failed: {msg[1]}")
        return msg

    def close(self) -> None:
        if self._procs and not getattr(self, "_started", True):
            try:
                self._await_started()
            except (RuntimeError, TimeoutError):
                pass
        for _ in range(self._inflight):
            for conn in self._conns:  # collect the steps nobody will use, so the workers are idle
                try:
                    if conn.poll(STEP_TIMEOUT_S):
                        conn.recv()
                except (EOFError, OSError):
                    pass
        self._inflight = 0
        for conn in self._conns:
            try:
                conn.send("stop")
            except OSError:
                pass
        deadline = time.monotonic() + 10.0
        for proc in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
        for conn in self._conns:
            conn.close()
        self.driver.close()
        if self._own_base:
            shutil.rmtree(self.base_dir, ignore_errors=True)
