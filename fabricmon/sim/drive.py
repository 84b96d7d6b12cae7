"""The drive harness: a simulated cluster into an aggregator, one interval at a time.

One loop for the demo, the benchmarks and the tests: the simulator (``SimulatedCluster``, or the
demo's ``ParallelTreeCluster`` or ``ParallelMemoryCluster``, whose worker sends the agents' bytes to the
wire's server end) steps one agent interval, its batches reach the engine (directly, or
with ``wire=True`` as bytes through the stream codec: ``proto.loopback.CodecWire``, the agent's encoder and
the server's decoder and seq rule), and the aggregator ticks at the simulated clock: the
``AggregatorRuntime`` (sender, HTTP, tick errors counted) or a bare ``Engine``.  ``Pace`` holds the
steps to a wall clock; without one the simulator runs as fast as it can.

    drive = Drive(sim, runtime, wire=True)
    drive.connect()
    drive.run(pace=Pace(speed=10.0), on_step=show)   # until the scenario's end

Every loop is bounded: by the scenario's duration, an optional simulated ``until``, a ``stop``
event and a wall-clock ``deadline``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..proto.loopback import CodecWire
from .parallel_memory import ParallelMemoryCluster

if TYPE_CHECKING:
    from ..aggregator.engine import Engine
    from ..aggregator.incidents import Incident
    from ..aggregator.runtime import AggregatorRuntime
    from .runner import ClusterSim, StepStats


@dataclass
class Pace:
    """Hold each step until ``clock() >= origin + (t_next - lead) / speed`` (``t_next``: the simulated
    time the step reaches).  The demo: ``Pace(speed)`` (its origin is the first step, which runs at
    once); a live fabric in real time: ``Pace(1.0, origin=epoch, clock=time.time, lead=0)``, sample
    time ``epoch + t`` reached at wall time ``epoch + t``."""

    speed: float
    origin: float | None = None
    clock: Callable[[], float] = time.monotonic
    lead: float | None = None  # default: one interval (the first step is due at the origin)

    def wait(self, sim: ClusterSim, stop: threading.Event | None) -> bool:
        """Sleep until the next step is due; False when ``stop`` was set meanwhile."""
        lead = sim.interval if self.lead is None else self.lead
        offset = (sim.t + sim.interval - lead) / self.speed
        if self.origin is None:
            self.origin = self.clock() - offset  # no origin given: the first step is due now
        delay = self.origin + offset - self.clock()
        if delay > 0:
            if stop is not None:
                return not stop.wait(delay)
            time.sleep(delay)
        return stop is None or not stop.is_set()


class Drive:
    """``sim`` into ``runtime`` (or a bare ``engine``), optionally over the codec wire.  Neither: the
    simulator alone, paced (its agents scraped by a Prometheus, say)."""

    def __init__(self, sim: ClusterSim, runtime: AggregatorRuntime | None = None, *, engine: Engine | None = None,
                 wire: bool = False) -> None:
        if runtime is not None and engine is not None:
            raise ValueError("give the aggregator as runtime or as engine, not both")
        self.sim = sim
        self.runtime = runtime
        self.engine: Engine | None = runtime.engine if runtime is not None else engine
        if wire and self.engine is None:
            raise ValueError("wire=True needs an aggregator to deliver to")
        self.wire = CodecWire(self.engine.hello, self.engine.ingest, self.engine.read_delta_families) \
            if wire and self.engine is not None else None
        self.steps = 0
        self.last: StepStats | None = None
        self._between: list[Incident] = []  # what the ticks after off-cadence batches changed, until step() returns

    def connect(self) -> None:
        """Start the simulator and connect every node: its hello, then its batches as they come."""
        self.sim.start()
        engine = self.engine
        if engine is None:
            return
        # the node that sweeps the simulated switches is the aggregator's switch source (auth.switch_sources)
        engine.switch_side.sources = engine.switch_side.sources | frozenset(getattr(self.sim, "switch_sources", ()))
        if isinstance(self.sim, ParallelMemoryCluster):
            # the agents' end of the wire runs in the simulator's worker (sim/parallel_memory.py):
            # its bytes go to the server's end here
            if self.wire is None:
                raise ValueError("a simulator that sends bytes needs wire=True")
            for data in self.sim.hello_messages():
                self.wire.server.hello(data)
            self.sim.on_message = self.wire.server.batch
        else:
            for h in self.sim.hellos():
                if self.wire is not None:
                    self.wire.connect(h)
                else:
                    engine.hello(h)
            self.sim.on_batch = self.wire.deliver if self.wire is not None else engine.ingest
        # an agent's link watch sends a batch between polls: the real aggregator ticks every 0.25 s,
        # so it is judged at its own sample time, not at the next regular poll
        self.sim.on_watch_tick = self._watch_tick

    def _watch_tick(self, now: float) -> None:
        self._between.extend(self.tick(now))

    def tick(self, now: float) -> list[Incident]:
        if self.runtime is not None:
            return self.runtime.tick(now)
        return self.engine.tick(now) if self.engine is not None else []

    def step(self) -> list[Incident]:
        """One interval: the simulator steps, its batches are ingested, the aggregator ticks at its clock;
        the incidents that changed."""
        self.last = self.sim.step()
        self.steps += 1
        changed = self.tick(self.sim.now())
        if self._between:
            changed, self._between = self._between + changed, []
        return changed

    def run(self, until: float | None = None, *, pace: Pace | None = None,
            on_step: Callable[[StepStats, list[Incident]], None] | None = None,
            stop: threading.Event | None = None, deadline: float | None = None) -> int:
        """Step to simulated ``until`` (default, and at most, the scenario's duration); the steps taken.
        ``on_step(stats, changed)`` after each tick; ``deadline``: wall seconds from now."""
        duration = self.sim.scenario.duration
        end = duration if until is None else min(until, duration)
        give_up = None if deadline is None else time.monotonic() + deadline
        taken = 0
        while self.sim.t + self.sim.interval <= end + 1e-9:
            if stop is not None and stop.is_set():
                break
            if give_up is not None and time.monotonic() > give_up:
                break
            if pace is not None and not pace.wait(self.sim, stop):
                break
            changed = self.step()
            taken += 1
            if on_step is not None:
                assert self.last is not None
                on_step(self.last, changed)
        return taken
