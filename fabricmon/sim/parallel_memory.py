"""Memory-mode simulation with the agents' side of the wire in a worker process.

At 4,096 nodes a memory-mode step is about five seconds of one core, in two halves that meet only
at the wire's bytes: the agents' side (the simulator building every node's batch, each node's rank
intake parsing its ranks' JSON lines, each agent's series encoder) and the aggregator's side
(parsing, decoding, ingesting, the detection tick).  Here the agents' side runs in a spawned worker
(``sim_workers.py``) and the parent keeps the aggregator's: the worker sends every node's hello and
batches as the bytes the stream client writes, in parts of ``PART`` nodes so that the parent decodes
while the worker encodes, and runs up to ``AHEAD`` steps ahead.  The simulation is deterministic
(seeded), so the parent steps its own copy of the state without nodes (``SimulatedCluster(mode=
"memory", nodes=[])``: the clock, the jobs and their RAS, the truths), as ``sim/parallel.py`` does
for tree mode.  Link-watch batches between polls come back with their step's, ticked with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..batch import NodeBatch, NodeHello
from ..proto.loopback import AgentEnd
from .collector import LongRunCollector
from .runner import SimulatedCluster, StepStats
from .scenario import Scenario
from .sim_workers import ParentState, SimWorkers, answering

PART = 256  # nodes' batches a message: the parent decodes one part while the worker makes the next
AHEAD = 2  # steps the worker may run ahead of the parent
# A step of thousands of nodes takes seconds, the first (every series defined) tens of seconds.
STEP_TIMEOUT_S = 600.0


def _worker(conn: Connection, scenario: Scenario, interval: float, epoch: float, log_level: str,
            link_watch: float, ras: list[str]) -> None:
    from ..logs import configure_logging

    configure_logging("auto", log_level)  # a spawned interpreter starts with structlog's defaults
    collector = LongRunCollector()  # paused while the state is built (sim/collector.py), as in the demo
    collector.pause()
    agents = AgentEnd()
    out: list[tuple[str, bytes]] = []

    def send(b: NodeBatch) -> None:
        out.append((b.node, agents.batch(b)))
        if len(out) >= PART:
            conn.send(("part", out[:]))
            out.clear()

    sim = SimulatedCluster(scenario, mode="memory", interval=interval, epoch=epoch, rank_intake=True,
                           link_watch=link_watch)
    for job, addr in zip(sim.jobs.jobs if sim.jobs is not None else [], ras, strict=True):
        job.nccl_ras = addr  # the parent's RAS servers (the same jobs in the same order), in the heartbeats
    try:
        with answering(conn):
            sim.start()  # its first batches wait in the simulator until on_batch is set
            hellos = sim.hellos()
            conn.send(("started", hellos, [agents.hello(h) for h in hellos]))
            sim.on_batch = send
            while conn.recv() == "step":
                st = sim.step()
                conn.send(("step", st, out[:]))
                out.clear()
                collector.settle()  # once, after the first step: the long-lived state is built
    finally:
        sim.close()
        conn.close()


class ParallelMemoryCluster(ParentState):
    """SimulatedCluster's memory mode with the wire's agents' end in a worker: the caller (``sim.drive``)
    sets ``on_message`` to the wire's server end, which gets every node's batch as bytes."""

    def __init__(self, scenario: Scenario, *, interval: float = 1.0, epoch: float, log_level: str = "warning",
                 nccl_ras: bool = False, link_watch: float = 1.0) -> None:
        self.scenario = scenario
        self.interval = float(interval)
        # the batches come as bytes (on_message); there is no NodeBatch on this side to hand over
        self.on_batch: Callable[[NodeBatch], object] | None = None
        self.on_message: Callable[[str, bytes], None] | None = None
        self.on_watch_tick: Callable[[float], None] | None = None  # never called (see the module doc)
        self.driver = SimulatedCluster(scenario, mode="memory", interval=interval, epoch=epoch, nodes=[],
                                       nccl_ras=nccl_ras, link_watch=link_watch)
        self.topology = self.driver.topology
        self.ras = self.driver.ras  # the jobs' RAS, answered from the parent's copy of the jobs
        jobs = self.driver.jobs.jobs if self.driver.jobs is not None else []
        ras = [job.nccl_ras for job in jobs]
        self._workers = SimWorkers(_worker, [(scenario, self.interval, self.driver.cluster.ts() - self.driver.t,
                                              log_level, link_watch, ras)], ["sim-memory-worker"],
                                   duration=scenario.duration, interval=self.interval, ahead=AHEAD,
                                   timeout=STEP_TIMEOUT_S)
        self._hellos: list[NodeHello] = []
        self._hello_bytes: list[bytes] = []
        self._pending: list[tuple[str, bytes]] = []
        self._started = True
        self.steps = 0

    def start(self) -> None:
        """Spawn the worker and return; it builds its state while the caller sets up."""
        if not self._workers.started:
            self._start_workers()

    def _await_started(self) -> None:
        if self._started:
            return
        _, self._hellos, self._hello_bytes = self._workers.recv(self._workers.conns[0])
        self._started = True

    def hellos(self) -> list[NodeHello]:
        self._await_started()
        return list(self._hellos)

    def hello_messages(self) -> list[bytes]:
        """Every node's hello as its agent's stream sends it (the same nodes as ``hellos()``)."""
        self._await_started()
        return list(self._hello_bytes)

    def _deliver(self, messages: list[tuple[str, bytes]]) -> None:
        if self.on_message is None:
            self._pending.extend(messages)  # kept for a sink set later
            return
        if self._pending:
            messages, self._pending = self._pending + messages, []
        for node, data in messages:
            self.on_message(node, data)

    def step(self) -> StepStats:
        self._await_started()
        self._workers.ask_ahead(self.driver.t)
        st = self.driver.step()  # the parent's clock, jobs and state, while the worker makes the batches
        t0 = time.perf_counter()
        conn = self._workers.conns[0]
        msg = self._workers.recv(conn)
        while msg[0] == "part":
            self._deliver(msg[1])
            msg = self._workers.recv(conn)
        _, made, rest = msg
        self._deliver(rest)
        self._workers.collected()
        self._workers.ask_ahead(self.driver.t)
        # batch_s: the parent's wait for the worker's batches and the wire's server end (decode, ingest)
        st.batch_s = time.perf_counter() - t0
        st.rank_timings, st.batches = made.rank_timings, made.batches
        st.extra = {**made.extra, "worker_batch_s": made.batch_s}
        self.steps += 1
        return st

    def close(self) -> None:
        self._stop_workers()
