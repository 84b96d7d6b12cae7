"""The data every source produces and the poller hands to exporters and the stream.

A source returns a ``SourceResult`` full of ``Reading``s.  The poller turns raw
counter readings into monotonic totals (see ``counters.py``) and freezes the
result into a ``Snapshot``; scrapes and the gRPC stream only ever read
snapshots, never hardware.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


class Semantics(enum.Enum):
    """How a raw counter value behaves at the end of its range."""

    GAUGE = "gauge"  # not a counter: exported as read
    MONOTONIC = "monotonic"  # 64-bit: a decrease is a reset (driver reload)
    WRAPPING = "wrapping"  # narrow hardware register that rolls over at 2^width
    SATURATING = "saturating"  # IBTA PMA error counter: pins at 2^width - 1


@dataclass(frozen=True, slots=True)
class Reading:
    """One raw value of one series, as read from hardware.

    ``family`` names a spec in ``metrics.SPECS``; ``labels`` are the spec's
    labels (without ``node``, which the exporter adds) in spec order.
    ``group`` ties the counters of one device port together so that a reset of
    the whole device (driver reload) is recognised as one event.
    ``scale`` converts the raw value to the exported base unit (1e-6 for a
    counter of microseconds): counters are tracked on the integer raw value,
    so wrap and reset logic stay exact, and the scale is applied to the
    exported total and delta only.
    """

    family: str
    labels: Labels
    value: float
    semantics: Semantics = Semantics.GAUGE
    width: int = 64
    group: str = ""
    scale: float = 1.0


def reading(
    family: str,
    value: float,
    *,
    semantics: Semantics = Semantics.GAUGE,
    width: int = 64,
    group: str = "",
    scale: float = 1.0,
    **labels: str,
) -> Reading:
    """Build a Reading; labels are given by keyword in spec order."""
    return Reading(family, tuple(labels.items()), value, semantics, width, group, scale)


@dataclass(slots=True)
class SourceResult:
    """What one poll of one source produced.

    ``up`` is False only when the whole source failed (e.g. NVML not loadable);
    a single bad file or device is an ``errors`` increment plus a message, and
    the rest of the readings still count.
    """

    source: str
    readings: list[Reading] = field(default_factory=list)
    errors: int = 0
    messages: list[str] = field(default_factory=list)
    up: bool = True
    present: bool = True  # False: the hardware is simply not there (no GPU), not an error
    facts: dict = field(default_factory=dict)  # non-metric facts (topology, netdev map) for later stages

    def error(self, message: str) -> None:
        self.errors += 1
        self.messages.append(message)


@dataclass(frozen=True, slots=True)
class Sample:
    """A processed value ready for export: counters are already monotonic."""

    family: str
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class CounterDelta:
    """How much a counter series advanced since the previous poll."""

    family: str
    labels: Labels
    delta: float
    saturated: bool = False
    reset: bool = False


@dataclass(frozen=True, slots=True)
class SourceStatus:
    source: str
    up: bool
    present: bool
    duration_seconds: float
    errors_total: int
    last_messages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """Everything one poll saw, immutable once built."""

    node: str
    ts: float  # sample time (node clock, or simulated clock)
    seq: int
    samples: tuple[Sample, ...]
    deltas: tuple[CounterDelta, ...]
    interval_seconds: float  # sample time since the previous snapshot (0 on the first)
    sources: tuple[SourceStatus, ...]
    facts: dict = field(default_factory=dict)
