"""What an agent tells the aggregator: a hello per connection, then one batch per poll.

These are the in-process forms; ``proto/`` defines the wire form and
``agent/stream_batches.py`` / ``aggregator/server.py`` convert.  The simulator's
in-memory mode builds the same objects, so the aggregator code path is the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .model import CounterDelta, Labels, Sample, _fast_frozen_init
from .rank_timing import Heartbeat, JobLayout, RankTiming


class DeltaColumns(Sequence[CounterDelta]):
    """A batch's counter deltas held as columns: each delta's (family, labels), value and flags.

    The simulator's in-memory agents make about 400 deltas per node per interval (1.6 million an
    interval at 4,096 nodes) that only the stream encoder reads, and it reads the columns
    (``proto.codec.SeriesEncoder``), so no ``CounterDelta`` is made for them.  Read any other way
    (iterated, indexed, compared, added to, pickled) it is the tuple of ``CounterDelta`` these
    columns describe, made once on first use: equal to, and hashing as, that tuple.
    """

    __slots__ = ("keys", "values", "saturated", "reset", "_built")

    def __init__(self, keys: list[tuple[str, Labels]], values: list[float], saturated: list[bool],
                 reset: list[bool]) -> None:
        if not len(keys) == len(values) == len(saturated) == len(reset):
            raise ValueError("delta columns of different lengths")
        self.keys = keys
        self.values = values
        self.saturated = saturated
        self.reset = reset
        self._built: tuple[CounterDelta, ...] | None = None

    def as_tuple(self) -> tuple[CounterDelta, ...]:
        built = self._built
        if built is None:
            built = self._built = tuple([CounterDelta(k[0], k[1], v, s, r) for k, v, s, r in
                                         zip(self.keys, self.values, self.saturated, self.reset, strict=True)])
        return built

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: Any) -> Any:
        return self.as_tuple()[i]

    def __iter__(self) -> Iterator[CounterDelta]:
        return iter(self.as_tuple())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeltaColumns):
            other = other.as_tuple()
        return self.as_tuple() == other if isinstance(other, tuple) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __add__(self, other: Any) -> tuple[CounterDelta, ...]:
        return self.as_tuple() + tuple(other)

    def __radd__(self, other: Any) -> tuple[CounterDelta, ...]:
        return tuple(other) + self.as_tuple()

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __reduce__(self) -> tuple[Any, ...]:
        return tuple, (self.as_tuple(),)


@dataclass(frozen=True, slots=True)
class NicHello:
    device: str
    port: str
    rail: str  # "" for a NIC on no rail
    link_layer: str
    netdev: str
    rate_gbps: float
    width: int
    gpu: int = -1  # nearest GPU, -1 unknown
    node_guid: str = ""  # the device's node GUID (sysfs spelling), "" unknown


@dataclass(frozen=True, slots=True)
class NodeHello:
    node: str
    agent_version: str
    interval_seconds: float
    nics: tuple[NicHello, ...] = ()
    gpus: int = 0
    boot_id: str = ""  # a new boot id means the node restarted: counters begin again
    boot_time: float = 0.0  # when the node booted (Unix seconds); 0 unknown: the start-up hold runs from the hello


@dataclass(frozen=True, slots=True)
class NodeBatch:
    node: str
    seq: int  # the agent's snapshot sequence number; the aggregator drops duplicates on replay
    ts: float  # sample time of the snapshot
    interval_seconds: float
    deltas: tuple[CounterDelta, ...] = ()
    gauges: tuple[Sample, ...] = ()  # gauges that changed (all of them in the first batch of a connection)
    ranks: tuple[RankTiming, ...] = ()
    layouts: tuple[JobLayout, ...] = ()
    # counter deltas that came in but were not built into ``deltas`` because the consumer reads
    # no series of their family (the aggregator's stream decoder); counted, never evidence
    unread_deltas: int = 0
    heartbeats: tuple[Heartbeat, ...] = ()


# One batch per node per interval, decoded and (in the simulator) rebuilt with its ranks: the
# slot-descriptor __init__ (model._fast_frozen_init), as for the deltas it carries.
for _cls in (NicHello, NodeHello, NodeBatch):
    _fast_frozen_init(_cls)
del _cls
