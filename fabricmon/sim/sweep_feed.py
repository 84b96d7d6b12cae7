"""The simulated switch sweep as the sweeping node's agent streams it.

Every ``interval`` simulated seconds (the source's ``health_interval``: the real sweeper reads a switch's
counters at once when its AllPortSelect sums moved, so a fault shows within one) the simulator takes a
sweep (``SimSwitches.snapshot``).  Memory mode: the sweep's series, made by the source's own
``sweep_readings`` and turned into deltas by the agent's own ``CounterTracker``, join the sweeping
node's batch (one node's agent streams both its host series and the sweep).  Tree mode: the sweep is
written to the fake sweep file (``sources.ib_switches.backend: fake:FILE``), which that node's agent
reads.  Between sweeps the real source serves the same sweep again (zero deltas; only its age gauge
moves), which memory mode leaves out."""

from __future__ import annotations

import json
import math

import numpy as np

from ..atomic import atomic_write_text
from ..counters import CounterTracker
from ..model import CounterDelta, Reading, Sample, Semantics
from ..sources.ib_switches.backend_fake import fake_sweep_document
from ..sources.ib_switches.source import sweep_readings
from .inmemory import GaugeFilter
from .switches import SimSwitches

SWEEP_INTERVAL = 10.0  # sources.ib_switches.health_interval's default
MAD_SECONDS = 0.0004  # a port's counters and state, concurrency 4 (bench_ib_switch_sweep's scale)


class SweepFeed:
    def __init__(self, switches: SimSwitches, node: str, interval: float = SWEEP_INTERVAL, seed: int = 0) -> None:
        self.switches = switches
        self.node = node  # the node whose agent sweeps (auth.switch_sources lists it)
        self.interval = interval
        self._next = 0.0
        self._tracker = CounterTracker(evict_after_seconds=math.inf)
        self._filter = GaugeFilter()
        self._rng = np.random.default_rng([seed, 13])
        self.queries = {"ok": 0, "timeout": 0, "error": 0}
        self.sweeps = 0

    def due(self, t: float) -> bool:
        return t + 1e-9 >= self._next

    def take(self, t: float, ts: float):
        """The sweep at simulated time ``t`` (sample time ``ts``)."""
        self._next = (math.floor(t / self.interval + 1e-9) + 1) * self.interval
        ports = sum(len(s.cables) for s in self.switches._switches.values())
        seconds = round(ports * MAD_SECONDS * float(self._rng.uniform(0.9, 1.1)), 4)
        self.queries["ok"] += len(self.switches._switches) * 2 + ports
        self.sweeps += 1
        return self.switches.snapshot(ts, seconds)

    def series(self, t: float, ts: float) -> tuple[list[CounterDelta], list[Sample]]:
        """(deltas, gauges) the sweeping node's batch gains from a sweep at ``t``."""
        snap = self.take(t, ts)
        readings = sweep_readings(snap, ts)
        readings.extend(Reading("fabricmon_switch_queries_total", (("result", r),), n, Semantics.MONOTONIC, 64)
                        for r, n in self.queries.items())
        samples, deltas, saturation = self._tracker.process(readings, ts)
        return deltas, self._filter(samples + saturation)

    def write(self, t: float, ts: float, path: str) -> None:
        """Tree mode: the sweep at ``t`` as the fake sweep file (atomically: the agent never reads half)."""
        snap = self.take(t, ts)
        atomic_write_text(path, json.dumps(fake_sweep_document(snap, self.queries), separators=(",", ":")))
