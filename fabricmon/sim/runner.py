"""SimulatedCluster: topology + scenario + cluster state + synthetic job + per-node agents, on a simulated clock.

A composition: the cluster state (``sim.cluster``), the jobs (``sim.jobs``), and one of two modes:

* ``tree`` (small runs, the demo, the agent's integration tests): ``sim.tree_agents`` gives every node
  a tree (``tree.NodeTree``, on /dev/shm when it exists) rewritten incrementally each interval, and a
  real agent (``agent.runtime.build_agent`` with ``clock`` = the simulated clock) polls it; each
  snapshot, with the node's rank timings, goes to ``on_snapshot`` and, converted with the stream
  client's gauge rule, to ``on_batch``.
* ``memory`` (large or long runs, benchmarks): no files; ``sim.memory_batches`` (over
  ``inmemory.BatchBuilder``) produces the NodeBatch each agent would stream, to ``on_batch``.

Link watch (``sim.watch_ticks``): each simulated agent watches its links between polls as the real agent
does (``link_watch`` seconds, default the agent's 1 s; only when shorter than the interval);
``on_watch_tick(ts)`` is called after a watch tick that sent batches (a benchmark ticks its aggregator
there).
``rank_intake=True``: the training ranks' timings, heartbeats and layouts reach the batches as a
job's client sends them, JSON lines into each node's real ``agent.intake.RankIntake``, drained
each interval as the agent's stream does; without it they are handed to the batch as parsed values.

Time: ``t`` is simulated seconds since the scenario started; sample times are
``epoch + t``.  ``step()`` advances by one agent interval (simulated seconds);
``run(speed=...)`` paces steps at ``speed`` simulated seconds per wall second
(None: as fast as possible).  Everything is bounded: the scenario's duration,
``max_tree_nodes`` in tree mode, and an optional wall-clock ``deadline``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import structlog

from ..batch import NodeBatch, NodeHello
from ..model import Snapshot
from ..rank_timing import RankTiming
from ..topology import Topology
from .cluster import EPOCH, ClusterState
from .intake_feed import IntakeFeed
from .job import JobSpec
from .jobs import JobSet
from .memory_batches import MemoryBatches
from .ras_link import SimRas
from .scenario import Scenario
from .sweep_feed import SWEEP_INTERVAL, SweepFeed
from .tree_agents import TreeAgents
from .watch_ticks import WatchTicks

log = structlog.get_logger("fabricmon.sim")

MAX_TREE_NODES = 256
# the job every node runs unless told otherwise (JobSpec is frozen: one shared default is safe)
DEFAULT_JOB = JobSpec()


@dataclass
class StepStats:
    t: float
    advance_s: float = 0.0
    job_s: float = 0.0
    render_s: float = 0.0
    poll_s: float = 0.0
    batch_s: float = 0.0
    files_written: int = 0
    rank_timings: int = 0
    batches: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.advance_s + self.job_s + self.render_s + self.poll_s + self.batch_s


class ClusterSim(Protocol):
    """What the demo drives: SimulatedCluster, or ParallelTreeCluster (sim/parallel.py) or
    ParallelMemoryCluster (sim/parallel_memory.py) over worker processes."""

    topology: Topology
    scenario: Scenario
    interval: float
    on_batch: Callable[[NodeBatch], object] | None
    # called with the sample time after a link-watch tick sent batches between polls (None: never)
    on_watch_tick: Callable[[float], None] | None

    @property
    def t(self) -> float: ...
    def now(self) -> float: ...
    def start(self) -> None: ...
    def hellos(self) -> list[NodeHello]: ...
    def step(self) -> StepStats: ...
    def close(self) -> None: ...
    def ground_truth(self) -> list[dict[str, Any]]: ...
    def jobs_truth(self) -> list[dict[str, Any]]: ...
    def decoys_truth(self) -> list[dict[str, Any]]: ...


class SimulatedCluster:
    def __init__(
        self,
        scenario: Scenario,
        *,
        mode: str = "tree",
        interval: float = 1.0,
        base_dir: str | Path | None = None,
        job: JobSpec | None = DEFAULT_JOB,
        epoch: float = EPOCH,
        http: bool = False,
        on_snapshot: Callable[[str, Snapshot, list[RankTiming]], None] | None = None,
        on_batch: Callable[[NodeBatch], object] | None = None,
        progress: Callable[[StepStats], None] | None = None,
        poll_workers: int | None = None,
        max_tree_nodes: int = MAX_TREE_NODES,
        keep_trees: bool = False,
        nodes: list[int] | None = None,
        link_watch: float = 1.0,
        on_watch_tick: Callable[[float], None] | None = None,
        nccl_ras: bool = False,
        rank_intake: bool = False,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> None:
        if mode not in ("tree", "memory"):
            raise ValueError(f"mode must be tree or memory, got {mode!r}")
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        c = scenario.cluster
        if mode == "tree" and c.nodes > max_tree_nodes:
            raise ValueError(f"{c.nodes} nodes is too many for tree mode (at most {max_tree_nodes}); "
                             "use mode='memory'")
        self.scenario = scenario
        self.mode = mode
        self.interval = float(interval)
        if not link_watch >= 0:
            raise ValueError(f"link_watch must be >= 0, got {link_watch}")
        # the agents' link watch period; 0 (or not shorter than the interval): no watch, as in the agent
        self.link_watch = float(link_watch) if 0 < link_watch < interval else 0.0
        self.on_watch_tick = on_watch_tick
        self.on_snapshot = on_snapshot
        self.on_batch: Callable[[NodeBatch], object] | None = on_batch
        self.progress = progress
        self.http = http
        self.keep_trees = keep_trees
        self.topology: Topology = c.build_topology()  # rail-optimized, a fat tree, or the scenario's file
        self.cluster = ClusterState(scenario, epoch=epoch)
        # the switch side (cluster: {spines: ...}): the first node's agent sweeps every switch port
        self.sweep: SweepFeed | None = None
        if self.cluster.switches is not None:
            self.sweep = SweepFeed(self.cluster.switches, self.cluster.names[0], sweep_interval, seed=c.seed)
        # every job of the scenario (one "llm-7b" on every node without ``jobs:``), with its decoys
        self.jobs = JobSet(scenario, self.cluster, job, epoch=epoch) if job is not None else None
        # nccl_ras: every job announces a loopback RAS speaking NCCL's protocol; ``ras.attach`` links the
        # aggregator's queries to it (sim/ras_link.py)
        self.ras = SimRas(self.jobs.jobs) if nccl_ras and self.jobs is not None else None
        self._own_base = False
        self.base_dir: str | None = None
        self.memory: MemoryBatches | None = None  # memory mode's batches, from start() (sim/memory_batches.py)
        # tree mode: the node trees and their real agents (sim/tree_agents.py)
        self.tree_agents: TreeAgents | None = None
        self._started = False
        self._closed = False
        # batches of the initial poll made by start() before anyone set on_batch: delivered first
        self._undelivered: list[NodeBatch] = []
        self.steps = 0
        self._heartbeats: dict[str, list] = {}  # this step's heartbeats by node
        self.rank_intake = rank_intake
        self._intake_feed = IntakeFeed(self.now, lambda: self.layouts)  # rank_intake only (sim/intake_feed.py)
        # Tree mode: the node indexes this instance renders and polls (all by default).  The whole
        # cluster state and job still advance here: the simulation is deterministic, so parallel
        # workers (sim/parallel.py) each advance all of it and render and poll their own nodes.
        self._node_index: list[int] = list(range(c.nodes)) if nodes is None else sorted(nodes)
        if mode == "memory" and self._node_index and len(self._node_index) != c.nodes:
            # memory mode builds every node's batch at once (vectorized), or none: ``nodes=[]`` is the
            # state alone (clock, jobs, ground truth), as the parallel memory simulator's parent keeps
            raise ValueError("memory mode builds every node's batches or none (nodes=[])")
        if mode == "tree":
            if base_dir is None:
                from .tree import default_base_dir

                base_dir = default_base_dir()
                self._own_base = True
            self.base_dir = str(base_dir)
            self.tree_agents = TreeAgents(self.cluster, self._node_index, self.base_dir, self.now, self.interval,
                                          self.link_watch, http=http,
                                          poll_workers=poll_workers or min(8, max(1, c.nodes)))
        # the agents' link watch between polls, when on (sim/watch_ticks.py)
        self.watch = (WatchTicks(self.cluster, self.link_watch, self._node_index)
                      if self.link_watch and (mode == "tree" or self._node_index) else None)

    # ------------------------------------------------------------------ setup
    @property
    def layouts(self) -> tuple:
        """Every job's layout (sent once per connection, as a job's client would)."""
        return self.jobs.layouts if self.jobs is not None else ()

    @property
    def t(self) -> float:
        return self.cluster.t

    def now(self) -> float:
        """The simulated clock (epoch seconds): what every agent and sample uses."""
        return self.cluster.ts()

    @property
    def switch_sources(self) -> tuple[str, ...]:
        """The nodes whose streams carry the switch sweep (the aggregator's ``auth.switch_sources``)."""
        return (self.sweep.node,) if self.sweep is not None else ()

    def switch_file(self) -> str | None:
        """Tree mode: the fake sweep file the sweeping node's agent reads (None where this instance does not
        render that node: a parallel worker of other nodes)."""
        if self.sweep is None or self.base_dir is None or self.cluster.index[self.sweep.node] not in self._node_index:
            return None
        return os.path.join(self.base_dir, "switch-sweep.json")

    def _write_sweep(self) -> None:
        path = self.switch_file()
        if path is not None and self.sweep is not None and self.sweep.due(self.cluster.t):
            self.sweep.write(self.cluster.t, self.now(), path)

    def write_topology(self, path: str | Path) -> None:
        self.topology.write_yaml(path)

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        c = self.cluster
        if self.mode == "memory":
            if not self._node_index:
                return  # the state alone (nodes=[])
            self.memory = MemoryBatches(c, self.interval, self.sweep, self.now, lambda: self.layouts,
                                        self._intake_feed if self.rank_intake else None)
            self.memory.emit(self._by_node([]), self._heartbeats, self._deliver)
            return
        assert self.base_dir is not None and self.tree_agents is not None  # tree mode has them (__init__)
        os.makedirs(self.base_dir, exist_ok=True)
        self._write_sweep()
        self.tree_agents.start(self.sweep.node if self.sweep is not None else None, self.switch_file())
        log.info("sim_started", nodes=c.n, mode=self.mode, base_dir=self.base_dir, interval=self.interval)
        self._poll_all([])

    def hellos(self) -> list[NodeHello]:
        """The hello each node's agent sends when it connects."""
        if self.mode == "memory":
            self.start()
            return self.memory.hellos() if self.memory is not None else []
        assert self.tree_agents is not None  # tree mode
        return self.tree_agents.hellos()

    # ------------------------------------------------------------------ stepping
    def step(self) -> StepStats:
        """Advance one interval: cluster + job, then render and poll (tree) or build batches (memory)."""
        if self._closed:
            raise RuntimeError("simulation closed")
        self.start()
        c = self.cluster
        t_new = c.t + self.interval
        st = StepStats(t=t_new)
        t0 = time.perf_counter()
        timings: list[RankTiming] = []
        self._heartbeats = {}
        if self.jobs is not None:
            eff = c.effects(t_new)
            timings = self.jobs.advance_to(t_new, eff)
            for hb in self.jobs.heartbeats(c.t, t_new):
                self._heartbeats.setdefault(hb.node, []).append(hb)
        t1 = time.perf_counter()
        rates = ((self.jobs.rail_bytes_per_second(t_new), self.jobs.nvlink_activity(t_new))
                 if self.jobs is not None else (None, None))
        if self.watch is not None:
            builder = self.memory.builder if self.memory is not None else None
            st.files_written += self.watch.between(t_new, rates, st.extra, self._deliver, builder=builder,
                                                   tree_agents=self.tree_agents, on_snapshot=self.on_snapshot,
                                                   on_tick=self.on_watch_tick)
        c.advance(t_new - c.t, *rates)
        t2 = time.perf_counter()
        st.job_s, st.advance_s = t1 - t0, t2 - t1
        st.rank_timings = len(timings)
        if self.mode == "memory":
            if self.memory is not None:  # made by start(), unless this is the state alone (nodes=[])
                st.batches = self.memory.emit(self._by_node(timings), self._heartbeats, self._deliver)
            st.batch_s = time.perf_counter() - t2
        else:
            agents = self.tree_agents
            assert agents is not None  # tree mode
            st.files_written = agents.render()
            self._write_sweep()
            t3 = time.perf_counter()
            st.render_s = t3 - t2
            agents.watch_pass()  # the watch's pass of this tick: what changed since is in this poll
            st.batches = self._poll_all(timings) if agents.agents else 0
            st.poll_s = time.perf_counter() - t3
        self.steps += 1
        if self.ras is not None:
            self.ras.pump()  # what each agent's stream does after its batch's ack
        if self.progress is not None:
            self.progress(st)
        return st

    def _by_node(self, timings: list[RankTiming]) -> dict[str, list[RankTiming]]:
        out: dict[str, list[RankTiming]] = defaultdict(list)
        for r in timings:
            out[r.node].append(r)
        return out

    def _deliver(self, batch: NodeBatch) -> None:
        if self.on_batch is None:
            if not self.steps:
                self._undelivered.append(batch)  # the initial poll: kept for a sink set after start()
            return
        if self._undelivered:
            pending, self._undelivered = self._undelivered, []
            for b in pending:
                self.on_batch(b)
        self.on_batch(batch)

    def _poll_all(self, timings: list[RankTiming]) -> int:
        by_node = self._by_node(timings)
        agents = self.tree_agents
        assert agents is not None  # tree mode
        snaps = agents.poll()
        for i, snap in enumerate(snaps):
            name = agents.name(i)
            ranks = by_node.get(name, [])
            if self.on_snapshot is not None:
                self.on_snapshot(name, snap, ranks)
            if self.on_batch is not None or not self.steps:
                hb = self._heartbeats.get(name)
                if self.rank_intake:
                    got, layouts, hbs = self._intake_feed.through(name, ranks, hb or [])
                    b = replace(agents.batch(i, snap, got), layouts=layouts, heartbeats=hbs)
                else:
                    b = agents.batch(i, snap, tuple(ranks))
                    if agents.first_batch(i) and self.layouts:
                        b = replace(b, layouts=self.layouts)
                    if hb:
                        b = replace(b, heartbeats=tuple(hb))
                self._deliver(b)
        return len(snaps)

    def run(self, until: float | None = None, *, speed: float | None = None, stop: threading.Event | None = None,
            deadline: float | None = None) -> int:
        """Step until simulated time ``until`` (default: the scenario's duration); returns the steps taken.

        ``speed``: simulated seconds per wall second (None or 0: as fast as possible).  ``deadline``:
        wall seconds after which the run stops early (logged).
        """
        end = self.scenario.duration if until is None else min(until, self.scenario.duration)
        wall0 = time.monotonic()
        sim0 = self.t
        steps = 0
        while self.t + self.interval <= end + 1e-9:
            if stop is not None and stop.is_set():
                break
            if deadline is not None and time.monotonic() - wall0 > deadline:
                log.warning("sim_deadline", t=self.t, deadline=deadline)
                break
            st = self.step()
            steps += 1
            if steps % 60 == 0:
                log.info("sim_progress", t=st.t, duration=self.scenario.duration, step_ms=round(st.total_s * 1e3, 1))
            if speed:
                due = wall0 + (self.t - sim0) / speed
                delay = due - time.monotonic()
                if delay > 0:
                    if stop is not None:
                        stop.wait(delay)
                    else:
                        time.sleep(delay)
        return steps

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.ras is not None:
            self.ras.close()
        if self.tree_agents is not None:
            self.tree_agents.close()
        if self._own_base and not self.keep_trees and self.base_dir and os.path.isdir(self.base_dir):
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> SimulatedCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ ground truth
    def ground_truth(self) -> list[dict]:
        return [g.to_dict() for g in self.scenario.ground_truth()]

    def jobs_truth(self) -> list[dict]:
        """Every job with its completed steps so far (the report's ``jobs``)."""
        return self.jobs.truth() if self.jobs is not None else []

    def decoys_truth(self) -> list[dict]:
        return [d.to_dict() for d in self.scenario.decoys]
