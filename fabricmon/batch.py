"""What an agent tells the aggregator: a hello per connection, then one batch per poll.

These are the in-process forms; ``proto/`` defines the wire form and
``agent/stream_batches.py`` / ``aggregator/server.py`` convert.  The simulator's
in-memory mode builds the same objects, so the aggregator code path is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import CounterDelta, Sample
from .rank_timing import Heartbeat, JobLayout, RankTiming


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
