"""The aggregator's gRPC side: ``fabricmon.v1.FabricStream`` on a ``grpc.aio`` server.

One long-lived bidirectional stream per agent, all on one event loop (no
thread per stream).  Per stream: authenticate, require a Hello first, bind the
node it names to the stream's credential, keep the connection's series table,
decode each Batch into a ``NodeBatch``, validate its seq, hand it to the engine
and ack.  Acks are cumulative.  Malformed input is answered with a Reject
naming the reason and the stream is closed (INVALID_ARGUMENT); other agents'
streams are untouched.

Identity: a stream speaks for one node, and only for the node its credential
names.  With mTLS (``tls.client_ca``) the client certificate's CN or one of its
DNS SANs must equal the hello's node.  With per-node tokens (``node_tokens``:
node -> token) the bearer token must be that node's.  A shared ``token`` lets
any holder speak for any node: the weaker mode, for small or trusted fabrics.
Refused identities end the stream with PERMISSION_DENIED and are counted.
``set_credentials`` (a SIGHUP) swaps the accepted tokens: new streams are judged
by the new set at once, and every live stream whose token is no longer accepted
for its node is cut (UNAUTHENTICATED "token revoked", counted).

Seq: the agent numbers its batches; the aggregator drops a seq it already
handled (a replay after a lost ack).  A seq is judged per session: a session's
floor is what the node had delivered when its hello arrived, and within the
session seqs only rise.  A seq further ahead than the aggregator's wall clock
in milliseconds plus the allowed skew is dropped (the agent numbers from its
wall clock in ms and counts up by one per poll, so an honest agent never gets
there): one batch with seq 2**64-1 cannot make the node's real batches look
like replays.  Every dropped batch is acked (so it is not resent forever) and
counted by reason.

Engine calls (``hello``, ``ingest``, ``disconnected``) run on the server's event
loop thread, one at a time; pass ``lock`` (a ``threading.Lock``) if other
threads (``tick``, the HTTP API) use the engine too, and every engine call is
made holding it.

``start_grpc_server`` runs the server on its own event loop in a background
thread (tests, the demo, a threaded service); ``start_grpc_server_async``
starts it on the running loop.  Both return a ``GrpcServer`` handle.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..batch import NodeBatch, NodeHello
from ..proto import fabricmon_pb2 as pb
from ..proto import fabricmon_pb2_grpc as pb_grpc
from ..proto.codec import MalformedBatch, SeriesDecoder, hello_from_pb
from ..proto.ras import BadRasMessage, report_from_pb
from ..proto.subscription import Subscription
from .conn_gate import ConnectionGate, private_socket_path, remove_private_socket
from .credentials import StreamCredentials, fingerprint
from .name_bounds import KINDS as NAME_KINDS
from .name_bounds import NameBounds

log = structlog.get_logger("fabricmon.grpc")

SERVICE_NAME = "fabricmon.v1.FabricStream"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_SKEW_S = 300.0

# Reasons a batch is dropped by the servicer (fabricmon_ingest_batches_dropped_total{reason}).
SEQ_DUPLICATE = "duplicate"
SEQ_AHEAD = "seq_ahead"
_ANY_NODE = None  # a shared token: the stream may name any node


_Context = grpc.aio.ServicerContext[pb.AgentMessage, pb.AggregatorMessage]


class EngineLike(Protocol):
    def hello(self, hello: NodeHello) -> None: ...
    def ingest(self, batch: NodeBatch) -> object: ...  # Engine's says whether it was ingested
    def disconnected(self, node: str) -> None: ...


@dataclass(frozen=True)
class ServerTls:
    """PEM file paths: the server's ``cert`` (chain) and ``key``; with ``client_ca``
    every agent must present a certificate signed by it (mTLS)."""

    cert: str
    key: str
    client_ca: str | None = None


def credentials_of(token: str | None, node_tokens: Mapping[str, str] | None) -> StreamCredentials:
    """The credentials of one shared ``token`` and a node -> token mapping (tests, the demo)."""
    return StreamCredentials(frozenset([token.encode()]) if token else frozenset(),
                             tuple(sorted((n, frozenset([t.encode()])) for n, t in (node_tokens or {}).items())))


class TlsMaterial:
    """The server's certificate chain, key and client CA bundle as bytes, swappable while the server
    runs: gRPC asks ``fetch`` at every new handshake (dynamic server credentials), and gets the new
    material once after ``update`` (None, "unchanged", otherwise).  Live connections keep what they
    negotiated."""

    def __init__(self, tls: ServerTls) -> None:
        self._lock = threading.Lock()
        self.current = read_tls_files(tls)
        self._pending: tuple[bytes, bytes, bytes | None] | None = None

    def config(self, material: tuple[bytes, bytes, bytes | None]) -> Any:
        key, cert, ca = material
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def update(self, material: tuple[bytes, bytes, bytes | None]) -> None:
        with self._lock:
            self.current = material
            self._pending = material

    def fetch(self) -> Any:
        with self._lock:
            pending, self._pending = self._pending, None
        return self.config(pending) if pending is not None else None


def read_tls_files(tls: ServerTls) -> tuple[bytes, bytes, bytes | None]:
    """(key, certificate chain, client CA bundle or None) read from the files ``tls`` names."""
    return (Path(tls.key).read_bytes(), Path(tls.cert).read_bytes(),
            Path(tls.client_ca).read_bytes() if tls.client_ca else None)


# Drops a node is told about in its ack (Ack.dropped_reason): its clock or its seq, which only the node
# can fix.  A duplicate (a replay after a lost ack) is normal and not told.
TOLD_DROPS = frozenset({SEQ_AHEAD, "ts_ahead", "ts_behind", "ts_stale"})


def _ack(seq: int, dropped: str = "") -> pb.AggregatorMessage:
    return pb.AggregatorMessage(ack=pb.Ack(seq=seq, dropped_reason=dropped))


def _reject(reason: str, seq: int = 0) -> pb.AggregatorMessage:
    return pb.AggregatorMessage(reject=pb.Reject(reason=reason[:500], seq=seq))


class FabricStreamServicer(pb_grpc.FabricStreamServicer):
    def __init__(self, engine: EngineLike, *, token: str | None = None, lock: Any = None,
                 hello_timeout: float = 10.0, node_tokens: Mapping[str, str] | None = None,
                 credentials: StreamCredentials | None = None,
                 bind_tls_identity: bool = False, max_skew_s: float = DEFAULT_MAX_SKEW_S,
                 wall: Callable[[], float] = time.time, name_limits: Mapping[str, int] | None = None,
                 gate: ConnectionGate | None = None) -> None:
        self.engine = engine
        self.gate = gate  # the connection gate in front (conn_gate.py): told which connections authenticated
        self._creds = credentials if credentials is not None else credentials_of(token, node_tokens)
        # gen -> (node, the token it presented or None, the handler's task): what a revocation cuts
        self._live: dict[int, tuple[str, bytes | None, asyncio.Task[Any]]] = {}
        self._revoked: set[int] = set()
        self.names = NameBounds(dict(name_limits or {}))  # per-node bounds on new device, GPU... names
        self._bind_tls = bind_tls_identity
        self._lock = lock if lock is not None else nullcontext()
        self._hello_timeout = hello_timeout
        self._max_skew_ms = int(max_skew_s * 1000)
        self._wall = wall
        self._last_seq: dict[str, int] = {}  # node -> highest seq handled (survives reconnects)
        self._current: dict[str, int] = {}  # node -> generation of its live stream
        self._gen = 0
        self.counters = dict(streams_total=0, unauthenticated_total=0, identity_refused_total=0,
                             rejected_total=0, batches_ingested_total=0, engine_errors_total=0,
                             revoked_total=0, ras_reports_refused_total=0)
        self.dropped: dict[str, int] = {SEQ_DUPLICATE: 0, SEQ_AHEAD: 0}
        # sent before the hello's ack: agents then leave out what the engine never reads
        read_d = getattr(engine, "read_delta_families", None)
        read_g = getattr(engine, "read_gauge_families", None)
        self._subscription = (Subscription(frozenset(read_d), frozenset(read_g)).to_pb()
                              if read_d is not None and read_g is not None else None)

    # ------------------------------------------------------------ helpers

    def connected_nodes(self) -> list[str]:
        return sorted(self._current)

    def _ingest(self, nb: NodeBatch) -> str:
        """Ingest one batch; the drop reason the node is told (TOLD_DROPS), else "".

        The engine counts its drops by reason (``dropped_by_reason``); the one that moved
        during this call is this batch's."""
        before = getattr(self.engine, "dropped_by_reason", None)
        try:
            with self._lock:
                snap = dict(before) if before is not None else None
                self.engine.ingest(nb)
                if before is not None and snap is not None and before != snap:
                    reason = next((r for r, n in before.items() if n != snap.get(r, 0)), "")
                    return reason if reason in TOLD_DROPS else ""
            return ""
        except Exception as exc:  # an engine bug must not kill the stream or the server
            self.counters["engine_errors_total"] += 1
            log.error("engine_call_failed", call="ingest", error=f"{type(exc).__name__}: {exc}")
            return ""

    def _engine(self, fn: Callable[..., object], *args: object) -> bool:
        try:
            with self._lock:
                fn(*args)
            return True
        except Exception as exc:  # an engine bug must not kill the stream or the server
            self.counters["engine_errors_total"] += 1
            log.error("engine_call_failed", call=getattr(fn, "__name__", "?"), error=f"{type(exc).__name__}: {exc}")
            return False

    @property
    def credentials(self) -> StreamCredentials:
        return self._creds

    @property
    def auth_required(self) -> bool:
        return self._creds.required

    def set_credentials(self, creds: StreamCredentials) -> int:
        """Accept ``creds`` from now on and cut the live streams whose token it no longer accepts
        for their node; the number cut.  Runs on the server's loop (``GrpcServer.set_credentials``
        from other threads)."""
        self._creds = creds
        cut = 0
        for gen, (node, token, task) in list(self._live.items()):
            if token is None or creds.accepts(token, node) or gen in self._revoked:
                continue
            self._revoked.add(gen)
            task.cancel()
            cut += 1
            log.warning("stream_token_revoked", node=node, token=fingerprint(token))
        return cut

    def _check_token(self, context: _Context) -> tuple[str | None, frozenset[str] | None, bytes | None]:
        """(reason, None, None) when refused, else (None, the nodes this credential may speak for
        (None meaning any node), the token presented)."""
        creds = self._creds
        if not creds.required:
            return None, _ANY_NODE, None
        auth = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                auth = value if isinstance(value, str) else value.decode(errors="replace")
                break
        if not auth:
            return "missing bearer token", None, None
        scheme, _, presented = auth.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return "authorization is not a bearer token", None, None
        got = presented.strip().encode()
        # every comparison runs, so the time taken does not tell which token was close
        shared = [hmac.compare_digest(got, t) for t in creds.shared]
        nodes = frozenset(n for n, ts in creds.per_node for t in ts if hmac.compare_digest(got, t))
        if any(shared):
            return None, _ANY_NODE, got
        if nodes:
            return None, nodes, got
        return "wrong bearer token", None, None

    @staticmethod
    def _identities(context: _Context) -> list[str]:
        """The client certificate's CN and subject alternative names (empty without mTLS)."""
        out: list[str] = []
        try:
            ac = context.auth_context() or {}
            for key in ("x509_common_name", "x509_subject_alternative_name"):
                out.extend(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in ac.get(key, ()))
        except Exception:  # no TLS context: no identity
            pass
        return out

    def _seq_ceiling(self) -> int:
        return int(self._wall() * 1000) + self._max_skew_ms

    def drop_counts(self) -> dict[str, int]:
        return dict(self.dropped)

    # ------------------------------------------------------------ the RPC

    async def Stream(self, request_iterator: AsyncIterator[pb.AgentMessage], context: _Context) -> None:
        # context.read()/write() rather than an async generator over the request iterator: one
        # coroutine hop less per message each way, and per message is the aggregator's fixed cost
        relayed = peer = context.peer()
        reason, may_speak_for, presented = self._check_token(context)
        if self.gate is not None:
            real = self.gate.real_peer(relayed)
            if real is None:  # straight to the internal socket: the gate's limit and eviction would not hold it
                reason = "not through the connection gate"
            else:
                peer = real
        if reason is not None:
            self.counters["unauthenticated_total"] += 1
            log.warning("stream_unauthenticated", peer=peer, reason=reason)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
            return
        self.counters["streams_total"] += 1
        try:
            first = await asyncio.wait_for(context.read(), self._hello_timeout)
        except TimeoutError:
            log.warning("stream_refused", peer=peer, reason="no hello in time")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no hello in time")
            return
        if first is grpc.aio.EOF:  # type: ignore[comparison-overlap]  # read() returns EOF too: not in the stubs
            return
        if first.WhichOneof("msg") != "hello":
            reason = f"first message must be a hello, got {first.WhichOneof('msg') or 'nothing'}"
            await self._refuse(context, peer, "", reason)
            return
        try:
            hello = hello_from_pb(first.hello)
        except MalformedBatch as exc:
            await self._refuse(context, peer, first.hello.node[:200], str(exc))
            return
        node = hello.node
        identities = self._identities(context)
        refused = None
        if may_speak_for is not _ANY_NODE and node not in may_speak_for:
            refused = f"this token is not {node}'s"
        elif self._bind_tls and node not in identities:
            refused = f"client certificate names {identities or 'nothing'}, not {node}"
        if refused is not None:
            self.counters["identity_refused_total"] += 1
            log.warning("stream_identity_refused", peer=peer, node=node[:200], reason=refused)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
            return
        self._gen += 1
        gen = self._gen
        previous = self._current.get(node)
        self._current[node] = gen
        task = asyncio.current_task()
        if task is not None:
            self._live[gen] = (node, presented, task)
        if self.gate is not None:  # its connection is no longer evicted at the connection limit
            self.gate.authenticated(relayed)
        log.info("stream_connected", peer=peer, node=node, identity=identities[0] if identities else "",
                 agent_version=hello.agent_version, replaced_stream=previous is not None)
        try:
            if presented is not None and not self._creds.accepts(presented, node):
                # revoked between the token check and here (a reload raced the hello)
                self._revoked.add(gen)
                raise asyncio.CancelledError
            await self._serve(context, peer, node, hello)
        except asyncio.CancelledError:
            if gen not in self._revoked:
                raise  # the server is stopping or the peer went away
            self.counters["revoked_total"] += 1
            if self.gate is not None:
                self.gate.unauthenticated(relayed)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token revoked")
        finally:
            self._live.pop(gen, None)
            self._revoked.discard(gen)
            if self._current.get(node) == gen:
                del self._current[node]
                self._engine(self.engine.disconnected, node)
            log.info("stream_closed", peer=peer, node=node)

    async def _serve(self, context: _Context, peer: str, node: str, hello: NodeHello) -> None:
        self._engine(self.engine.hello, self.names.hello(hello))
        # the session's floor: seqs at or below it were delivered before (replays after a lost ack)
        session_last = self._last_seq.get(node, 0)
        warned_ahead = False
        if self._subscription is not None:
            await context.write(self._subscription)
        await context.write(_ack(session_last))
        # deltas of families the engine never reads are counted, not built (codec.py)
        decoder = SeriesDecoder(read_families=getattr(self.engine, "read_delta_families", None),
                                admit=self.names.admitter(node))
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:  # type: ignore[comparison-overlap]  # read() returns EOF too: not in the stubs
                return
            kind = msg.WhichOneof("msg")
            if kind == "ras_report":
                self._ras_report(node, msg.ras_report)
                continue
            if kind != "batch":
                await self._refuse(context, peer, node, f"unexpected {kind or 'empty'} message after the hello")
                return
            b = msg.batch
            if b.seq <= session_last:
                self.dropped[SEQ_DUPLICATE] += 1
                await context.write(_ack(session_last))
                continue
            try:
                nb = decoder.decode(b, node)
            except MalformedBatch as exc:
                await self._refuse(context, peer, node, str(exc), b.seq)
                return
            if b.seq > self._seq_ceiling():
                # acked so the agent does not resend it; never becomes anyone's floor
                self.dropped[SEQ_AHEAD] += 1
                if not warned_ahead:  # once per session: every batch of a broken agent would repeat it
                    warned_ahead = True
                    log.warning("batch_seq_ahead", peer=peer, node=node, seq=b.seq, ceiling=self._seq_ceiling())
                await context.write(_ack(b.seq, SEQ_AHEAD))
                continue
            dropped = self._ingest(nb)
            self.counters["batches_ingested_total"] += 1
            session_last = b.seq
            if b.seq > self._last_seq.get(node, 0):
                self._last_seq[node] = b.seq
            await context.write(_ack(b.seq, dropped))
            await self._send_ras_queries(context, node)

    async def _send_ras_queries(self, context: _Context, node: str) -> None:
        """NCCL RAS queries the engine planned for this node (aggregator/ras_queries.py), after its ack:
        a node streams a batch every interval, so a query goes down within one."""
        take = getattr(self.engine, "take_ras_queries", None)
        if take is None:
            return
        try:
            with self._lock:
                queries = take(node)
        except Exception as exc:  # an engine bug must not kill the stream
            self.counters["engine_errors_total"] += 1
            log.error("engine_call_failed", call="take_ras_queries", error=f"{type(exc).__name__}: {exc}")
            return
        for q in queries:
            await context.write(q.to_pb())

    def _ras_report(self, node: str, m: pb.RasReport) -> None:
        """An agent's RAS answer: a malformed one is counted and dropped (the node's telemetry goes on)."""
        try:
            rep = report_from_pb(m)
        except BadRasMessage as exc:
            self.counters["ras_reports_refused_total"] += 1
            log.warning("ras_report_refused", node=node, reason=str(exc))
            return
        fn = getattr(self.engine, "ras_report", None)
        if fn is not None:
            self._engine(fn, node, rep)

    async def _refuse(self, context: _Context, peer: str, node: str, reason: str, seq: int = 0) -> None:
        self.counters["rejected_total"] += 1
        log.warning("stream_rejected", peer=peer, node=node, seq=seq, reason=reason)
        await context.write(_reject(reason, seq))
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(reason[:500])


# ---------------------------------------------------------------- server handle


class GrpcServer:
    """Handle of a running server.  ``stop()`` from any thread except the server's
    own loop; ``await aclose()`` on the loop it runs on."""

    def __init__(self) -> None:
        self.server: grpc.aio.Server | None = None
        self.servicer: FabricStreamServicer | None = None
        self.health: Any = None
        self.port: int = 0
        self.host: str = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tls: TlsMaterial | None = None  # with TLS: what new handshakes present (a reload swaps it)
        self.gate: ConnectionGate | None = None  # what listens on the configured address, when it runs
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stats(self) -> dict[str, int]:
        s = dict(self.servicer.counters) if self.servicer else {}
        s["agents_connected"] = len(self.servicer.connected_nodes()) if self.servicer else 0
        drops = self.servicer.drop_counts() if self.servicer else {SEQ_DUPLICATE: 0, SEQ_AHEAD: 0}
        s["batches_duplicate_total"] = drops[SEQ_DUPLICATE]
        refused = self.servicer.names.refused if self.servicer else {}
        for kind in NAME_KINDS:
            s[f"names_refused_{kind}_total"] = refused.get(kind, 0)
        for reason, n in drops.items():
            s[f"batches_dropped_{reason}_total"] = n
        if self.gate is not None:
            s.update(self.gate.stats())
        return s

    def set_credentials(self, creds: StreamCredentials, timeout: float = 10.0) -> int:
        """From any thread but the server's loop: accept ``creds`` from now on, cut the live streams
        whose token it no longer accepts; the number cut."""
        if self.loop is None or self.servicer is None or self._closed:
            return 0
        servicer = self.servicer

        async def _swap() -> int:
            return servicer.set_credentials(creds)

        return asyncio.run_coroutine_threadsafe(_swap(), self.loop).result(timeout)

    async def aclose(self, grace: float = 2.0) -> None:
        if self._closed or self.server is None:
            return
        self._closed = True
        if self.gate is not None:
            self.gate.stop_listening()
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.gate is not None:
            self.gate.abort_all()
            remove_private_socket(self.gate.backend)

    def stop(self, grace: float = 2.0) -> None:
        loop = self.loop
        if loop is None or self._closed:
            return
        if self._thread is None:
            raise RuntimeError("server runs on a caller's loop: use await handle.aclose()")
        fut = asyncio.run_coroutine_threadsafe(self.aclose(grace), loop)
        try:
            fut.result(grace + 5.0)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(5.0)

    async def wait_for_termination(self) -> None:
        if self.server is not None:
            await self.server.wait_for_termination()


def _split_listen(listen: str) -> str:
    host = listen.rpartition(":")[0]
    return host.strip("[]") or "0.0.0.0"


async def start_grpc_server_async(
    engine: EngineLike,
    listen: str,
    token: str | None = None,
    tls: ServerTls | None = None,
    *,
    lock: Any = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    hello_timeout: float = 10.0,
    node_tokens: Mapping[str, str] | None = None,
    credentials: StreamCredentials | None = None,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
    max_connections: int = 1024,
    handshake_timeout: float = 10.0,
    idle_timeout: float = 10.0,
    connection_gate: bool = True,
    _handle: GrpcServer | None = None,
) -> GrpcServer:
    """Start on the running event loop; ``listen`` is HOST:PORT (port 0 picks one).

    With neither ``token``, ``node_tokens`` nor mTLS (``tls.client_ca``) anyone who can
    reach the port may speak for any node: a warning is logged (the service refuses to
    start that way unless its config says ``insecure: true``).

    With ``connection_gate`` (the default) the connection gate (conn_gate.py) listens on ``listen``,
    holds at most ``max_connections`` and evicts unauthenticated ones first; the gRPC server itself
    listens on a Unix socket in a directory only this user may enter, which only the gate connects to."""
    handle = _handle or GrpcServer()
    backend = private_socket_path() if connection_gate else ""
    bind = f"unix:{backend}" if connection_gate else listen
    # behind the gate gRPC's own limit only bounds the relay's connections; room for the gate's
    # evicted connections that gRPC has not yet seen close
    grpc_limit = 2 * max_connections if connection_gate else max_connections
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", 1024 * 1024),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 3),
        ("grpc.so_reuseport", 0),
        # a connection that never sends the HTTP/2 preface (or never finishes TLS) is closed after this,
        # not gRPC's default 120 s; and no more than max_connections at once: a flood of bare TCP
        # connections is refused at the limit instead of exhausting the process's descriptors
        ("grpc.server_handshake_timeout_ms", max(1, int(handshake_timeout * 1000))),
        ("grpc.max_allowed_incoming_connections", grpc_limit),
        # a connection without a call (it finished the handshake, answers PINGs, opens no stream) is sent
        # GOAWAY and closed after this: such connections cannot hold the limit against agents for good
        # (an agent always holds its stream, so it is never idle)
        ("grpc.max_connection_idle_ms", max(1, int(idle_timeout * 1000))),
    ]
    server = grpc.aio.server(options=options)
    mtls = bool(tls and tls.client_ca)
    creds = credentials if credentials is not None else credentials_of(token, node_tokens)
    gate = ConnectionGate(backend, max_connections) if connection_gate else None
    servicer = FabricStreamServicer(engine, credentials=creds, lock=lock, hello_timeout=hello_timeout,
                                    bind_tls_identity=mtls, max_skew_s=max_skew_s, gate=gate)
    pb_grpc.add_FabricStreamServicer_to_server(servicer, server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if tls is not None:
        # dynamic credentials: a reload's new certificate or CA bundle applies to the next handshake
        handle.tls = material = TlsMaterial(tls)
        port = server.add_secure_port(bind, grpc.dynamic_ssl_server_credentials(
            material.config(material.current), material.fetch,
            require_client_authentication=tls.client_ca is not None,
        ))
    else:
        port = server.add_insecure_port(bind)
    if not port:
        if backend:
            remove_private_socket(backend)
        raise RuntimeError(f"gRPC: cannot listen on {bind}")
    await server.start()
    if gate is not None:
        host, _, want = listen.rpartition(":")
        try:
            port = await gate.start(host.strip("[]"), int(want))
        except (OSError, ValueError) as exc:
            await server.stop(0)
            remove_private_socket(backend)
            raise RuntimeError(f"gRPC: cannot listen on {listen}: {exc}") from exc
        handle.gate = gate
    await hs.set("", health_pb2.HealthCheckResponse.SERVING)
    await hs.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    handle.server, handle.servicer, handle.health = server, servicer, hs
    handle.port, handle.host = port, _split_listen(listen)
    handle.loop = asyncio.get_running_loop()
    log.info("grpc_listening", address=handle.address, tls=tls is not None, mtls=mtls,
             connection_gate=gate is not None, max_connections=max_connections,
             token="per-node" if creds.per_node else "shared" if creds.shared else "none")
    if not mtls and not servicer.auth_required:
        log.warning("grpc_insecure", address=handle.address,
                    reason="no token and no mTLS: anyone who reaches this port may speak for any node")
    return handle


def start_grpc_server(
    engine: EngineLike,
    listen: str,
    token: str | None = None,
    tls: ServerTls | None = None,
    **kwargs: Any,
) -> GrpcServer:
    """Start the server on its own event loop in a background thread and return
    once it listens (raises if it cannot).  Stop with ``handle.stop(grace)``."""
    handle = GrpcServer()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    error: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start_grpc_server_async(engine, listen, token, tls, _handle=handle, **kwargs))
        except BaseException as exc:  # report to the caller
            error.append(exc)
            started.set()
            loop.close()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            try:
                pending = asyncio.all_tasks(loop)
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            finally:
                loop.close()

    t = threading.Thread(target=run, name="fabricmon-grpc", daemon=True)
    handle._thread = t
    t.start()
    if not started.wait(30.0):
        raise RuntimeError("gRPC server did not start within 30 s")
    if error:
        raise error[0]
    return handle

