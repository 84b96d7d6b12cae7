"""Agent -> aggregator stream client: snapshots in, acknowledged batches out.

Threading: ``offer`` (a Poller listener) only appends the snapshot to a bounded
queue and returns.  One worker thread converts snapshots into ``NodeBatch``es
and sends them over a sync gRPC bidirectional stream; a reader thread per
connection handles the aggregator's acks.

Delivery: every batch gets an increasing ``seq`` (starting above the wall clock
in milliseconds and above anything in the spool, so it keeps increasing across
agent restarts; the aggregator's first ack after the hello raises it further if
needed).  Batches stay in an in-flight window until the aggregator's cumulative
ack covers them.  When the stream is down, in-flight and new batches go to the
spool as *self-contained* batches; on reconnect the spool is replayed in order
(new snapshots meanwhile are appended to the spool, behind it), then live
batches resume.  The aggregator drops any seq it already handled, so a batch
that was received but whose ack was lost is never ingested twice.

Series table: ids are per connection (``codec.SeriesEncoder``); spooled batches
define their own series inline and are sent verbatim.  Gauges are sent only
when they changed since the previous batch of the same run (a connection's live
run, or a disconnected spool run); the first batch of each run carries all.
"""

from __future__ import annotations

import math
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import structlog

from .. import __version__
from ..batch import NicHello, NodeBatch, NodeHello
from ..metrics import SELF_SPECS, SPECS
from ..model import Sample, Snapshot
from ..proto import fabricmon_pb2 as pb
from ..proto.codec import SeriesEncoder, agent_message_from_batch_bytes, encode_self_contained, hello_to_pb
from ..rank_timing import JobLayout, RankTiming
from .spool import MemorySpool
from .wire_guard import U64, WireGuard

log = structlog.get_logger("fabricmon.stream")

METHOD = "/fabricmon.v1.FabricStream/Stream"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Seq is a uint64 on the wire.  An aggregator high-water mark this close to its end
# would leave no seq to send above it: such an ack is refused, never adopted.
SEQ_LIMIT = U64 - 2**32
# Why whole batches (or the snapshots they come from) are lost: the fixed label
# values of fabricmon_stream_batches_dropped_total.
BATCH_DROP_REASONS = ("queue_full", "spool_full", "spool_write_failed", "too_large", "rejected", "corrupt",
                      "unencodable")


@dataclass(frozen=True)
class TlsFiles:
    """PEM file paths.  Client: ``ca`` verifies the aggregator, ``cert``/``key`` are the
    agent's client certificate (mTLS).  ``server_name`` overrides the name checked
    against the aggregator's certificate (tests, IP targets)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _kind(family: str) -> str:
    spec = SPECS.get(family) or SELF_SPECS.get(family)
    if spec is not None:
        return spec.kind
    return "counter" if family.endswith("_total") else "gauge"


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


_IS_COUNTER: dict[str, bool] = {}


def changed_gauges(samples, base: dict | None) -> tuple[list[Sample], dict]:
    """The stream's gauge rule: all gauges when ``base`` is None (first batch of a run), then only
    those whose value changed or that (re)appeared.  Returns (gauges to send, the new base).

    Runs over every sample of every poll, so it is kept cheap: the family's kind is looked up once,
    and the counter tracker hands back the same Sample object while a value is unchanged, so an
    identity check settles most series.
    """
    new: dict = {}
    out: list[Sample] = []
    is_counter = _IS_COUNTER
    for s in samples:
        fam = s.family
        c = is_counter.get(fam)
        if c is None:
            c = is_counter[fam] = _kind(fam) == "counter"
        if c:
            continue  # totals are not streamed: deltas are
        key = (fam, s.labels)
        new[key] = s
        if base is None:
            out.append(s)
            continue
        old = base.get(key)
        if old is None or (old is not s and not _same(old.value, s.value)):
            out.append(s)
    return out, new  # series that vanished are forgotten: sent again if they return


def hello_from_snapshot(node: str, snap: Snapshot | None, interval_seconds: float,
                        agent_version: str = __version__, boot_id: str | None = None) -> NodeHello:
    """Build the connection hello from the latest snapshot's inventory and facts."""
    nics: list[NicHello] = []
    gpus = 0
    if snap is not None:
        inv = snap.facts.get("inventory")
        ports_facts = snap.facts.get("ports") or {}
        for p in getattr(inv, "ports", ()) or ():
            f = ports_facts.get(f"{p.device}/{p.port}") or {}
            gpu = f.get("gpu")
            nics.append(NicHello(
                device=p.device, port=p.port, rail=p.rail, link_layer=p.link_layer or (f.get("link_layer") or ""),
                netdev=p.netdev, rate_gbps=float(f.get("rate_gbps") or 0.0), width=int(f.get("width") or 0),
                gpu=int(gpu) if isinstance(gpu, int) else -1))
        gpus = len(snap.facts.get("gpus") or {})
    if boot_id is None:
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot_id = ""
    return NodeHello(node=node, agent_version=agent_version, interval_seconds=interval_seconds,
                     nics=tuple(nics), gpus=gpus, boot_id=boot_id)


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
    reject: tuple[int, str] | None = None


class StreamClient:
    """Streams snapshots (plus rank timings from ``intake``) to the aggregator at ``target``.

    ``hello_factory()`` is called at every (re)connect; by default the hello is
    built from the latest snapshot offered.  ``spool`` is a ``Spool`` (disk) or
    ``MemorySpool``; default an in-memory one.  ``token``/``token_file`` add
    ``authorization: Bearer <token>`` (the file is re-read at each connect, so a
    rotated token is picked up); ``tls`` turns on TLS (mTLS with cert and key).
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
        self._intake = intake
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
        self._gauge_base: dict | None = None
        self._next_seq = max(int(time.time() * 1000), self.spool.max_seq + 1)
        self._connected = False
        self.requested_interval: float | None = None
        self._c = dict(snapshots_dropped_total=0, batches_sent_total=0, batches_replayed_total=0,
                       batches_acked_total=0, batches_rejected_total=0, batches_too_large_total=0,
                       batches_unencodable_total=0, connects_total=0, connect_failures_total=0,
                       acks_refused_total=0, thread_restarts_total=0)
        self._guard = WireGuard()
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
            next_seq=self._next_seq, spool_max_bytes=self.spool.max_bytes,
            spool_write_failures_total=sp.get("write_failed_total", 0),
            items_dropped=dict(self._guard.dropped), items_dropped_total=sum(self._guard.dropped.values()),
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
        return self.alive() and (self._connected or self.spool_ok)

    # ------------------------------------------------------------ conversion

    def _changed_gauges(self, samples) -> list[Sample]:
        out, self._gauge_base = changed_gauges(samples, self._gauge_base)
        return out

    def _drain_intake(self) -> tuple[list[RankTiming], list[JobLayout]]:
        if self._intake is None:
            return [], []
        try:
            ranks, layouts = self._intake.drain()
            return list(ranks), list(layouts)
        except Exception as exc:
            log.error("intake_drain_failed", error=str(exc))
            return [], []

    def _convert(self, snap: Snapshot) -> NodeBatch:
        """The snapshot as the next batch, without any item the wire cannot carry (counted)."""
        ranks, layouts = self._drain_intake()
        gauges = self._changed_gauges(snap.samples)
        seq = self._next_seq
        self._next_seq += 1
        return self._guard.clean(NodeBatch(
            node=self.node, seq=seq, ts=snap.ts, interval_seconds=snap.interval_seconds, deltas=tuple(snap.deltas),
            gauges=tuple(gauges), ranks=tuple(ranks), layouts=tuple(layouts)))

    def _self_contained(self, b: NodeBatch) -> bytes | None:
        """Serialized self-contained batch; None (counted) in the unforeseen case it cannot be encoded.

        Should the guard have missed something, the batch is tried again without its rank
        timings and layouts (counted as dropped items) so the poll's deltas still go out."""
        try:
            return encode_self_contained(b).SerializeToString()
        except Exception as exc:
            log.error("stream_batch_unencodable", seq=b.seq, error=f"{type(exc).__name__}: {exc}")
        if b.ranks or b.layouts:
            self._guard.dropped["rank"] += len(b.ranks)
            self._guard.dropped["layout"] += len(b.layouts)
            try:
                return encode_self_contained(NodeBatch(b.node, b.seq, b.ts, b.interval_seconds, b.deltas, b.gauges,
                                                       (), ())).SerializeToString()
            except Exception as exc:
                log.error("stream_batch_unencodable", seq=b.seq, error=f"{type(exc).__name__}: {exc}")
        self._c["batches_unencodable_total"] += 1
        return None

    def _spool_batch(self, b: NodeBatch) -> None:
        data = self._self_contained(b)
        if data is not None:
            self.spool_ok = self.spool.append(b.seq, data)

    def _to_spool(self, snap: Snapshot) -> None:
        self._spool_batch(self._convert(snap))

    def _drain_to_spool(self) -> None:
        while self._inq:
            try:
                snap = self._inq.popleft()
            except IndexError:
                break
            self._to_spool(snap)

    # ------------------------------------------------------------ connection

    def _metadata(self) -> list[tuple[str, str]]:
        token = self._token
        if self._token_file:
            token = Path(self._token_file).read_text().strip()
        return [("authorization", f"Bearer {token}")] if token else []

    def _channel(self) -> grpc.Channel:
        opts = [
            ("grpc.keepalive_time_ms", self._keepalive_ms),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", self._max_msg),
            ("grpc.max_receive_message_length", 1024 * 1024),
            ("grpc.enable_retries", 0),
        ]
        if self._tls is not None:
            t = self._tls
            creds = grpc.ssl_channel_credentials(root_certificates=_read(t.ca), private_key=_read(t.key),
                                                 certificate_chain=_read(t.cert))
            if t.server_name:
                opts.append(("grpc.ssl_target_name_override", t.server_name))
            return grpc.secure_channel(self.target, creds, options=opts)
        return grpc.insecure_channel(self.target, options=opts)

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
                established = self._session()
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

    @staticmethod
    def _requests(outq: queue.Queue):
        while True:
            item = outq.get()
            if item is None:
                return
            yield item

    def _read_responses(self, call, conn: _Conn) -> None:
        try:
            for msg in call:
                kind = msg.WhichOneof("msg")
                if kind == "ack":
                    seq = msg.ack.seq
                    if not conn.hello_acked.is_set():
                        conn.server_hw = seq
                        conn.hello_acked.set()
                        continue  # the high-water mark is checked and applied by the session
                    self._on_ack(conn, seq)
                elif kind == "settings":
                    iv = msg.settings.interval_seconds
                    if math.isfinite(iv) and iv > 0:
                        self.requested_interval = iv
                        log.info("stream_settings", interval_seconds=iv)
                        if self._on_settings is not None:
                            try:
                                self._on_settings(iv)
                            except Exception as exc:
                                log.error("stream_settings_callback_failed", error=str(exc))
                elif kind == "reject":
                    conn.reject = (msg.reject.seq, msg.reject.reason)
                    log.warning("stream_rejected", target=self.target, seq=msg.reject.seq, reason=msg.reject.reason)
                self._wake.set()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            conn.error = f"{code.name if code else 'ERROR'}: {exc.details() if hasattr(exc, 'details') else exc}"
        except Exception as exc:
            conn.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.dead.set()
            self._wake.set()

    def _on_ack(self, conn: _Conn, seq: int) -> None:
        n = 0
        with self._lock:
            if seq > conn.max_sent:
                # An ack for what was never sent would delete spooled batches not yet
                # delivered: honour it only up to what this connection sent.
                self._c["acks_refused_total"] += 1
                log.warning("stream_ack_beyond_sent", seq=seq, max_sent=conn.max_sent)
                seq = conn.max_sent
            if seq > conn.acked:
                conn.acked = seq
            while conn.inflight and conn.inflight[0].seq <= seq:
                conn.inflight.popleft()
                n += 1
            self._c["batches_acked_total"] += n
        self.spool.ack(seq)

    def _send(self, outq: queue.Queue, conn: _Conn, seq: int, data: bytes, batch: NodeBatch | None) -> bool:
        if len(data) > self._max_msg:
            self._c["batches_too_large_total"] += 1
            log.error("stream_batch_too_large", seq=seq, size=len(data), max_message_bytes=self._max_msg)
            if batch is None:
                self.spool.discard(seq)
            return False
        with self._lock:
            conn.inflight.append(_Pending(seq, batch, time.monotonic()))
            conn.max_sent = max(conn.max_sent, seq)
        outq.put(data)
        self._c["batches_sent_total"] += 1
        if batch is None:
            self._c["batches_replayed_total"] += 1
        return True

    def _session(self) -> bool:
        """One connection: hello, replay the spool, then live.  True if the hello was acked."""
        try:
            metadata = self._metadata()
            hello = self._hello_factory() if self._hello_factory else hello_from_snapshot(
                self.node, self._latest, self.interval_seconds)
            channel = self._channel()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._c["connect_failures_total"] += 1
            log.error("stream_setup_failed", target=self.target, error=self.last_error)
            return False
        conn = _Conn()
        outq: queue.Queue = queue.Queue()
        reader: threading.Thread | None = None
        call = None
        try:
            rpc = channel.stream_stream(METHOD, request_serializer=None,
                                        response_deserializer=pb.AggregatorMessage.FromString)
            call = rpc(self._requests(outq), metadata=metadata, wait_for_ready=False)
            reader = threading.Thread(target=self._read_responses, args=(call, conn),
                                      name="fabricmon-stream-acks", daemon=True)
            reader.start()
            outq.put(pb.AgentMessage(hello=hello_to_pb(hello)).SerializeToString())
            deadline = time.monotonic() + self._hello_timeout
            while not (conn.hello_acked.is_set() or conn.dead.is_set() or self._stop.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    conn.error = conn.error or f"no answer to the hello within {self._hello_timeout:.1f}s"
                    break
                conn.hello_acked.wait(min(left, 0.1))
            if not conn.hello_acked.is_set() or (conn.dead.is_set() and conn.reject is not None and conn.reject[0] == 0):
                if not self._stop.is_set():
                    self._c["connect_failures_total"] += 1
                    self.last_error = conn.error or (conn.reject[1] if conn.reject else "closed")
                    log.warning("stream_connect_failed", target=self.target, reason=self.last_error)
                return False
            if conn.server_hw >= SEQ_LIMIT:
                self._c["acks_refused_total"] += 1
                self._c["connect_failures_total"] += 1
                self.last_error = f"aggregator's last seq {conn.server_hw} leaves no seq to send above it"
                log.error("stream_seq_range_exhausted", target=self.target, server_acked_seq=conn.server_hw,
                          hint="the aggregator holds a seq near 2^64 for this node; spooling until it forgets it")
                return False
            self._connected = True
            self._c["connects_total"] += 1
            conn.acked = conn.server_hw
            with self._lock:
                self._next_seq = max(self._next_seq, conn.server_hw + 1)
            self.spool.ack(conn.server_hw)
            log.info("stream_connected", target=self.target, server_acked_seq=conn.server_hw,
                     spooled=len(self.spool))
            self._live_loop(conn, outq)
            return True
        finally:
            self._connected = False
            outq.put(None)
            if call is not None:
                call.cancel()
            if reader is not None:
                reader.join(5.0)
            try:
                channel.close()
            except Exception:
                pass
            if conn.hello_acked.is_set() and conn.error and not self._stop.is_set():
                self.last_error = conn.error
                log.warning("stream_disconnected", target=self.target, reason=conn.error)
            self._spool_inflight(conn)
            self._gauge_base = None

    def _live_loop(self, conn: _Conn, outq: queue.Queue) -> None:
        self._gauge_base = None
        replaying = True
        cursor = conn.server_hw
        first_live = True
        encoder = SeriesEncoder()
        while not self._stop.is_set() and not conn.dead.is_set():
            self._wake.clear()
            if conn.reject is not None:
                self._handle_reject(conn)
                return
            if replaying:
                while len(conn.inflight) < self._max_inflight:
                    nxt = self.spool.next_after(cursor)
                    if nxt is None:
                        replaying = False
                        self._gauge_base = None  # the first live batch carries every gauge
                        break
                    seq, payload = nxt
                    cursor = seq
                    self._send(outq, conn, seq, agent_message_from_batch_bytes(payload), None)
            while self._inq and (replaying or len(conn.inflight) < self._max_inflight):
                try:
                    snap = self._inq.popleft()
                except IndexError:
                    break
                if replaying:
                    self._to_spool(snap)  # behind the replay, in order
                    continue
                b = self._convert(snap)
                if first_live and self._intake is not None and hasattr(self._intake, "layouts"):
                    try:
                        known = {lay.job: lay for lay in self._intake.layouts()}
                        known.update({lay.job: lay for lay in b.layouts})
                        b = self._guard.clean(NodeBatch(b.node, b.seq, b.ts, b.interval_seconds, b.deltas,
                                                        b.gauges, b.ranks, tuple(known.values())))
                    except Exception as exc:
                        log.error("intake_layouts_failed", error=str(exc))
                first_live = False
                try:
                    msg = pb.AgentMessage(batch=encoder.encode(b)).SerializeToString()
                except Exception as exc:
                    # Unforeseen (the guard cleaned it): the connection's series table may now
                    # hold ids never defined on the aggregator, so the session ends; the batch
                    # is spooled self-contained if it can be, and counted if not.
                    log.error("stream_encode_failed", seq=b.seq, error=f"{type(exc).__name__}: {exc}")
                    self._spool_batch(b)
                    conn.error = f"encode failed: {type(exc).__name__}"
                    return
                self._send(outq, conn, b.seq, msg, b)
            with self._lock:
                oldest = conn.inflight[0].sent_at if conn.inflight else None
            if oldest is not None and time.monotonic() - oldest > self._ack_timeout:
                conn.error = f"no ack within {self._ack_timeout:.1f}s"
                return
            self._wake.wait(0.25)

    def _handle_reject(self, conn: _Conn) -> None:
        seq, reason = conn.reject or (0, "")
        conn.error = f"rejected: {reason}"
        if not seq:
            return
        self._c["batches_rejected_total"] += 1
        with self._lock:
            kept = deque(p for p in conn.inflight if p.seq != seq)
            was = [p for p in conn.inflight if p.seq == seq]
            conn.inflight = kept
        if not was or was[0].batch is None:
            self.spool.discard(seq)  # a bad spooled batch is not replayed forever
        log.error("stream_batch_dropped", seq=seq, reason=reason)

    def _spool_inflight(self, conn: _Conn) -> None:
        with self._lock:
            pending = list(conn.inflight)
            conn.inflight.clear()
        for p in pending:
            if p.batch is not None and p.seq > conn.acked:
                self._spool_batch(p.batch)
