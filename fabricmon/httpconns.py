"""The loop listener's socket and connections (``httploop``): the limit, eviction, deadlines, closes by reason.

The table owns the selector registrations of its connections: a connection is registered only
once it has to wait on its peer (most scrapes are answered in the pass that accepts them), for
reading or for writing (the peer's window was full).  Closed connections are counted by reason,
the counts rendered once per change for the /metrics the listener serves.
"""

from __future__ import annotations

import errno
import selectors
import socket

from .heldio import LibcIO, SocketIO
from .httpserve import AUTH_REFUSALS, CLOSE_REASONS, listener_counters_text

# The send buffer the listener's connections inherit: a whole /metrics (about 200 kB) goes out in
# one sendmsg instead of waiting on the peer's window between pieces (the kernel caps it at wmem_max).
_SNDBUF = 1 << 20
_DEFER_S = 1


def open_listener(host: str, port: int, name: str) -> socket.socket:
    """The non-blocking listening socket; a port already taken raises an OSError whose strerror names ``name``."""
    try:
        listener = socket.create_server((host, port), backlog=128)
    except OSError as exc:
        why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise OSError(exc.errno, f"{name}: cannot listen on {host}:{port}: {why}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
    except OSError:
        pass  # the default buffer only costs more wake-ups for a big body
    listener.setblocking(False)
    defer = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if defer is not None:
        # Woken only once a connection's first bytes (the request) have arrived: the request is
        # read in the pass that accepts it, one wake-up a scrape instead of two.  A client that
        # connects and stays silent waits in the kernel (its SYN-ACK retransmitted) and reaches
        # the loop, and its header deadline, about _DEFER_S later.
        try:
            listener.setsockopt(socket.IPPROTO_TCP, defer, _DEFER_S)
        except OSError:
            pass
    return listener


class Conn:
    __slots__ = ("handle", "buf", "out", "offset", "deadline", "since", "close_after", "linger", "writing",
                 "closed", "registered")

    def __init__(self, handle, now: float, deadline: float) -> None:
        self.handle = handle  # what heldio's calls take and the selector registers
        self.buf = bytearray()
        self.out: list[bytes] = []  # the response not yet taken by the peer, from ``offset`` in the first
        self.offset = 0
        self.deadline = deadline
        self.since = now  # when the current wait on the peer began (the eviction order at the limit)
        self.close_after = False
        self.linger = False  # after the response: FIN, then drain the peer's input before closing
        self.writing = False  # registered for EVENT_WRITE (the peer's window was full)
        self.closed = False
        self.registered = False  # with the selector: only once it has to wait on its peer


class ConnTable:
    """At most ``max_connections`` open connections; at the limit the one waiting on its peer longest makes room."""

    def __init__(self, sel: selectors.BaseSelector, io: SocketIO | LibcIO, max_connections: int) -> None:
        self.max_connections = max_connections
        self.conns: set[Conn] = set()
        self.closed_total = dict.fromkeys(CLOSE_REASONS, 0)
        self.auth_refused_total = dict.fromkeys(AUTH_REFUSALS, 0)  # no auth here: always zero, for the same series
        self._sel = sel
        self._io = io
        self._counters: bytes | None = None

    def __len__(self) -> int:
        return len(self.conns)

    def open(self, handle, now: float, deadline: float) -> Conn:
        """A new connection, after evicting the longest-waiting one at the limit (routes never block,
        so every open connection is waiting on its peer)."""
        if len(self.conns) >= self.max_connections:
            self.close(min(self.conns, key=lambda c: c.since), "limit")
        c = Conn(handle, now, deadline)
        self.conns.add(c)
        return c

    def watch(self, c: Conn) -> None:
        """Register a connection still open after its first pass, for what it waits on."""
        if not c.closed and not c.registered:
            c.registered = True
            self._sel.register(c.handle, selectors.EVENT_WRITE if c.writing else selectors.EVENT_READ, c)

    def wait_write(self, c: Conn) -> None:
        c.writing = True
        if c.registered:
            self._sel.modify(c.handle, selectors.EVENT_WRITE, c)

    def wait_read(self, c: Conn) -> None:
        c.writing = False
        self._sel.modify(c.handle, selectors.EVENT_READ, c)

    def next_deadline(self, default: float) -> float:
        return min((c.deadline for c in self.conns), default=default)

    def expire(self, now: float) -> None:
        """Close every connection past its deadline: a timeout, or the end of a linger (not counted)."""
        for c in [c for c in self.conns if now > c.deadline]:
            self.close(c, None if c.linger else "timeout")

    def close(self, c: Conn, reason: str | None = None) -> None:
        if c.closed:
            return
        c.closed = True
        self.conns.discard(c)
        if reason is not None:
            self.closed_total[reason] += 1
            self._counters = None
        if c.registered:
            try:
                self._sel.unregister(c.handle)
            except (KeyError, ValueError, OSError):
                pass
        self._io.close(c.handle)

    def close_all(self) -> None:
        for c in list(self.conns):
            self.close(c)

    def exposition(self) -> bytes:
        """The counters appended to a /metrics the listener serves (rebuilt when one moved)."""
        if self._counters is None:
            self._counters = listener_counters_text(self.closed_total, self.auth_refused_total)
        return self._counters

    def stats(self) -> dict[str, int]:
        closed, refused = dict(self.closed_total), dict(self.auth_refused_total)
        return {"connections": len(self.conns), "closed_total": sum(closed.values()),
                **{f"closed_{k}": v for k, v in closed.items()}, **{f"auth_{k}": v for k, v in refused.items()}}
