"""One RAS status query over TCP, bounded in time and size; every failure an outcome, never an exception.

The exchange is ``ncclras -f json``'s (protocol.py).  The whole query shares one deadline
(``protocol.client_deadline_s``), every read and write is bounded by what is left of it, and the
document by ``max_bytes``.  Blocking: callers run it off their poll thread (agent/ras_query.py).
Only loopback addresses are queried unless ``allow_remote``: the address comes from a job's own
heartbeat line, and an agent must not connect wherever a line tells it to.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass

from . import protocol as p
from .status import MAX_DOCUMENT_BYTES, RasFormatError, RasSummary, parse_status, summarize

# Every way a query ends (the outcome label of the agent's and the aggregator's counters).
OUTCOMES = ("ok", "refused", "unreachable", "timeout", "old_protocol", "bad_reply", "bad_json", "too_large",
            "not_local", "bad_address")
LINE_MAX = 4096  # a handshake reply is one short line (client.cc reads into 1,024 bytes)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@dataclass(frozen=True, slots=True)
class QueryResult:
    outcome: str
    detail: str
    seconds: float
    summary: RasSummary | None = None
    server_protocol: int = 0


class _Fail(Exception):
    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Conn:
    def __init__(self, sock: socket.socket, deadline: float, max_bytes: int) -> None:
        self.sock = sock
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.buf = bytearray()

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Fail("timeout", "no complete answer before the deadline")
        return left

    def send(self, data: bytes) -> None:
        self.sock.settimeout(self._left())
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise _Fail("timeout", "the server did not take the command in time") from None

    def _recv(self) -> bytes:
        self.sock.settimeout(self._left())
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise _Fail("timeout", "no complete answer before the deadline") from None

    def line(self, what: str) -> str:
        while b"\n" not in self.buf:
            if len(self.buf) > LINE_MAX:
                raise _Fail("bad_reply", f"{what}: a reply line longer than {LINE_MAX} bytes")
            chunk = self._recv()
            if not chunk:
                raise _Fail("bad_reply", f"{what}: the server closed the connection")
            self.buf += chunk
        raw, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return raw.decode("utf-8", "replace").rstrip("\r")

    def rest(self) -> bytes:
        """Everything until the server closes (it does after a status)."""
        while True:
            if len(self.buf) > self.max_bytes:
                raise _Fail("too_large", f"status document over {self.max_bytes} bytes")
            chunk = self._recv()
            if not chunk:
                return bytes(self.buf)
            self.buf += chunk


def query_status(addr: str, *, ras_timeout_s: int = p.LEG_TIMEOUT_S, connect_timeout_s: float = 1.0,
                 max_bytes: int = MAX_DOCUMENT_BYTES, allow_remote: bool = False,
                 deadline_s: float | None = None) -> QueryResult:
    """Query the RAS at ``addr`` (NCCL_RAS_ADDR syntax) for its JSON status."""
    t0 = time.monotonic()
    total = deadline_s if deadline_s is not None else p.client_deadline_s(ras_timeout_s)

    def done(outcome: str, detail: str, summary: RasSummary | None = None, proto: int = 0) -> QueryResult:
        return QueryResult(outcome, detail[:300], round(time.monotonic() - t0, 3), summary, proto)

    try:
        host, port = p.parse_addr(addr)
    except p.BadAddress as exc:
        return done("bad_address", f"{addr[:80]!r}: {exc}")
    if not allow_remote and not is_loopback(host):
        return done("not_local", f"{host} is not a loopback address (only this node's RAS is queried)")
    sock: socket.socket | None = None
    proto = 0
    try:
        try:
            sock = socket.create_connection((host, port), timeout=min(connect_timeout_s, total))
        except ConnectionRefusedError:
            return done("refused", f"{host}:{port} refused the connection (RAS off, NCCL_RAS_ADDR elsewhere, "
                                   "or no NCCL process there)")
        except TimeoutError:
            return done("timeout", f"connecting to {host}:{port} took over {connect_timeout_s:g} s")
        except OSError as exc:
            return done("unreachable", f"{host}:{port}: {exc.strerror or exc}")
        c = _Conn(sock, t0 + total, max_bytes)
        c.send(p.HELLO)
        hello = c.line("CLIENT PROTOCOL")
        v = p.server_protocol(hello)
        if v is None:
            raise _Fail("bad_reply", f"CLIENT PROTOCOL answered {hello[:80]!r}, not SERVER PROTOCOL")
        proto = v  # a different version: ncclras warns and goes on, and so does this
        c.send(p.timeout_command(ras_timeout_s))
        ans = c.line("TIMEOUT")
        if not p.is_ok(ans):
            raise _Fail("bad_reply", f"TIMEOUT answered {ans[:80]!r}")
        c.send(p.SET_JSON)
        ans = c.line("SET FORMAT")
        if p.is_error(ans):
            raise _Fail("old_protocol", f"SET FORMAT json answered {ans[:80]!r}: NCCL older than 2.28.7 (text only)")
        if not p.is_ok(ans):
            raise _Fail("bad_reply", f"SET FORMAT answered {ans[:80]!r}")
        c.send(p.STATUS)
        doc = c.rest()
        st = parse_status(doc)
        return done("ok", f"{len(doc)} bytes, NCCL {st.nccl_version}", summarize(st), proto)
    except _Fail as f:
        return done(f.outcome, f.detail, proto=proto)
    except RasFormatError as exc:
        return done(exc.outcome, exc.detail, proto=proto)
    except ConnectionResetError:
        return done("bad_reply", "the server reset the connection", proto=proto)
    except OSError as exc:
        return done("unreachable", f"{type(exc).__name__}: {exc.strerror or exc}", proto=proto)
    finally:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
