"""Wrap-, reset- and saturation-safe counter tracking.

Hardware counters come in three shapes (see ``model.Semantics``).  The tracker
keeps the last raw value of every series and turns raw readings into

* a monotonic total that never goes backwards (what Prometheus sees), and
* a per-poll delta (what the aggregator stream carries),

so a driver reload, a 32-bit wrap or a pinned 16-bit error counter never shows
up as a negative rate or a spike.

Reset versus wrap: a decrease of a WRAPPING counter is ambiguous on its own.
Readings of one device port share a ``group``; when any 64-bit MONOTONIC
counter of the group went backwards in the same poll the whole group was reset
(driver reload, firmware reset), and every decrease in it is a reset.
Otherwise a decrease of a wrapping counter is a wrap.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import CounterDelta, Labels, Reading, Sample, Semantics


@dataclass(slots=True)
class _State:
    raw: int
    total: int
    last_seen: float


def counter_delta(old: int, new: int, semantics: Semantics, width: int, group_reset: bool) -> tuple[int, bool]:
    """Return (delta, was_reset) for one counter going from ``old`` to ``new``.

    Never negative.  After a reset the counter restarted from zero, so it
    counted ``new`` since; a counter that did not go backwards gets the
    smallest consistent delta even in a reset group, so a false reset
    verdict can never produce a spike.  Pure: the property tests use it.
    """
    if new >= old:
        return new - old, False
    if semantics is Semantics.WRAPPING and not group_reset:
        return new + (1 << width) - old, False
    return new, True


def saturation_limit(width: int) -> int:
    return (1 << width) - 1


class CounterTracker:
    """Holds per-series state across polls.  Not thread-safe: one poller owns it."""

    def __init__(self, evict_after_seconds: float = 600.0) -> None:
        self._state: dict[tuple[str, Labels], _State] = {}
        self._evict_after = evict_after_seconds
        self._next_evict = float("-inf")
        self.resets_total = 0
        self.wraps_total = 0

    def __len__(self) -> int:
        return len(self._state)

    def process(
        self, readings: list[Reading], ts: float
    ) -> tuple[list[Sample], list[CounterDelta], list[Sample]]:
        """Turn raw readings into (samples, deltas, saturation samples).

        Gauges pass through.  Counters seen for the first time export their raw
        value and produce no delta (nothing is known about the time before).
        """
        state = self._state
        reset_groups = self._reset_groups(readings)
        samples: list[Sample] = []
        deltas: list[CounterDelta] = []
        saturation: list[Sample] = []
        for r in readings:
            sem = r.semantics
            scale = r.scale
            if sem is Semantics.GAUGE:
                samples.append(Sample(r.family, r.labels, r.value * scale if scale != 1.0 else r.value))
                continue
            raw = int(r.value)
            if sem is Semantics.WRAPPING:
                raw &= (1 << r.width) - 1
            key = (r.family, r.labels)
            st = state.get(key)
            saturated = sem is Semantics.SATURATING and raw >= saturation_limit(r.width)
            if st is None:
                st = _State(raw, raw, ts)
                state[key] = st
            else:
                group_reset = r.group in reset_groups if r.group else False
                if raw < st.raw:
                    delta, was_reset = counter_delta(st.raw, raw, sem, r.width, group_reset)
                    if was_reset:
                        self.resets_total += 1
                    else:
                        self.wraps_total += 1
                else:
                    delta, was_reset = raw - st.raw, False
                st.raw = raw
                st.total += delta
                st.last_seen = ts
                if delta or saturated or was_reset:
                    deltas.append(CounterDelta(r.family, r.labels, float(delta) * scale, saturated, was_reset))
            # Raw units are tracked as integers; the scale (e.g. microseconds to
            # seconds) applies to what is exported only.
            samples.append(Sample(r.family, r.labels, float(st.total) * scale))
            if sem is Semantics.SATURATING:
                saturation.append(Sample("fabricmon_ib_port_error_saturated", r.labels, 1.0 if saturated else 0.0))
        self._evict(ts)
        return samples, deltas, saturation

    def _reset_groups(self, readings: list[Reading]) -> set[str]:
        groups: set[str] = set()
        state = self._state
        for r in readings:
            if r.semantics is Semantics.MONOTONIC and r.group and r.group not in groups:
                st = state.get((r.family, r.labels))
                if st is not None and int(r.value) < st.raw:
                    groups.add(r.group)
        return groups

    def _evict(self, ts: float) -> None:
        # A device that vanished keeps its state for a while, so that a quick
        # re-probe continues its totals instead of restarting them.  Scanning
        # every series costs as much as a poll, so do it a few times per window.
        if ts < self._next_evict:
            return
        self._next_evict = ts + self._evict_after / 10
        limit = ts - self._evict_after
        stale = [k for k, st in self._state.items() if st.last_seen < limit]
        for k in stale:
            del self._state[k]
