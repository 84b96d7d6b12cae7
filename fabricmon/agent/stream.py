"""Agent -> aggregator stream client: snapshots in, acknowledged batches out.

The facade the agent wires up.  Threading: ``offer`` (a Poller listener) only
appends the snapshot to a bounded queue and returns.  One stream thread converts
snapshots into ``NodeBatch``es (``stream_batches``) and runs one ``Session``
(``stream_session``) per connection over a sync gRPC bidirectional stream
(``stream_channel``); between connections it waits a jittered backoff and
spools (``stream_reconnect``).  When the stream is down, in-flight and new batches go to the spool; on
reconnect the spool is replayed in order (``stream_replay``; new snapshots
meanwhile are appended to the spool, behind it), then live batches resume.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from ..batch import NodeHello
from ..model import Snapshot
from .ras_query import RasQuerier
from .spool import MemorySpool
from .stream_batches import BatchMaker
from .stream_channel import TlsFiles, presented_token, tls_digest
from .stream_reconnect import Reconnector
from .stream_state import (
    AGGREGATOR_DROP_REASONS,
    DEFAULT_MAX_MESSAGE_BYTES,
    REFUSAL_REASONS,
    StreamOptions,
    StreamState,
)

log = structlog.get_logger("fabricmon.stream")

# Why whole batches (or the snapshots they come from) are lost: the fixed label
# values of fabricmon_stream_batches_dropped_total.
BATCH_DROP_REASONS = ("queue_full", "spool_full", "spool_write_failed", "too_large", "rejected", "corrupt",
                      "unencodable")

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

    What it shares with its sessions lives in one ``StreamState`` (stream_state.py).
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
        rng: random.Random | None = None,
        ras: RasQuerier | None = None,
        host_root: str = "/",
    ) -> None:
        self.options = StreamOptions(
            target=target, node=node, hello_factory=hello_factory, token=token, token_file=token_file, tls=tls,
            interval_seconds=interval_seconds, hello_timeout=hello_timeout, ack_timeout=ack_timeout,
            keepalive_ms=int(keepalive_seconds * 1000), max_message_bytes=max_message_bytes,
            max_inflight=max(1, max_inflight), host_root=host_root)
        spool = spool if spool is not None else MemorySpool()
        counters = StreamState.new_counters()
        batches = BatchMaker(node, intake, max(int(time.time() * 1000), spool.max_seq + 1), counters)
        self.state = StreamState(self.options, spool, batches, counters, queue_max)
        self.ras = ras if ras is not None else RasQuerier()
        self.state.ras = self.ras
        self.reconnect = Reconnector(self.state, backoff_min, backoff_max, rng or random.Random())
        self._thread: threading.Thread | None = None
        if token is not None or token_file is not None:
            if tls is None:
                log.warning("stream_token_without_tls", target=target,
                            hint="the bearer token travels in clear text; configure tls_ca")

    # ------------------------------------------------------------ public

    @property
    def spool(self) -> MemorySpool:
        return self.state.spool

    @property
    def last_error(self) -> str:
        return self.state.last_error

    def attach(self, poller) -> None:
        """Register ``offer`` as a listener of ``poller`` (fabricmon.agent.poller.Poller)."""
        poller.add_listener(self.offer)

    def offer(self, snapshot: Snapshot) -> None:
        """Poller listener: enqueue and return at once (never blocks, never raises)."""
        self.state.enqueue(snapshot)

    def start(self) -> StreamClient:
        if self._thread is None:
            self._thread = threading.Thread(target=self.reconnect.run, name="fabricmon-stream", daemon=True)
            self._thread.start()
        return self

    def restart(self) -> None:
        """Start the stream thread again if it died (the supervisor calls this)."""
        if self.state.stop.is_set() or self.alive():
            return
        self._thread = threading.Thread(target=self.reconnect.run, name="fabricmon-stream", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop; whatever is unacknowledged or still queued is written to the spool."""
        self.state.stop.set()
        self.state.wake.set()
        self.ras.stop(min(timeout, 2.0))
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                log.warning("stream_stop_timeout", timeout=timeout)
        else:
            self.state.drain_to_spool()

    def refresh_credentials(self) -> bool:
        """Re-read the token file and the TLS files (SIGHUP, or the file watch); when the token to
        present or the TLS material is not what the live connection opened with, end that
        connection so the next one uses the new (the aggregator may already have removed the old
        token or CA).  True when it changed.  OSError when a file cannot be read (the reload
        fails, the connection stays)."""
        session = self.reconnect.session
        what = self.credentials_changed()
        if session is None or what is None:
            return False
        session.end(f"{what} changed: reconnecting with the new credentials")
        return True

    def credentials_changed(self) -> str | None:
        """Which of the live connection's credentials differ from the files now ("token file",
        "TLS files"), or None (also when not connected).  OSError when a file cannot be read."""
        session = self.reconnect.session
        if session is None or not self.state.connected:
            return None
        if session.token != presented_token(self.options.token, self.options.token_file):
            return "token file"
        if session.tls_digest != tls_digest(self.options.tls):
            return "TLS files"
        return None

    @property
    def connected(self) -> bool:
        return self.state.connected

    def stats(self) -> dict[str, Any]:
        """Counters for the agent's own metrics (all monotonic except the gauges noted)."""
        st = self.state
        s: dict[str, Any] = dict(st.counters)
        sp = st.spool.stats()
        s.update(
            batches_spooled_total=sp["written_total"], spool_dropped_total=sp["dropped_total"],
            spool_corrupt_total=sp["corrupt_total"], spool_entries=sp["entries"], spool_bytes=sp["bytes"],
            queue_length=len(st.queue), queue_max=st.queue_max, connected=int(st.connected),
            disconnected_seconds=st.disconnected_for(), interval_seconds=self.options.interval_seconds,
            refused=dict(st.refused),
            next_seq=st.batches.next_seq, spool_max_bytes=st.spool.max_bytes,
            spool_write_failures_total=sp.get("write_failed_total", 0),
            spool_set_aside_total=sp.get("set_aside_total", 0),
            items_dropped=dict(st.batches.guard.dropped),
            items_dropped_total=sum(st.batches.guard.dropped.values()),
            aggregator_dropped=dict(st.aggregator_dropped), aggregator_dropping=int(bool(st.aggregator_dropping)),
            nccl_ras=self.ras.stats(),
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

    def alive(self) -> bool:
        """The stream thread runs (started and not yet stopped)."""
        t = self._thread
        return t is not None and t.is_alive()

    def delivering(self) -> bool:
        """Doing its job: the thread runs and batches either stream or reach the spool."""
        return self.alive() and (self.state.connected or self.state.spool_ok)
