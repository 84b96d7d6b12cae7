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

from .model import CounterDelta, Labels, Reading, Sample, Semantics


class _State:
    """Per-series state.  ``reading`` is the last Reading processed for the
    series: when a source hands the same (immutable) object back next poll,
    nothing about the series changed and the cached ``sample`` (plus, for a
    saturating counter, ``sat_sample`` and ``sat_delta``) is reused as is."""

    __slots__ = ("raw", "total", "last_seen", "reading", "sample", "sat_sample", "sat_delta")

    def __init__(self, raw: int, total: int, last_seen: float) -> None:
        self.raw = raw
        self.total = total
        self.last_seen = last_seen
        self.reading: Reading | None = None
        self.sample: Sample | None = None
        self.sat_sample: Sample | None = None
        self.sat_delta: CounterDelta | None = None


class _Gauge:
    __slots__ = ("reading", "sample")

    def __init__(self, reading: Reading, sample: Sample) -> None:
        self.reading = reading
        self.sample = sample


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


_GAUGE = Semantics.GAUGE
_MONOTONIC = Semantics.MONOTONIC
_WRAPPING = Semantics.WRAPPING
_SATURATING = Semantics.SATURATING
_SATURATED_FAMILY = "fabricmon_ib_port_error_saturated"
# Families whose saturation flag has its own family (same labels): the switch side's.
_SATURATED_FAMILIES = {"fabricmon_switch_port_errors_total": "fabricmon_switch_port_error_saturated"}


class CounterTracker:
    """Holds per-series state across polls.  Not thread-safe: one poller owns it."""

    def __init__(self, evict_after_seconds: float = 600.0) -> None:
        self._state: dict[tuple[str, Labels], _State] = {}
        # id(Reading) -> its state (counters) or cached Sample (gauges), for the
        # Readings of the last poll only; every entry keeps its Reading alive,
        # so an id cannot be reused while it is a key here.
        self._ident: dict[int, _State | _Gauge] = {}
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

        Cost: this runs over every reading of every poll (~2,000 on an 8-GPU,
        9-NIC node), so it is one flat loop.  A Reading object seen last poll
        (sources hand back the same object while a value does not change, see
        ``model.ReadingMemo``) costs a dict lookup and reuses the previous
        Sample.  Reset groups are folded into the same pass: a 64-bit MONOTONIC
        decrease marks its group as it is met, and the readings after an
        ambiguous decrease of a WRAPPING counter (rare: a wrap or a reload) are
        scanned once for the same evidence, so the verdict is the one a full
        pre-pass would give.
        """
        state = self._state
        prev_ident = self._ident
        ident: dict[int, _State | _Gauge] = {}
        reset_groups: set[str] = set()
        scanned = False
        samples: list[Sample] = []
        deltas: list[CounterDelta] = []
        saturation: list[Sample] = []
        add_sample = samples.append
        add_delta = deltas.append
        add_sat = saturation.append
        GAUGE, MONOTONIC, WRAPPING, SATURATING = _GAUGE, _MONOTONIC, _WRAPPING, _SATURATING
        SAT_FAMILY = _SATURATED_FAMILY
        for r in readings:
            rid = id(r)
            hit = prev_ident.get(rid)
            if hit is not None and hit.reading is r:
                # Same object as last poll: same value, nothing to unwrap.
                ident[rid] = hit
                add_sample(hit.sample)  # type: ignore[arg-type]  # set when hit was last processed
                if type(hit) is _State:
                    hit.last_seen = ts
                    if hit.sat_sample is not None:
                        add_sat(hit.sat_sample)
                        if hit.sat_delta is not None:
                            add_delta(hit.sat_delta)  # pinned: reported every poll, as before
                continue
            sem = r.semantics
            scale = r.scale
            if sem is GAUGE:
                smp = Sample(r.family, r.labels, r.value * scale if scale != 1.0 else r.value)
                ident[rid] = _Gauge(r, smp)
                add_sample(smp)
                continue
            raw = int(r.value)
            if sem is WRAPPING:
                raw &= (1 << r.width) - 1
            family = r.family
            labels = r.labels
            key = (family, labels)
            st = state.get(key)
            saturated = sem is SATURATING and raw >= (1 << r.width) - 1
            delta = 0
            was_reset = False
            if st is None:
                st = state[key] = _State(raw, raw, ts)
                total = raw
            else:
                old = st.raw
                if raw >= old:
                    delta = raw - old
                else:
                    group = r.group
                    if sem is MONOTONIC:
                        if group:
                            reset_groups.add(group)
                        delta, was_reset = raw, True
                    elif sem is WRAPPING:
                        if group and group not in reset_groups and not scanned:
                            reset_groups |= self._monotonic_decreases(readings, r)
                            scanned = True
                        delta, was_reset = counter_delta(old, raw, sem, r.width,
                                                         bool(group) and group in reset_groups)
                    else:
                        delta, was_reset = raw, True
                    if was_reset:
                        self.resets_total += 1
                    else:
                        self.wraps_total += 1
                st.raw = raw
                total = st.total = st.total + delta
                st.last_seen = ts
                if delta or saturated or was_reset:
                    add_delta(CounterDelta(family, labels, float(delta) * scale, saturated, was_reset))
            # Raw units are tracked as integers; the scale (e.g. microseconds to
            # seconds) applies to what is exported only.
            value = float(total) * scale
            last = st.sample
            if last is None or last.value != value:
                last = st.sample = Sample(family, labels, value)
            add_sample(last)
            st.reading = r
            ident[rid] = st
            if sem is SATURATING:
                sat = st.sat_sample
                flag = 1.0 if saturated else 0.0
                if sat is None or sat.value != flag:
                    sat = st.sat_sample = Sample(_SATURATED_FAMILIES.get(family, SAT_FAMILY), labels, flag)
                add_sat(sat)
                # Cached for the identity path: a pinned counter reports a zero
                # delta flagged saturated at every poll.
                st.sat_delta = CounterDelta(family, labels, 0.0, True, False) if saturated else None
            else:
                st.sat_sample = None
                st.sat_delta = None
        self._ident = ident
        self._evict(ts)
        return samples, deltas, saturation

    def _monotonic_decreases(self, readings: list[Reading], after: Reading) -> set[str]:
        """Groups with a 64-bit MONOTONIC counter going backwards among the readings after ``after``
        (those before it were checked by the main loop as it went)."""
        try:
            start = next(i for i, x in enumerate(readings) if x is after) + 1
        except StopIteration:
            start = 0
        return self._reset_groups(readings[start:])

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
