"""The data every source produces and the poller hands to exporters and the stream.

A source returns a ``SourceResult`` full of ``Reading``s.  The poller turns raw
counter readings into monotonic totals (see ``counters.py``) and freezes the
result into a ``Snapshot``; scrapes and the gRPC stream only ever read
snapshots, never hardware.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

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


class ReadingMemo:
    """Hands a source back the very same ``Reading`` for a series whose value did not change.

    Building a frozen dataclass costs more than reading a sysfs file, and the
    counter tracker recognises a Reading it saw last poll by identity (nothing
    to unwrap, the previous Sample is reused), so a source that polls the same
    series every interval keeps one memo and brackets each poll with
    ``begin()`` / ``commit()``.  Series not produced by the last committed
    poll are forgotten, so the memo is bounded by one poll's series.

    The key is ``(family, labels)``; semantics, width, group and scale must be
    a function of the series (they are for every source).  Not thread-safe:
    one source poll at a time, as the poller guarantees.
    """

    __slots__ = ("_prev", "_cur")

    def __init__(self) -> None:
        self._prev: dict[tuple[str, Labels], Reading] = {}
        self._cur: dict[tuple[str, Labels], Reading] = {}

    def begin(self) -> None:
        self._cur = {}

    def commit(self) -> None:
        self._prev, self._cur = self._cur, {}

    def get(
        self, family: str, labels: Labels, value: float, semantics: Semantics = Semantics.GAUGE,
        width: int = 64, group: str = "", scale: float = 1.0,
    ) -> Reading:
        key = (family, labels)
        r = self._prev.get(key)
        # ``is`` on the type too: 1 == 1.0, but a Reading keeps the type it was read with.
        if r is None or r.value != value or type(r.value) is not type(value):
            r = Reading(family, labels, value, semantics, width, group, scale)
        self._cur[key] = r
        return r


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
    stuck: list[str] = field(default_factory=list)  # devices whose read blocked past its deadline
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
    stuck: tuple[str, ...] = ()  # what blocks past its deadline: the source itself, or its devices


def _fast_frozen_init(cls: Any) -> None:  # a dataclass, rewritten through attributes no type declares
    """Replace a frozen slots dataclass's generated ``__init__`` with one that
    stores through the slot descriptors directly.

    The generated one calls ``object.__setattr__`` per field (frozen classes
    block plain assignment) and costs about twice as much; millions of these
    are built per hour per node.  Same signature, defaults, and the instances
    stay frozen, hashable and equal exactly as before.
    """
    import inspect

    names = [f for f in cls.__dataclass_fields__]
    sig = inspect.signature(cls.__init__)
    params = []
    for p in list(sig.parameters.values())[1:]:
        params.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}=_d_{p.name}")
    ns: dict = {f"_s_{n}": getattr(cls, n).__set__ for n in names}
    ns.update({f"_d_{p.name}": p.default for p in sig.parameters.values() if p.default is not inspect.Parameter.empty})
    body = "\n".join(f"    _s_{n}(self, {n})" for n in names)
    src = f"def __init__(self, {', '.join(params)}):\n{body}\n"
    # Bind the setters and defaults as closure-free globals of the new function.
    exec(src, ns)  # generated from the dataclass's own field names
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init


for _cls in (Reading, Sample, CounterDelta):
    _fast_frozen_init(_cls)
del _cls


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
