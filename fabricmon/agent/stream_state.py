"""What the stream client and each of its sessions share: the connection's options and the
live state (snapshot queue, events, lock, spool, batch maker, counters).

``StreamClient`` (stream.py) owns one ``StreamState`` and hands it to every ``Session``
(stream_session.py); neither module imports the other.  The state is shared rather than
copied because the client's stats, ``stop()`` and the next session must see what a
session did.  Threading: the queue is appended by the poller thread and consumed by the
stream thread; ``lock`` guards the batch maker's seq and subscription and a session's
in-flight window against its ack reader thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ..batch import NodeBatch, NodeHello
from ..model import Snapshot
from .spool import MemorySpool
from .stream_batches import BatchMaker
from .stream_channel import TlsFiles

log = structlog.get_logger("fabricmon.stream")

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Why the aggregator acked a batch without believing it (Ack.dropped_reason); anything else is "other".
AGGREGATOR_DROP_REASONS = ("ts_ahead", "ts_behind", "ts_stale", "seq_ahead", "other")
# gRPC status codes with which the aggregator refuses a stream (aggregator/server.py: no or wrong
# credential, a credential naming another node), as the ``reason`` of fabricmon_stream_refused_total.
REFUSAL_REASONS = {"UNAUTHENTICATED": "unauthenticated", "PERMISSION_DENIED": "permission_denied"}

# The client's monotonic counters (fabricmon_stream_* self metrics), all starting at 0.
COUNTERS = ("snapshots_dropped_total", "batches_sent_total", "batches_replayed_total", "batches_acked_total",
            "batches_rejected_total", "batches_too_large_total", "batches_unencodable_total", "connects_total",
            "connect_failures_total", "acks_refused_total", "thread_restarts_total", "items_unsubscribed_total")


@dataclass(frozen=True)
class StreamOptions:
    """How to reach the aggregator and the limits of one connection (fixed for the client's life)."""

    target: str
    node: str
    hello_factory: Callable[[], NodeHello] | None = None
    token: str | None = None
    token_file: str | None = None
    tls: TlsFiles | None = None
    interval_seconds: float = 1.0
    hello_timeout: float = 5.0
    ack_timeout: float = 15.0
    keepalive_ms: int = 20_000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_inflight: int = 64
    host_root: str = "/"  # where the host's / is seen: the hello's boot time is its proc/stat btime


class StreamState:
    """The client's live state, worked on by the client (enqueue, spool between connections)
    and by each session (send, ack, spool what was not acked)."""

    def __init__(self, options: StreamOptions, spool: MemorySpool, batches: BatchMaker,
                 counters: dict[str, int], queue_max: int) -> None:
        self.options = options
        self.spool = spool
        self.batches = batches
        self.counters = counters  # shared with ``batches``, which counts what it leaves out
        self.queue_max = max(1, queue_max)
        self.queue: deque[Snapshot] = deque()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latest: Snapshot | None = None  # the newest snapshot offered (the default hello's source)
        self.ras: Any = None  # agent/ras_query.RasQuerier: answers the aggregator's NCCL RAS queries
        self.connected = False
        self.spool_ok = True  # the last batch that had to be spooled was stored
        self.last_error = ""
        # Monotonic time the stream was last lost (or the client made): how long it has been down.
        self.disconnected_since: float | None = time.monotonic()
        self.refused = dict.fromkeys(REFUSAL_REASONS.values(), 0)  # connections refused, by reason
        # what the aggregator's acks said it dropped (Ack.dropped_reason): the node's clock or seq
        self.aggregator_dropped = dict.fromkeys(AGGREGATOR_DROP_REASONS, 0)
        self.aggregator_dropping = ""  # the newest ack's reason; "" when that batch was believed

    @staticmethod
    def new_counters() -> dict[str, int]:
        return dict.fromkeys(COUNTERS, 0)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def mark_connected(self) -> None:
        self.connected = True
        self.disconnected_since = None

    def mark_disconnected(self) -> None:
        if self.connected:
            self.disconnected_since = time.monotonic()
        self.connected = False

    def disconnected_for(self) -> float:
        """Seconds since the stream was lost (since the client was made if it never connected); 0 while up."""
        since = self.disconnected_since
        return 0.0 if self.connected or since is None else max(0.0, time.monotonic() - since)

    def note_refusal(self, code: str) -> None:
        """A connection ended with gRPC status ``code`` before it was established."""
        reason = REFUSAL_REASONS.get(code)
        if reason is not None:
            self.refused[reason] += 1

    def note_ack_drop(self, reason: str) -> None:
        """An ack came back; ``reason`` is why the aggregator did not believe that batch ("" if it did)."""
        if reason:
            key = reason if reason in self.aggregator_dropped else "other"  # a bounded label set
            with self.lock:
                self.aggregator_dropped[key] += 1
            if reason != self.aggregator_dropping:
                log.error("stream_batches_dropped_by_aggregator", target=self.options.target, reason=reason[:40],
                          hint="ts_*: this node's clock is off (check NTP/chrony); seq_ahead: its spool "
                               "or clock numbered batches ahead of the aggregator's clock")
        elif self.aggregator_dropping:
            log.info("stream_batches_believed_again", target=self.options.target, was=self.aggregator_dropping[:40])
        self.aggregator_dropping = reason[:40]

    def enqueue(self, snapshot: Snapshot) -> None:
        """Queue a snapshot for the stream thread; the oldest is dropped (and counted) when full."""
        self.latest = snapshot
        if len(self.queue) >= self.queue_max:
            try:
                self.queue.popleft()
            except IndexError:
                pass
            self.count("snapshots_dropped_total")
        self.queue.append(snapshot)
        self.wake.set()

    def take(self) -> Snapshot | None:
        """The oldest queued snapshot, or None when the queue is empty."""
        try:
            return self.queue.popleft()
        except IndexError:
            return None

    def spool_batch(self, batch: NodeBatch) -> None:
        """Store ``batch`` self-contained in the spool (what cannot be encoded is counted and lost)."""
        data = self.batches.self_contained(batch)
        if data is not None:
            self.spool_ok = self.spool.append(batch.seq, data)

    def spool_snapshot(self, snapshot: Snapshot) -> None:
        self.spool_batch(self.batches.convert(snapshot))

    def drain_to_spool(self) -> None:
        """Everything still queued goes to the spool, in order."""
        while (snap := self.take()) is not None:
            self.spool_snapshot(snap)
