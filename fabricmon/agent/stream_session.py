"""One connection of the stream client to the aggregator: hello, spool replay, live
batches, acks and rejects.

Batches stay in an in-flight window until the aggregator's cumulative ack covers
them; when the connection ends, in-flight batches not acked go back to the spool
as self-contained batches.  The aggregator drops any seq it already handled, so a
batch that was received but whose ack was lost is never ingested twice.  Series
ids are per connection (``codec.SeriesEncoder``).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import structlog

from ..batch import NodeBatch
from ..proto import fabricmon_pb2 as pb
from ..proto.codec import SeriesEncoder, hello_to_pb
from ..proto.subscription import BadSubscription, Subscription, subscription_from_pb
from .stream_batches import hello_from_snapshot
from .stream_channel import auth_metadata, open_channel, presented_token
from .stream_replay import SpoolReplay
from .wire_guard import U64

if TYPE_CHECKING:
    from .stream import StreamClient

log = structlog.get_logger("fabricmon.stream")

METHOD = "/fabricmon.v1.FabricStream/Stream"
# Seq is a uint64 on the wire.  An aggregator high-water mark this close to its end
# would leave no seq to send above it: such an ack is refused, never adopted.
SEQ_LIMIT = U64 - 2**32
# gRPC status codes with which the aggregator refuses a stream (aggregator/server.py: no or wrong
# credential, a credential naming another node), as the ``reason`` of fabricmon_stream_refused_total.
REFUSAL_REASONS = {"UNAUTHENTICATED": "unauthenticated", "PERMISSION_DENIED": "permission_denied"}


@dataclass(slots=True)
class _Pending:
    seq: int
    batch: NodeBatch | None  # None: sent from the spool (the file stays until acked)
    sent_at: float


@dataclass
class _Conn:
    inflight: deque = field(default_factory=deque)
    hello_acked: threading.Event = field(default_factory=threading.Event)
    dead: threading.Event = field(default_factory=threading.Event)
    server_hw: int = 0
    acked: int = 0
    max_sent: int = 0
    error: str = ""
    code: str = ""  # the gRPC status code name that ended the call, "" if none
    reject: tuple[int, str] | None = None
    subscription: Subscription | None = None  # sent before the hello's ack, if at all


def _requests(outq: queue.Queue):
    while True:
        item = outq.get()
        if item is None:
            return
        yield item


class Session:
    """One connection, run on the client's stream thread (plus a reader thread for acks).

    It works on the client's own queue, wake and stop events, lock, spool, batch maker
    and counters rather than copies, because the client's stats, ``stop()`` and the
    next session must see what this one did.
    """

    def __init__(self, client: StreamClient) -> None:
        self.client = client
        self.conn = _Conn()
        self.outq: queue.Queue = queue.Queue()
        self.token: str | None = None  # what this connection presented (a reload compares it)

    def run(self) -> bool:
        """Hello, replay the spool, then live.  True if the hello was acked."""
        c = self.client
        try:
            self.token = presented_token(c._token, c._token_file)
            metadata = auth_metadata(self.token)
            hello = c._hello_factory() if c._hello_factory else hello_from_snapshot(
                c.node, c._latest, c.interval_seconds)
            channel = open_channel(c.target, c._tls, c._keepalive_ms, c._max_msg)
        except Exception as exc:
            c.last_error = f"{type(exc).__name__}: {exc}"
            c._c["connect_failures_total"] += 1
            log.error("stream_setup_failed", target=c.target, error=c.last_error)
            return False
        conn = self.conn
        outq = self.outq
        reader: threading.Thread | None = None
        call = None
        try:
            rpc = channel.stream_stream(METHOD, request_serializer=None,
                                        response_deserializer=pb.AggregatorMessage.FromString)
            call = rpc(_requests(outq), metadata=metadata, wait_for_ready=False)
            reader = threading.Thread(target=self._read_responses, args=(call,),
                                      name="fabricmon-stream-acks", daemon=True)
            reader.start()
            outq.put(pb.AgentMessage(hello=hello_to_pb(hello)).SerializeToString())
            deadline = time.monotonic() + c._hello_timeout
            while not (conn.hello_acked.is_set() or conn.dead.is_set() or c._stop.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    conn.error = conn.error or f"no answer to the hello within {c._hello_timeout:.1f}s"
                    break
                conn.hello_acked.wait(min(left, 0.1))
            if not conn.hello_acked.is_set() or (conn.dead.is_set() and conn.reject is not None and conn.reject[0] == 0):
                if not c._stop.is_set():
                    c._c["connect_failures_total"] += 1
                    refusal = REFUSAL_REASONS.get(conn.code)
                    if refusal is not None:
                        c.refused[refusal] += 1
                    c.last_error = conn.error or (conn.reject[1] if conn.reject else "closed")
                    log.warning("stream_connect_failed", target=c.target, reason=c.last_error)
                return False
            if conn.server_hw >= SEQ_LIMIT:
                c._c["acks_refused_total"] += 1
                c._c["connect_failures_total"] += 1
                c.last_error = f"aggregator's last seq {conn.server_hw} leaves no seq to send above it"
                log.error("stream_seq_range_exhausted", target=c.target, server_acked_seq=conn.server_hw,
                          hint="the aggregator holds a seq near 2^64 for this node; spooling until it forgets it")
                return False
            c._connected = True
            c.disconnected_since = None
            c._c["connects_total"] += 1
            conn.acked = conn.server_hw
            with c._lock:
                c._batches.next_seq = max(c._batches.next_seq, conn.server_hw + 1)
                # kept after this session too: batches spooled while disconnected follow it
                c._batches.subscription = conn.subscription
            c.spool.ack(conn.server_hw)
            log.info("stream_connected", target=c.target, server_acked_seq=conn.server_hw,
                     spooled=len(c.spool), subscribed_families=-1 if conn.subscription is None else
                     len(conn.subscription.delta_families) + len(conn.subscription.gauge_families))
            self._live_loop()
            return True
        finally:
            if c._connected:
                c.disconnected_since = time.monotonic()
            c._connected = False
            outq.put(None)
            if call is not None:
                call.cancel()
            if reader is not None:
                reader.join(5.0)
            try:
                channel.close()
            except Exception:
                pass
            if conn.hello_acked.is_set() and conn.error and not c._stop.is_set():
                c.last_error = conn.error
                log.warning("stream_disconnected", target=c.target, reason=conn.error)
            self._spool_inflight()
            c._batches.new_run()

    def _read_responses(self, call) -> None:
        c = self.client
        conn = self.conn
        try:
            for msg in call:
                kind = msg.WhichOneof("msg")
                if kind == "ack":
                    seq = msg.ack.seq
                    if not conn.hello_acked.is_set():
                        conn.server_hw = seq
                        conn.hello_acked.set()
                        continue  # the high-water mark is checked and applied by the session
                    self._on_ack(seq)
                    c.note_ack_drop(msg.ack.dropped_reason)
                elif kind == "subscription":
                    try:
                        conn.subscription = subscription_from_pb(msg.subscription)
                    except BadSubscription as exc:
                        conn.subscription = None  # sending everything is always correct
                        log.warning("stream_subscription_refused", target=c.target, reason=str(exc))
                elif kind == "settings":
                    iv = msg.settings.interval_seconds
                    if math.isfinite(iv) and iv > 0:
                        c.requested_interval = iv
                        log.info("stream_settings", interval_seconds=iv)
                        if c._on_settings is not None:
                            try:
                                c._on_settings(iv)
                            except Exception as exc:
                                log.error("stream_settings_callback_failed", error=str(exc))
                elif kind == "reject":
                    conn.reject = (msg.reject.seq, msg.reject.reason)
                    log.warning("stream_rejected", target=c.target, seq=msg.reject.seq, reason=msg.reject.reason)
                c._wake.set()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            conn.code = code.name if code else ""
            conn.error = f"{code.name if code else 'ERROR'}: {exc.details() if hasattr(exc, 'details') else exc}"
        except Exception as exc:
            conn.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.dead.set()
            c._wake.set()

    def _on_ack(self, seq: int) -> None:
        c = self.client
        conn = self.conn
        n = 0
        with c._lock:
            if seq > conn.max_sent:
                # An ack for what was never sent would delete spooled batches not yet
                # delivered: honour it only up to what this connection sent.
                c._c["acks_refused_total"] += 1
                log.warning("stream_ack_beyond_sent", seq=seq, max_sent=conn.max_sent)
                seq = conn.max_sent
            if seq > conn.acked:
                conn.acked = seq
            while conn.inflight and conn.inflight[0].seq <= seq:
                conn.inflight.popleft()
                n += 1
            c._c["batches_acked_total"] += n
        c.spool.ack(seq)

    def _send(self, seq: int, data: bytes, batch: NodeBatch | None) -> bool:
        c = self.client
        conn = self.conn
        if len(data) > c._max_msg:
            c._c["batches_too_large_total"] += 1
            log.error("stream_batch_too_large", seq=seq, size=len(data), max_message_bytes=c._max_msg)
            if batch is None:
                c.spool.discard(seq)
            return False
        with c._lock:
            conn.inflight.append(_Pending(seq, batch, time.monotonic()))
            conn.max_sent = max(conn.max_sent, seq)
        self.outq.put(data)
        c._c["batches_sent_total"] += 1
        if batch is None:
            c._c["batches_replayed_total"] += 1
        return True

    def _live_loop(self) -> None:
        c = self.client
        conn = self.conn
        batches = c._batches
        batches.new_run()
        replay = SpoolReplay(c.spool, conn.server_hw)
        first_live = True
        encoder = SeriesEncoder()
        while not c._stop.is_set() and not conn.dead.is_set():
            c._wake.clear()
            if conn.reject is not None:
                self._handle_reject()
                return
            if not replay.done:
                while len(conn.inflight) < c._max_inflight:
                    nxt = replay.next()
                    if nxt is None:
                        batches.new_run()  # the first live batch carries every gauge
                        break
                    seq, msg = nxt
                    self._send(seq, msg, None)
            while c._inq and (not replay.done or len(conn.inflight) < c._max_inflight):
                try:
                    snap = c._inq.popleft()
                except IndexError:
                    break
                if not replay.done:
                    c._to_spool(snap)  # behind the replay, in order
                    continue
                b = batches.convert(snap)
                if first_live:
                    b = batches.with_known_layouts(b)
                first_live = False
                try:
                    msg = pb.AgentMessage(batch=encoder.encode(b)).SerializeToString()
                except Exception as exc:
                    # Unforeseen (the guard cleaned it): the connection's series table may now
                    # hold ids never defined on the aggregator, so the session ends; the batch
                    # is spooled self-contained if it can be, and counted if not.
                    log.error("stream_encode_failed", seq=b.seq, error=f"{type(exc).__name__}: {exc}")
                    c._spool_batch(b)
                    conn.error = f"encode failed: {type(exc).__name__}"
                    return
                self._send(b.seq, msg, b)
            with c._lock:
                oldest = conn.inflight[0].sent_at if conn.inflight else None
            if oldest is not None and time.monotonic() - oldest > c._ack_timeout:
                conn.error = f"no ack within {c._ack_timeout:.1f}s"
                return
            c._wake.wait(0.25)

    def _handle_reject(self) -> None:
        c = self.client
        conn = self.conn
        seq, reason = conn.reject or (0, "")
        conn.error = f"rejected: {reason}"
        if not seq:
            return
        c._c["batches_rejected_total"] += 1
        with c._lock:
            kept = deque(p for p in conn.inflight if p.seq != seq)
            was = [p for p in conn.inflight if p.seq == seq]
            conn.inflight = kept
        if not was or was[0].batch is None:
            c.spool.discard(seq)  # a bad spooled batch is not replayed forever
        log.error("stream_batch_dropped", seq=seq, reason=reason)

    def _spool_inflight(self) -> None:
        c = self.client
        conn = self.conn
        with c._lock:
            pending = list(conn.inflight)
            conn.inflight.clear()
        for p in pending:
            if p.batch is not None and p.seq > conn.acked:
                c._spool_batch(p.batch)
