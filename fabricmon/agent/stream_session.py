"""One connection of the stream client to the aggregator: hello, spool replay, live
batches, acks and rejects.

Batches stay in an in-flight window until the aggregator's cumulative ack covers
them; when the connection ends, in-flight batches not acked go back to the spool
as self-contained batches.  The aggregator drops any seq it already handled, so a
batch that was received but whose ack was lost is never ingested twice.  Series
ids are per connection (``codec.SeriesEncoder``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import structlog

from ..batch import NodeBatch
from ..proto import fabricmon_pb2 as pb
from ..proto.codec import SeriesEncoder, hello_to_pb
from ..proto.subscription import BadSubscription, Subscription, subscription_from_pb
from ..sources.host import read_boot_time
from .grpc_status import RpcError
from .stream_batches import hello_from_snapshot
from .stream_channel import auth_metadata, open_channel, presented_token, tls_digest
from .stream_replay import SpoolReplay
from .stream_state import StreamState
from .wire_guard import U64

log = structlog.get_logger("fabricmon.stream")

METHOD = "/fabricmon.v1.FabricStream/Stream"
# Seq is a uint64 on the wire.  An aggregator high-water mark this close to its end
# would leave no seq to send above it: such an ack is refused, never adopted.
SEQ_LIMIT = U64 - 2**32


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

    It works on the client's ``StreamState`` (queue, wake and stop events, lock, spool,
    batch maker, counters) rather than copies, because the client's stats, ``stop()``
    and the next session must see what this one did.
    """

    def __init__(self, state: StreamState) -> None:
        self.state = state
        self.conn = _Conn()
        self.outq: queue.Queue = queue.Queue()
        self.token: str | None = None  # what this connection presented (a reload compares it)
        self.tls_digest: str | None = None  # the TLS material it opened with (a reload compares it)

    def end(self, reason: str) -> None:
        """End this connection from outside (another thread): the session spools what was
        not acked and returns; ``reason`` is its error unless it already had one."""
        self.conn.error = self.conn.error or reason
        self.conn.dead.set()
        self.state.wake.set()

    def run(self) -> bool:
        """Hello, replay the spool, then live.  True if the hello was acked."""
        st = self.state
        o = st.options
        try:
            self.token = presented_token(o.token, o.token_file)
            metadata = auth_metadata(self.token)
            hello = o.hello_factory() if o.hello_factory else hello_from_snapshot(
                o.node, st.latest, o.interval_seconds,
                boot_time=read_boot_time(os.path.join(o.host_root, "proc", "stat")))
            self.tls_digest = tls_digest(o.tls)
            channel = open_channel(o.target, o.tls, o.keepalive_ms, o.max_message_bytes)
        except Exception as exc:
            st.last_error = f"{type(exc).__name__}: {exc}"
            st.count("connect_failures_total")
            log.error("stream_setup_failed", target=o.target, error=st.last_error)
            return False
        conn = self.conn
        outq = self.outq
        reader: threading.Thread | None = None
        call = None
        try:
            # requests go out serialized already (the encoder's bytes)
            rpc = channel.stream_stream(
                METHOD, request_serializer=None, response_deserializer=pb.AggregatorMessage.FromString)
            call = rpc(_requests(outq), metadata=metadata, wait_for_ready=False)
            reader = threading.Thread(target=self._read_responses, args=(call,),
                                      name="fabricmon-stream-acks", daemon=True)
            reader.start()
            outq.put(pb.AgentMessage(hello=hello_to_pb(hello)).SerializeToString())
            deadline = time.monotonic() + o.hello_timeout
            while not (conn.hello_acked.is_set() or conn.dead.is_set() or st.stop.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    conn.error = conn.error or f"no answer to the hello within {o.hello_timeout:.1f}s"
                    break
                conn.hello_acked.wait(min(left, 0.1))
            if not conn.hello_acked.is_set() or (conn.dead.is_set() and conn.reject is not None
                                                 and conn.reject[0] == 0):
                if not st.stop.is_set():
                    st.count("connect_failures_total")
                    st.note_refusal(conn.code)
                    st.last_error = conn.error or (conn.reject[1] if conn.reject else "closed")
                    log.warning("stream_connect_failed", target=o.target, reason=st.last_error)
                return False
            if conn.server_hw >= SEQ_LIMIT:
                st.count("acks_refused_total")
                st.count("connect_failures_total")
                st.last_error = f"aggregator's last seq {conn.server_hw} leaves no seq to send above it"
                log.error("stream_seq_range_exhausted", target=o.target, server_acked_seq=conn.server_hw,
                          hint="the aggregator holds a seq near 2^64 for this node; spooling until it forgets it")
                return False
            st.mark_connected()
            st.count("connects_total")
            conn.acked = conn.server_hw
            with st.lock:
                st.batches.next_seq = max(st.batches.next_seq, conn.server_hw + 1)
                # kept after this session too: batches spooled while disconnected follow it
                st.batches.subscription = conn.subscription
            st.spool.ack(conn.server_hw)
            log.info("stream_connected", target=o.target, server_acked_seq=conn.server_hw,
                     spooled=len(st.spool), subscribed_families=-1 if conn.subscription is None else
                     len(conn.subscription.delta_families) + len(conn.subscription.gauge_families))
            self._live_loop()
            return True
        finally:
            st.mark_disconnected()
            outq.put(None)
            if call is not None:
                call.cancel()
            if reader is not None:
                reader.join(5.0)
            try:
                channel.close()
            except Exception:
                pass
            if conn.hello_acked.is_set() and conn.error and not st.stop.is_set():
                st.last_error = conn.error
                log.warning("stream_disconnected", target=o.target, reason=conn.error)
            self._spool_inflight()
            st.batches.new_run()

    def _read_responses(self, call) -> None:
        st = self.state
        o = st.options
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
                    st.note_ack_drop(msg.ack.dropped_reason)
                elif kind == "subscription":
                    try:
                        conn.subscription = subscription_from_pb(msg.subscription)
                    except BadSubscription as exc:
                        conn.subscription = None  # sending everything is always correct
                        log.warning("stream_subscription_refused", target=o.target, reason=str(exc))
                elif kind == "ras_query":
                    if st.ras is not None:  # run on the querier's thread; the answer goes out on this queue
                        st.ras.submit(msg.ras_query, self.outq.put)
                elif kind == "reject":
                    conn.reject = (msg.reject.seq, msg.reject.reason)
                    log.warning("stream_rejected", target=o.target, seq=msg.reject.seq, reason=msg.reject.reason)
                st.wake.set()
        except RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            conn.code = code.name if code else ""
            conn.error = f"{code.name if code else 'ERROR'}: {exc.details() if hasattr(exc, 'details') else exc}"
        except Exception as exc:
            conn.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.dead.set()
            st.wake.set()

    def _on_ack(self, seq: int) -> None:
        st = self.state
        conn = self.conn
        n = 0
        with st.lock:
            if seq > conn.max_sent:
                # An ack for what was never sent would delete spooled batches not yet
                # delivered: honour it only up to what this connection sent.
                st.count("acks_refused_total")
                log.warning("stream_ack_beyond_sent", seq=seq, max_sent=conn.max_sent)
                seq = conn.max_sent
            if seq > conn.acked:
                conn.acked = seq
            while conn.inflight and conn.inflight[0].seq <= seq:
                conn.inflight.popleft()
                n += 1
            st.count("batches_acked_total", n)
        st.spool.ack(seq)

    def _send(self, seq: int, data: bytes, batch: NodeBatch | None) -> bool:
        st = self.state
        o = st.options
        conn = self.conn
        if len(data) > o.max_message_bytes:
            st.count("batches_too_large_total")
            log.error("stream_batch_too_large", seq=seq, size=len(data), max_message_bytes=o.max_message_bytes)
            if batch is None:
                st.spool.discard(seq)
            return False
        with st.lock:
            conn.inflight.append(_Pending(seq, batch, time.monotonic()))
            conn.max_sent = max(conn.max_sent, seq)
        self.outq.put(data)
        st.count("batches_sent_total")
        if batch is None:
            st.count("batches_replayed_total")
        return True

    def _live_loop(self) -> None:
        st = self.state
        o = st.options
        conn = self.conn
        batches = st.batches
        batches.new_run()
        replay = SpoolReplay(st.spool, conn.server_hw)
        first_live = True
        encoder = SeriesEncoder()
        while not st.stop.is_set() and not conn.dead.is_set():
            st.wake.clear()
            if conn.reject is not None:
                self._handle_reject()
                return
            if not replay.done:
                while len(conn.inflight) < o.max_inflight:
                    nxt = replay.next()
                    if nxt is None:
                        batches.new_run()  # the first live batch carries every gauge
                        break
                    seq, msg = nxt
                    self._send(seq, msg, None)
            while st.queue and (not replay.done or len(conn.inflight) < o.max_inflight):
                snap = st.take()
                if snap is None:
                    break
                if not replay.done:
                    st.spool_snapshot(snap)  # behind the replay, in order
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
                    st.spool_batch(b)
                    conn.error = f"encode failed: {type(exc).__name__}"
                    return
                self._send(b.seq, msg, b)
            with st.lock:
                oldest = conn.inflight[0].sent_at if conn.inflight else None
            if oldest is not None and time.monotonic() - oldest > o.ack_timeout:
                conn.error = f"no ack within {o.ack_timeout:.1f}s"
                return
            st.wake.wait(0.25)

    def _handle_reject(self) -> None:
        st = self.state
        conn = self.conn
        seq, reason = conn.reject or (0, "")
        conn.error = f"rejected: {reason}"
        if not seq:
            return
        st.count("batches_rejected_total")
        with st.lock:
            kept = deque(p for p in conn.inflight if p.seq != seq)
            was = [p for p in conn.inflight if p.seq == seq]
            conn.inflight = kept
        if not was or was[0].batch is None:
            st.spool.discard(seq)  # a bad spooled batch is not replayed forever
        log.error("stream_batch_dropped", seq=seq, reason=reason)

    def _spool_inflight(self) -> None:
        st = self.state
        conn = self.conn
        with st.lock:
            pending = list(conn.inflight)
            conn.inflight.clear()
        for p in pending:
            if p.batch is not None and p.seq > conn.acked:
                st.spool_batch(p.batch)
