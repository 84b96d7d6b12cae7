"""Runs every source under its own deadline and freezes the result into a Snapshot.

A scrape never touches hardware: exporters and the stream read the latest
Snapshot only.  A source that overruns its deadline is marked down for that
poll and is not started again until its stuck call returns, so a hung NVML
call costs one worker thread, never the poll loop.  Each source polls on a
daemon thread of its own (guarded_io.KeyedWorkers) that nothing joins: a
``concurrent.futures`` pool is joined at interpreter exit, so one read stuck in
a driver kept the agent from exiting on SIGTERM.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from ..counters import CounterTracker
from ..model import Reading, Semantics, Snapshot, SourceResult, SourceStatus
from ..sources.base import Source
from ..sources.guarded_io import KeyedWorkers, Stuck
from ..sources.inventory import Inventory

log = structlog.get_logger("fabricmon.poller")


class OffCadenceGate:
    """At most one off-cadence poll between two regular polls.

    A link watch asks for a poll when a link changes; a link that flaps must not turn the agent
    into a poller at the watch's rate.  With this gate the agent polls at most twice per configured
    interval, however often its links change: a change the gate holds back is in the next regular
    poll, at most one interval later."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open = True

    def regular(self) -> None:
        """A regular poll ran: it saw every change so far, and one off-cadence poll is allowed again."""
        self._open = True

    def take(self) -> bool:
        """Whether an off-cadence poll may run now (and, if so, the allowance is used)."""
        if not self._open:
            return False
        self._open = False
        return True


# How often a wait between polls looks at the stop event when nobody sets the wake event.
_STOP_CHECK_S = 1.0


def until_aligned(wall: float, interval: float) -> float:
    """Seconds from wall-clock time ``wall`` to the next multiple of ``interval`` (Unix time) that is at
    least a quarter of an interval away: the wait before an aligned poll.

    Why align: agents that poll at the same instants send their batches to the aggregator together, and
    there one wake-up serves many messages; agents polling at the phases their start times gave them
    send spread over the interval, each message a wake-up of its own.  At 256 nodes the aggregator used
    40-110 % more CPU with spread sends than with aligned ones, the same batches (bench_soak --spread,
    docs/benchmarks.md).  Every node's samples then also describe the same moment (to within the
    clocks' skew, milliseconds under NTP).  The quarter keeps the first poll after a start (at any
    phase) from running right after it."""
    wait = interval - wall % interval  # %, not fmod: a clock set before 1970 still gets the next multiple
    if wait < interval / 4:
        wait += interval
    return wait


@dataclass
class _SourceState:
    source: Source
    errors_total: int = 0
    inflight: cf.Future | None = None
    last_error: str = ""


class Poller:
    def __init__(
        self,
        node: str,
        sources: list[Source],
        discover: Callable[[], Inventory],
        clock: Callable[[], float] = time.time,
        tracker: CounterTracker | None = None,
        inline_all: bool = False,
    ) -> None:
        # inline_all: run every source in the poll thread, without deadlines.  Only for trees that
        # cannot block (the simulator's files on tmpfs), where the thread handoffs are pure cost.
        self.inline_all = inline_all
        self.node = node
        self._states = [_SourceState(s) for s in sources]
        self._discover = discover
        self._clock = clock
        self._tracker = tracker or CounterTracker()
        self._workers = KeyedWorkers("source")  # keyed by source name: one outstanding poll per source
        self._latest: Snapshot | None = None
        self._seq = 0
        self._last_ts: float | None = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self.inventory: Inventory | None = None
        self.gate = OffCadenceGate()
        self._wake = threading.Event()
        self.off_cadence_polls_total = 0  # polls run off the cadence at request (link watch)
        self.off_cadence_held_total = 0  # requests the gate held back (the next regular poll serves them)

    @property
    def source_names(self) -> list[str]:
        return [st.source.name for st in self._states]

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    def swap_sources(self, old: list[Source], new: list[Source], discover: Callable[[], Inventory]) -> None:
        """Replace the sources in ``old`` by ``new`` between two polls (a config reload); the others
        (rank intake, NCCL tail) keep their state, and counter tracking carries on across the swap."""
        with self._lock:
            gone = {id(s) for s in old}
            self._states = [st for st in self._states if id(st.source) not in gone] + [_SourceState(s) for s in new]
            self._discover = discover
            self._workers.retire(st.source.name for st in self._states)

    def add_listener(self, fn: Callable[[Snapshot], None]) -> None:
        """Called with every new snapshot, in the poll thread: keep it quick."""
        self._listeners.append(fn)

    def poll_once(self) -> Snapshot:
        with self._lock:
            ts = self._clock()
            inv_errors = 0
            try:
                inventory = self._discover()
            except Exception as exc:  # discovery must not stop the other sources
                log.warning("discovery_failed", error=str(exc))
                inventory = Inventory(sysfs_root="")
                inv_errors = 1
            self.inventory = inventory
            results = self._run_sources(inventory)
            readings: list[Reading] = []
            statuses: list[SourceStatus] = []
            facts: dict = {"inventory": inventory}
            for st, (result, duration) in zip(self._states, results, strict=True):
                st.errors_total += result.errors
                if result.messages:
                    st.last_error = result.messages[-1]
                readings.extend(result.readings)
                facts.update(result.facts)
                statuses.append(SourceStatus(
                    st.source.name, result.up, result.present, duration, st.errors_total,
                    tuple(result.messages[-5:]), tuple(result.stuck),
                ))
            if inv_errors:
                statuses.append(SourceStatus("discovery", False, True, 0.0, inv_errors))
            try:
                samples, deltas, saturation = self._tracker.process(readings, ts)
            except (OverflowError, ValueError, TypeError) as exc:  # one source's impossible value
                readings, statuses = self._drop_unusable(readings, results, statuses, exc)
                samples, deltas, saturation = self._tracker.process(readings, ts)
            interval = 0.0 if self._last_ts is None else ts - self._last_ts
            self._last_ts = ts
            self._seq += 1
            snap = Snapshot(
                node=self.node, ts=ts, seq=self._seq,
                samples=tuple(samples + saturation), deltas=tuple(deltas),
                interval_seconds=interval, sources=tuple(statuses), facts=facts,
            )
            self._latest = snap
        for fn in self._listeners:
            try:
                fn(snap)
            except Exception as exc:  # a listener bug must not stop polling
                log.error("snapshot_listener_failed", error=str(exc))
        return snap

    def _drop_unusable(self, readings, results, statuses, exc):
        """Drop readings the tracker cannot take (an infinite counter, an int past any double), counted as
        errors of their source, so one source's bad value never fails the poll of every source.  Only runs
        after the tracker raised: the normal poll pays nothing for it.  The readings the failed pass had
        already taken keep their totals; only their deltas of this one poll are lost."""
        def usable(r: Reading) -> bool:
            try:
                v = float(r.value)
            except (OverflowError, TypeError, ValueError):
                return False
            return r.semantics is Semantics.GAUGE or math.isfinite(v)

        statuses = list(statuses)
        for i, (st, (result, _)) in enumerate(zip(self._states, results, strict=True)):
            bad = sum(1 for r in result.readings if not usable(r))
            if bad:
                st.errors_total += bad
                st.last_error = f"{st.source.name}: {bad} readings with unusable values dropped"
                statuses[i] = replace(statuses[i], up=False, errors_total=st.errors_total,
                                      last_messages=(*statuses[i].last_messages[-4:], st.last_error))
        log.error("readings_dropped", error=f"{type(exc).__name__}: {exc}")
        return [r for r in readings if usable(r)], statuses

    def _run_sources(self, inventory: Inventory) -> list[tuple[SourceResult, float]]:
        """Poll every source; each result comes back within its source's deadline.

        Sysfs, ethtool and netlink reads can block in the kernel (a
        firmware-stuck HCA), so those sources run on the pool and are waited
        for with a timeout.  A source whose ``poll`` bounds its own blocking
        (``self_bounded = True``: NvmlSource makes every NVML call on its own
        thread and waits at most its call deadline) runs inline in the poll
        thread instead, while the pool works: that saves two thread handoffs
        per poll and keeps the same deadline semantics.
        """
        started: list[tuple[_SourceState, cf.Future | None, float]] = []
        inline: list[_SourceState] = []
        for st in self._states:
            if self.inline_all or getattr(st.source, "self_bounded", False):
                inline.append(st)
                started.append((st, None, -1.0))
                continue
            if st.inflight is not None and not st.inflight.done():
                started.append((st, None, 0.0))  # still stuck from an earlier poll
                continue
            try:
                submitted = self._workers.submit(st.source.name, self._timed_poll, st.source, inventory)
            except Stuck:  # a source of the same name, replaced by a reload, still blocked
                started.append((st, None, 0.0))
                continue
            started.append((st, submitted, time.monotonic()))
        inline_out: dict[int, tuple[SourceResult, float]] = {}
        for st in inline:
            t0 = time.perf_counter()
            try:
                res = st.source.poll(inventory)
            except Exception as exc:
                res = SourceResult(st.source.name, up=False)
                res.error(f"{st.source.name}: {type(exc).__name__}: {exc}")
                log.error("source_failed", collector=st.source.name, error=str(exc))
            inline_out[id(st)] = (res, time.perf_counter() - t0)
        out: list[tuple[SourceResult, float]] = []
        for st, fut, t0 in started:
            name = st.source.name
            if fut is None:
                if t0 < 0:
                    out.append(inline_out[id(st)])
                    continue
                res = SourceResult(name, up=False, stuck=[name])
                res.error(f"{name}: previous poll still running")
                out.append((res, 0.0))
                continue
            remaining = max(0.0, st.source.timeout - (time.monotonic() - t0))
            try:
                res, duration = fut.result(timeout=remaining)
                st.inflight = None
            except cf.TimeoutError:
                st.inflight = fut
                res = SourceResult(name, up=False, stuck=[name])
                res.error(f"{name}: poll exceeded its {st.source.timeout:.2f}s deadline")
                log.warning("source_timeout", collector=name, timeout=st.source.timeout)
                duration = time.monotonic() - t0
            except Exception as exc:
                st.inflight = None
                res = SourceResult(name, up=False)
                res.error(f"{name}: {type(exc).__name__}: {exc}")
                log.error("source_failed", collector=name, error=str(exc))
                duration = time.monotonic() - t0
            out.append((res, duration))
        return out

    @staticmethod
    def _timed_poll(source: Source, inventory: Inventory) -> tuple[SourceResult, float]:
        t0 = time.perf_counter()
        res = source.poll(inventory)
        return res, time.perf_counter() - t0

    def request_poll(self) -> None:
        """Ask ``run`` for one poll now, off its cadence (a link changed state).  Returns at once."""
        self._wake.set()

    def wake(self) -> None:
        """Wake ``run`` so it sees its stop event at once (it also looks every second by itself)."""
        self._wake.set()

    def poll_off_cadence(self) -> Snapshot | None:
        """One requested poll, if the gate allows one now; None when it held the request back."""
        if not self.gate.take():
            self.off_cadence_held_total += 1
            return None
        try:
            return self.poll_once()
        finally:  # counted once its snapshot is the latest
            self.off_cadence_polls_total += 1

    def poll_regular(self) -> Snapshot:
        """A poll of the cadence: it serves any request pending now and opens the gate again."""
        self._wake.clear()
        try:
            return self.poll_once()
        finally:
            self.gate.regular()

    def run(self, stop: threading.Event, interval: float, align: bool = True) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set, on a fixed cadence; between two regular
        polls, at most one more when ``request_poll`` asks (``OffCadenceGate``).  An off-cadence poll
        does not move the cadence: the next regular poll is still due when it was.

        The first poll runs at once.  With ``align`` the regular polls after it fall on the multiples
        of ``interval`` of the wall clock (``until_aligned``), every node of a cluster at the same
        instants; without, every ``interval`` from the start.  Either way a poll that overran skips
        the polls it missed rather than running them in a burst."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.poll_regular()
            except Exception as exc:  # never let the loop die
                log.error("poll_failed", error=str(exc))
            if align:
                # the wall clock is read for the phase only; the wait itself runs on the monotonic clock
                next_at = time.monotonic() + until_aligned(self._clock(), interval)
            else:
                next_at += interval
                if next_at < time.monotonic():  # fell behind: skip, do not burst
                    next_at = time.monotonic()
            while not stop.is_set():
                delay = next_at - time.monotonic()
                if delay <= 0:
                    break
                if not self._wake.wait(min(delay, _STOP_CHECK_S)):
                    continue
                self._wake.clear()
                if stop.is_set():
                    break
                try:
                    self.poll_off_cadence()
                except Exception as exc:
                    log.error("poll_failed", error=str(exc), off_cadence=True)

    def close(self) -> None:
        for st in self._states:
            try:
                st.source.close()
            except Exception as exc:
                log.warning("source_close_failed", collector=st.source.name, error=str(exc))
        self._workers.close()  # never waits: a worker blocked in a driver ends with the process
