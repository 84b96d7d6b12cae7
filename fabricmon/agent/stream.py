"""Agent -> aggregator stream client: snapshots in, acknowledged batches out.

The facade the agent wires up.  Threading: ``offer`` (a Poller listener) only
appends the snapshot to a bounded queue and returns.  One stream thread converts
snapshots into ``NodeBatch``es (``stream_batches``) and runs one ``Session``
(``stream_session``) per connection over a sync gRPC bidirectional stream
(``stream_channel``); between connections it waits a jittered backoff and
spools.  When the stream is down, in-flight and new batches go to the spool; on
reconnect the spool is replayed in order (``stream_replay``; new snapshots
meanwhile are appended to the spool, behind it), then live batches resume.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from ..batch import NodeBatch, NodeHello
from ..model import Snapshot
from .spool import MemorySpool
from .stream_batches import BatchMaker
from .stream_channel import TlsFiles, presented_token
from .stream_session import REFUSAL_REASONS, Session

log = structlog.get_logger("fabricmon.stream")

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Why whole batches (or the snapshots they come from) are lost: the fixed label
# values of fabricmon_stream_batches_dropped_total.
BATCH_DROP_REASONS = ("queue_full", "spool_full", "spool_write_failed", "too_large", "rejected", "corrupt",
                      "unencodable")
# Why the aggregator acked a batch without believing it (Ack.dropped_reason); anything else is "other".
AGGREGATOR_DROP_REASONS = ("ts_ahead", "ts_behind", "ts_stale", "seq_ahead", "other")

# TlsFiles is part of StreamClient's constructor: importers take both from here.
__all__ = ["AGGREGATOR_DROP_REASONS", "BATCH_DROP_REASONS", "DEFAULT_MAX_MESSAGE_BYTES", "REFUSAL_REASONS",
           "StreamClient", "TlsFiles"]


class StreamClient:
    """Streams snapshots (plus rank timings from ``intake``) to the aggregator at ``target``.

    ``hello_factory()`` is called at every (re)connect; by default the hello is
    built from the latest snapshot offered.  ``spool`` is a ``Spool`` (disk) or
    ``MemorySpool``; default an in-memory one.  ``token``/``token_file`` add
    ``authorization: Bearer <token>`` (the file, whose last line is presented, is re-read at
    each connect, and ``refresh_credentials`` reconnects at once when it changed: a SIGHUP
    picks up a rotated token); ``tls`` turns on TLS (mTLS with cert and key).
    ``intake`` is anything with ``drain() -> (ranks, layouts)`` and optionally
    ``layouts() -> list[JobLayout]`` (all known layouts, resent on each connect).
    """

    def __init__(
        self,
        target: str,
        node: str,
        hello_factory: Callable[[], NodeHello] | None = None,
        spool: MemorySpool | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        tls: TlsFiles | None = None,
        intake: Any = None,
        interval_seconds: float = 1.0,
        backoff_min: float = 0.5,
        backoff_max: float = 30.0,
        hello_timeout: float = 5.0,
        ack_timeout: float = 15.0,
        keepalive_seconds: float = 20.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_inflight: int = 64,
        queue_max: int = 120,
        on_settings: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.target = target
        self.node = node
        self._hello_factory = hello_factory
        self.spool = spool if spool is not None else MemorySpool()
        self._token = token
        self._token_file = token_file
        self._tls = tls
        self.interval_seconds = interval_seconds
        self._backoff_min = backoff_min
        self._backoff_max = backoff_max
        self._hello_timeout = hello_timeout
        self._ack_timeout = ack_timeout
        self._keepalive_ms = int(keepalive_seconds * 1000)
        self._max_msg = max_message_bytes
        self._max_inflight = max(1, max_inflight)
        self._queue_max = max(1, queue_max)
        self._on_settings = on_settings
        self._rng = rng or random.Random()

        self._inq: deque[Snapshot] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._latest: Snapshot | None = None
        self._connected = False
        self._session: Session | None = None
        # Monotonic time the stream was last lost (or the client made): how long it has been down.
        self.disconnected_since: float | None = time.monotonic()
        self.refused = dict.fromkeys(REFUSAL_REASONS.values(), 0)
        self.requested_interval: float | None = None
        self._c = dict(snapshots_dropped_total=0, batches_sent_total=0, batches_replayed_total=0,
                       batches_acked_total=0, batches_rejected_total=0, batches_too_large_total=0,
                       batches_unencodable_total=0, connects_total=0, connect_failures_total=0,
                       acks_refused_total=0, thread_restarts_total=0, items_unsubscribed_total=0)
        # what the aggregator's acks said it dropped (Ack.dropped_reason): the node's clock or seq
        self.aggregator_dropped = dict.fromkeys(AGGREGATOR_DROP_REASONS, 0)
        self.aggregator_dropping = ""  # the newest ack's reason; "" when that batch was believed
        self._batches = BatchMaker(node, intake, max(int(time.time() * 1000), self.spool.max_seq + 1), self._c)
        self.spool_ok = True  # the last batch that had to be spooled was stored
        self.last_error = ""
        if token is not None or token_file is not None:
            if tls is None:
                log.warning("stream_token_without_tls", target=target,
                            hint="the bearer token travels in clear text; configure tls_ca")

    # ------------------------------------------------------------ public

    def attach(self, poller) -> None:
        """Register ``offer`` as a listener of ``poller`` (fabricmon.agent.poller.Poller)."""
        poller.add_listener(self.offer)

    def offer(self, snapshot: Snapshot) -> None:
        """Poller listener: enqueue and return at once (never blocks, never raises)."""
        self._latest = snapshot
        if len(self._inq) >= self._queue_max:
            try:
                self._inq.popleft()
            except IndexError:
                pass
            self._c["snapshots_dropped_total"] += 1
        self._inq.append(snapshot)
        self._wake.set()

    def start(self) -> StreamClient:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fabricmon-stream", daemon=True)
            self._thread.start()
        return self

    def restart(self) -> None:
        """Start the stream thread again if it died (the supervisor calls this)."""
        if self._stop.is_set() or self.alive():
            return
        self._thread = threading.Thread(target=self._run, name="fabricmon-stream", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop; whatever is unacknowledged or still queued is written to the spool."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                log.warning("stream_stop_timeout", timeout=timeout)
        else:
            self._drain_to_spool()

    def refresh_credentials(self) -> bool:
        """Re-read the token file (SIGHUP); when the token to present is not the one the live
        connection presented, end that connection so the next one presents the new token (the
        aggregator may already have removed the old one).  True when it changed.  OSError when
        the file cannot be read (the reload fails, the connection stays)."""
        session = self._session
        now = presented_token(self._token, self._token_file)
        if session is None or not self._connected or session.token == now:
            return False
        session.conn.error = session.conn.error or "token file changed: reconnecting with the new token"
        session.conn.dead.set()
        self._wake.set()
        return True

    @property
    def connected(self) -> bool:
        return self._connected

    def stats(self) -> dict[str, Any]:
        """Counters for the agent's own metrics (all monotonic except the gauges noted)."""
        s = dict(self._c)
        sp = self.spool.stats()
        s.update(
            batches_spooled_total=sp["written_total"], spool_dropped_total=sp["dropped_total"],
            spool_corrupt_total=sp["corrupt_total"], spool_entries=sp["entries"], spool_bytes=sp["bytes"],
            queue_length=len(self._inq), queue_max=self._queue_max, connected=int(self._connected),
            disconnected_seconds=self.disconnected_for(), interval_seconds=self.interval_seconds,
            refused=dict(self.refused),
            next_seq=self._batches.next_seq, spool_max_bytes=self.spool.max_bytes,
            spool_write_failures_total=sp.get("write_failed_total", 0),
            spool_set_aside_total=sp.get("set_aside_total", 0),
            items_dropped=dict(self._batches.guard.dropped),
            items_dropped_total=sum(self._batches.guard.dropped.values()),
            aggregator_dropped=dict(self.aggregator_dropped), aggregator_dropping=int(bool(self.aggregator_dropping)),
        )
        s["batches_dropped"] = {
            "queue_full": s["snapshots_dropped_total"],
            "spool_full": sp.get("full_dropped_total", 0),
            "spool_write_failed": sp.get("write_failed_total", 0),
            "too_large": s["batches_too_large_total"] + sp.get("too_large_total", 0),
            "rejected": s["batches_rejected_total"],
            "corrupt": sp["corrupt_total"],
            "unencodable": s["batches_unencodable_total"],
        }
        return s

    def note_ack_drop(self, reason: str) -> None:
        """An ack came back; ``reason`` is why the aggregator did not believe that batch ("" if it did)."""
        if reason:
            key = reason if reason in self.aggregator_dropped else "other"  # a bounded label set
            with self._lock:
                self.aggregator_dropped[key] += 1
            if reason != self.aggregator_dropping:
                log.error("stream_batches_dropped_by_aggregator", target=self.target, reason=reason[:40],
                          hint="ts_*: this node's clock is off (check NTP/chrony); seq_ahead: its spool "
                               "or clock numbered batches ahead of the aggregator's clock")
        elif self.aggregator_dropping:
            log.info("stream_batches_believed_again", target=self.target, was=self.aggregator_dropping[:40])
        self.aggregator_dropping = reason[:40]

    def disconnected_for(self) -> float:
        """Seconds since the stream was lost (since the client was made if it never connected); 0 while up."""
        since = self.disconnected_since
        return 0.0 if self._connected or since is None else max(0.0, time.monotonic() - since)

    def alive(self) -> bool:
        """The stream thread runs (started and not yet stopped)."""
        t = self._thread
        return t is not None and t.is_alive()

    def delivering(self) -> bool:
        """Doing its job: the thread runs and batches either stream or reach the spool."""
        return self.alive() and (self._connected or self.spool_ok)

    # ------------------------------------------------------------ spooling

    def _spool_batch(self, b: NodeBatch) -> None:
        data = self._batches.self_contained(b)
        if data is not None:
            self.spool_ok = self.spool.append(b.seq, data)

    def _to_spool(self, snap: Snapshot) -> None:
        self._spool_batch(self._batches.convert(snap))

    def _drain_to_spool(self) -> None:
        while self._inq:
            try:
                snap = self._inq.popleft()
            except IndexError:
                break
            self._to_spool(snap)

    # ------------------------------------------------------------ reconnecting

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter, within [backoff_min, backoff_max]."""
        cap = min(self._backoff_max, self._backoff_min * (2 ** min(attempt, 30)))
        return max(self._backoff_min, self._rng.uniform(0.0, cap))

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            # Whatever fails in a session or while spooling costs that attempt, never the
            # thread: it is logged, counted, and the loop goes on after the backoff.
            try:
                self._session = Session(self)
                established = self._session.run()
            except Exception as exc:
                self._c["thread_restarts_total"] += 1
                log.error("stream_session_failed", error=f"{type(exc).__name__}: {exc}")
                established = False
            if established:
                attempt = 0
            if self._stop.is_set():
                break
            delay = self._backoff(attempt)
            attempt += 1
            try:
                self._spool_for(delay)
            except Exception as exc:
                self._c["thread_restarts_total"] += 1
                log.error("stream_spooling_failed", error=f"{type(exc).__name__}: {exc}")
                self._stop.wait(min(delay, 1.0))
        try:
            self._drain_to_spool()
        except Exception as exc:
            log.error("stream_final_spool_failed", error=f"{type(exc).__name__}: {exc}")

    def _spool_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            self._drain_to_spool()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(min(left, 0.5))
            self._wake.clear()
