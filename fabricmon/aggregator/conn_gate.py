"""The connection gate in front of the aggregator's gRPC server (issue 35, item 1).

gRPC's own connection limit (``grpc.max_allowed_incoming_connections``) refuses the newest connection
once the limit is held, whoever holds it: a peer without any credential that keeps re-opening
connections which answer PINGs and never carry a call (or carry only refused calls) holds it again
after every idle close, and a real agent's new connection is refused.  grpcio offers no hook to
evict a chosen connection, so the gate owns the listening socket instead: it accepts on
``grpc_listen``, opens one connection to the gRPC server for each, and relays bytes both ways
untouched (TLS ends in the gRPC server as before).  The gRPC server listens on a Unix socket in a
directory only the aggregator's user may enter, so no other local user reaches it past the gate.
The servicer tells the gate when a connection carries a stream whose credential validated
(``authenticated``), mapping gRPC's ``context.peer()`` (the relay connection's own random abstract
name) back to the gate connection; the gate gives the real peer address back for logs
(``real_peer``).  At the limit a new connection evicts the
unauthenticated connection ``EvictionOrder`` picks (conn_eviction.py); with every connection
authenticated the new one is refused.

The relay runs on the gRPC server's event loop with asyncio buffered protocols (no task per read,
reads into one shared buffer, flow control by pausing the other side's reads), so each chunk costs
one callback, one recv_into, a copy of what was read and one send.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from .conn_eviction import EvictionOrder

log = structlog.get_logger("fabricmon.grpc.gate")

EVICTED_UNAUTHENTICATED = "unauthenticated"  # fabricmon_grpc_connections_evicted_total{reason}
REFUSED_LIMIT = "limit"  # every connection authenticated: the new one is refused
REFUSED_BACKEND = "backend"  # the internal gRPC socket did not accept the relay's connection
BACKLOG = 4096  # the kernel's queue of connections not yet accepted (clamped to net.core.somaxconn)
# connections accepted per readiness event before the gate judges any: each holds a descriptor until then
ACCEPT_BURST = 8


def grpc_peer(addr: Any) -> tuple[str, str]:
    """(host, gRPC-style peer ``ipv4:H:P`` / ``ipv6:[H]:P``) of a socket address; IPv4-mapped IPv6
    addresses are IPv4 (a dual-stack listener sees IPv4 agents that way)."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return str(addr), f"unix:{addr}"
    host, port = str(addr[0]), addr[1]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    if ":" in host:
        return host, f"ipv6:[{host}]:{port}"
    return host, f"ipv4:{host}:{port}"


READ_BUFFER = 256 * 1024
LOG_EVERY_S = 10.0  # a flood evicts thousands a second: one log line per reason this often, with the count


class _LogThrottle:
    """The first event of a kind is logged; later ones at most every ``LOG_EVERY_S`` with how many."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def __call__(self, kind: str) -> int:
        """How many events of ``kind`` the line to log now stands for (0: do not log)."""
        now = self._clock()
        self._since[kind] = self._since.get(kind, 0) + 1
        last = self._last.get(kind)
        if last is not None and now - last < LOG_EVERY_S:
            return 0
        self._last[kind] = now
        return self._since.pop(kind)


@dataclass(eq=False)
class GateConn:
    cid: int
    host: str
    peer: str
    outer: Any  # asyncio.Transport to the client
    inner: Any = None  # asyncio.Transport to the gRPC server, once connected
    inner_key: str = ""  # what gRPC's context.peer() says for the relay's connection
    authenticated: bool = False
    closed: bool = field(default=False)

    def abort(self) -> None:
        self.closed = True
        for t in (self.outer, self.inner):
            if t is not None:
                t.abort()


class _Inner(asyncio.BufferedProtocol):
    """The relay's side toward the gRPC server."""

    def __init__(self, outer: _Outer) -> None:
        self.outer = outer
        self.buf = outer.gate.buf

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.outer.transport.write(self.buf[:nbytes].tobytes())

    def pause_writing(self) -> None:  # the gRPC server reads slower than the client sends
        self.outer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.outer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.outer.transport.close()  # after what is buffered toward the client


class _Outer(asyncio.BufferedProtocol):
    """The relay's side toward the client (an agent, a probe, anyone)."""

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self.buf = gate.buf
        self.transport: Any = None
        self.conn: GateConn | None = None
        self.early: list[bytes] = []  # what the client sent before the backend connection was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn = self.gate._admit(transport)
        if self.conn is None:
            transport.abort()
            return
        # nothing to relay to until the backend connection is up.  Python 3.10 and early 3.11 (Debian 12's
        # 3.11.2) ignore a pause from connection_made (CPython gh-103607: the transport adds its reader after
        # this returns), so what the client sends meanwhile is still read there: buffer_updated keeps it
        transport.pause_reading()
        fut = asyncio.get_running_loop().create_task(self._open_backend())
        fut.add_done_callback(self._connected)

    async def _open_backend(self) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        """A Unix connection to the gRPC server, bound to a random abstract name first: gRPC reports it as
        the stream's peer (``unix-abstract:NAME``), which names this connection.  Random, not counted,
        so a local user cannot take the next name first."""
        loop = asyncio.get_running_loop()
        conn = self.conn
        assert conn is not None
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.setblocking(False)
            name = f"fabricmon-gate-{secrets.token_hex(12)}"
            s.bind("\0" + name)
            conn.inner_key = "unix-abstract:" + name
            self.gate._by_key[conn.inner_key] = conn
            await loop.sock_connect(s, self.gate.backend)
            return await loop.create_unix_connection(lambda: _Inner(self), sock=s)
        except BaseException:
            s.close()
            raise

    def _connected(self, fut: asyncio.Task[tuple[asyncio.Transport, asyncio.BaseProtocol]]) -> None:
        conn = self.conn
        assert conn is not None
        if fut.cancelled() or fut.exception() is not None:
            self.gate._refused(REFUSED_BACKEND, conn.peer, str(fut.exception()) if not fut.cancelled() else "")
            self.transport.abort()
            return
        inner, _ = fut.result()
        if conn.closed:  # evicted or gone while connecting
            inner.abort()
            return
        conn.inner = inner
        if self.early:  # the client's first bytes (its HTTP/2 preface), read before the backend was up
            inner.write(b"".join(self.early))
            self.early.clear()
        self.transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        if conn is not None and conn.inner is not None:
            conn.inner.write(self.buf[:nbytes].tobytes())
        elif conn is not None:  # read despite the pause in connection_made: kept for the backend, not dropped
            self.early.append(self.buf[:nbytes].tobytes())
            # and paused for real: resume then pause removes the reader that pause left in place, so at most
            # one read is held per connection until the backend connection is up
            self.transport.resume_reading()
            self.transport.pause_reading()

    def pause_writing(self) -> None:  # the client reads slower than the gRPC server sends
        if self.conn is not None and self.conn.inner is not None:
            self.conn.inner.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and self.conn.inner is not None:
            self.conn.inner.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn is None:
            return
        conn.closed = True
        if conn.inner is not None:
            conn.inner.close()  # after what is buffered toward the server
        self.gate._forget(conn)


def private_socket_path() -> str:
    """A Unix socket path in a new directory only this user may enter (0700): where the gRPC server
    listens behind the gate, out of other local users' reach.  ``remove_private_socket`` removes it."""
    base = tempfile.mkdtemp(prefix="fabricmon-grpc-")
    if len(base) > 80:  # a Unix socket address holds 108 bytes: a long TMPDIR falls back to /tmp
        os.rmdir(base)
        base = tempfile.mkdtemp(prefix="fabricmon-grpc-", dir="/tmp")
    return os.path.join(base, "grpc.sock")


def remove_private_socket(path: str) -> None:
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


class ConnectionGate:
    """Listens for gRPC clients and relays each to the gRPC server on the Unix socket ``backend``; at
    most ``limit`` connections, unauthenticated ones evicted first.  Runs on the event loop it is
    started on; every method is called from that loop."""

    def __init__(self, backend: str, limit: int) -> None:
        self.backend, self.limit = backend, max(1, limit)
        self.conns: dict[int, GateConn] = {}
        self.order: EvictionOrder[int] = EvictionOrder()
        self._by_key: dict[str, GateConn] = {}
        self._next = 0
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self.evicted: dict[str, int] = {EVICTED_UNAUTHENTICATED: 0}
        self.refused: dict[str, int] = {REFUSED_LIMIT: 0, REFUSED_BACKEND: 0}
        self._throttle = _LogThrottle()
        # every read lands here and is copied out at once (the loop runs one callback at a time): not a
        # buffer per connection, nor the 256 KiB bytes object asyncio's recv() allocates for each read
        self.buf = memoryview(bytearray(READ_BUFFER))

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (``::`` dual-stack where the system has it, like gRPC's ``[::]``);
        the port it listens on."""
        if host in ("::", "") and socket.has_dualstack_ipv6():
            sock = socket.create_server(("::", port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=True)
        else:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            sock = socket.create_server(infos[0][4][:2], family=infos[0][0], backlog=BACKLOG)
        # asyncio accepts up to ``backlog`` connections per event and listens with it: a small burst, then
        # the kernel's queue set back to BACKLOG so agents' connections wait there during a flood
        self._server = await asyncio.get_running_loop().create_server(lambda: _Outer(self), sock=sock,
                                                                      backlog=ACCEPT_BURST)
        sock.listen(BACKLOG)
        self.port = sock.getsockname()[1]
        return self.port

    def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def abort_all(self) -> None:
        self.stop_listening()
        for conn in list(self.conns.values()):
            conn.abort()
            self._forget(conn)

    # ------------------------------------------------------------ admission

    def _admit(self, transport: asyncio.BaseTransport) -> GateConn | None:
        host, peer = grpc_peer(transport.get_extra_info("peername"))
        if len(self.conns) >= self.limit:
            victim = self.order.victim()
            if victim is None:
                self._refused(REFUSED_LIMIT, peer, "every connection carries an authenticated stream")
                return None
            gone = self.conns[victim]
            self.evicted[EVICTED_UNAUTHENTICATED] += 1
            n = self._throttle("evicted")
            if n:
                log.warning("grpc_connection_evicted", peer=gone.peer, reason=EVICTED_UNAUTHENTICATED, by=peer,
                            limit=self.limit, evicted=n)
            gone.abort()
            self._forget(gone)
        self._next += 1
        conn = GateConn(self._next, host, peer, transport)
        self.conns[conn.cid] = conn
        self.order.add(conn.cid, host)
        return conn

    def _refused(self, reason: str, peer: str, detail: str) -> None:
        self.refused[reason] += 1
        n = self._throttle(reason)
        if n:
            log.warning("grpc_connection_refused", peer=peer, reason=reason, detail=detail, limit=self.limit,
                        refused=n)

    def _forget(self, conn: GateConn) -> None:
        self.conns.pop(conn.cid, None)
        self.order.remove(conn.cid)
        if conn.inner_key and self._by_key.get(conn.inner_key) is conn:
            del self._by_key[conn.inner_key]

    # ------------------------------------------------------------ what the servicer tells and asks

    def _conn_of(self, inner_peer: str) -> GateConn | None:
        return self._by_key.get(inner_peer)

    def real_peer(self, inner_peer: str) -> str | None:
        """The client's address for gRPC's peer of a relayed connection; None when it did not come
        through the gate (a connection straight to the internal socket, or one already evicted)."""
        conn = self._conn_of(inner_peer)
        return conn.peer if conn is not None else None

    def authenticated(self, inner_peer: str) -> None:
        """The connection carries a stream whose credential validated: never evicted from now on."""
        conn = self._conn_of(inner_peer)
        if conn is not None and not conn.authenticated:
            conn.authenticated = True
            self.order.remove(conn.cid)

    def unauthenticated(self, inner_peer: str) -> None:
        """The credential its stream presented was revoked: a candidate again (as the newest)."""
        conn = self._conn_of(inner_peer)
        if conn is not None and conn.authenticated:
            conn.authenticated = False
            self.order.add(conn.cid, conn.host)

    def stats(self) -> dict[str, int]:
        unauth = len(self.order)
        s = {"connections_authenticated": len(self.conns) - unauth, "connections_unauthenticated": unauth,
             "connections_limit": self.limit}
        for reason, n in self.evicted.items():
            s[f"connections_evicted_{reason}_total"] = n
        for reason, n in self.refused.items():
            s[f"connections_refused_{reason}_total"] = n
        return s
