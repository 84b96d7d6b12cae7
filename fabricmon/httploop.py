"""A one-thread, non-blocking HTTP/1.1 server for routes that answer at once (the agent's plain-HTTP listener).

Why not ``httpserve.RoutedHTTPServer``: there a scrape wakes the accept loop, which hands the
connection to a handler thread, which parses the request with http.server; each wake-up waits for
the GIL while the poll or the stream thread runs Python (issue 39: the agent's p99).  Here one
thread accepts, reads and answers in the same pass: a scrape costs one wake-up, a few lines of
parsing and one ``sendmsg`` of the pre-rendered parts (no copy of the body).

This module is the loop and the routing; the jobs it composes live apart: ``httprequest`` parses a
request head (no I/O), ``httpresponse`` builds the response buffers, ``httpconns`` opens the
listening socket and keeps the connection table (limit, eviction, deadlines, closes by reason).

The same bounds as ``httpserve.GuardedHTTPServer``, for the whole life of a connection:

- a request's line and headers within ``header_timeout`` of the start of the wait (the accept, or
  the previous response taken): a client that drips a byte at a time is cut off, not only a silent one;
- each response taken by the peer within ``write_timeout`` (pipelined requests whose responses are
  never read);
- at most ``max_header_bytes`` of request line and headers and ``max_headers`` header lines (431);
- at most ``max_connections`` connections: at the limit the one that has waited on its peer longest
  makes room (routes run in the loop and never block, so every connection is waiting on its peer);
- no request bodies: a GET or HEAD that carries one is answered 400 and closed (it would otherwise
  be read as the next request).

Routes run in the loop thread: they must be quick and must not block (cached bytes, a probe).  No
TLS and no basic auth: a listener with a web config is a ``RoutedHTTPServer`` (the handshake and
bcrypt run in a connection's own thread there).  Closed connections are counted by reason, and a
``/metrics`` route gets the listener's counters appended, as there.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import parse_qs, urlparse

import structlog

from .heldio import LibcIO, SocketIO, held_io
from .httpconns import Conn, ConnTable, open_listener
from .httprequest import BadRequest, header_end, parse_head
from .httpresponse import GzipMembers, HttpDate, build_response, stored_gzip
from .httpserve import TEXT, Chunk, Route, accepts_gzip

__all__ = ["LoopHTTPServer", "stored_gzip"]

log = structlog.get_logger("fabricmon.http")

_ACCEPT_PAUSE = 0.1  # seconds the listener rests after a failed accept (out of descriptors)
_LINGER = 2.0  # seconds an answered connection that is being closed drains the peer's input

_WAKE = object()


class LoopHTTPServer:
    """GET and HEAD routes answered from one selector loop; gzip when the client asks (see the module doc).

    A port already taken raises an OSError whose strerror names the listener (the CLI prints it, exit 2)."""

    def __init__(self, host: str, port: int, routes: dict[str, Route], name: str = "http", *,
                 max_connections: int = 64, header_timeout: float = 10.0, write_timeout: float = 10.0,
                 max_header_bytes: int = 65536, max_headers: int = 100,
                 make_io: Callable[[socket.socket], SocketIO | LibcIO] = held_io) -> None:
        if max_connections < 1 or min(header_timeout, write_timeout) <= 0 or min(max_header_bytes, max_headers) < 1:
            raise ValueError("max_connections, every timeout and every size limit must be positive")
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.write_timeout = write_timeout
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self._routes = dict(routes)
        self._name = name
        self._listener = open_listener(host, port, name)
        self._io = make_io(self._listener)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._conns = ConnTable(self._sel, self._io, max_connections)
        self.closed_total = self._conns.closed_total  # the same dicts: read by the agent's intake metrics
        self.auth_refused_total = self._conns.auth_refused_total
        self._stopping = False
        self._accept_paused_until: float | None = None
        self._gzip = GzipMembers()
        self._date = HttpDate()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- the RoutedHTTPServer interface

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def set_web(self, web) -> None:
        if web is not None:
            raise ValueError(f"{self._name}: a web config (TLS, basic auth) needs the threaded listener")

    def stats(self) -> dict[str, int]:
        return self._conns.stats()

    def exposition(self) -> bytes:
        """This listener's own counters, appended to a /metrics it serves (rebuilt when one moved)."""
        return self._conns.exposition()

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self) -> None:
        """Stop serving (the open connections are closed); the listening socket stays bound until ``stop``."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def close_dead(self) -> None:
        """Release the listening socket of a server whose thread died."""
        try:
            self._listener.close()
        except OSError:
            pass

    def stop(self) -> None:
        self.shutdown()
        if not self._thread.is_alive():
            self._close_all()
        self.close_dead()
        for s in (self._wake_r, self._wake_w):
            s.close()

    # -- the loop

    def _run(self) -> None:
        sel, conns = self._sel, self._conns
        try:
            while not self._stopping:
                now = time.monotonic()
                deadline = conns.next_deadline(now + 0.5)
                if self._accept_paused_until is not None:
                    deadline = min(deadline, self._accept_paused_until)
                events = sel.select(max(0.0, min(deadline - now, 0.5)))
                now = time.monotonic()
                for key, mask in events:
                    c = key.data
                    if c is _WAKE:
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                        continue
                    try:
                        if c is None:
                            self._accept(now)
                        elif c.closed:
                            pass
                        elif mask & selectors.EVENT_WRITE:
                            self._write(c, now)
                        elif mask & selectors.EVENT_READ:
                            self._read(c, now)
                    except Exception as exc:  # a bug must cost one connection, not the listener
                        log.error("http_handler_failed", error=f"{type(exc).__name__}: {exc}")
                        if c is not None:
                            conns.close(c)
                conns.expire(now)
                if self._accept_paused_until is not None and now >= self._accept_paused_until:
                    self._accept_paused_until = None
                    sel.register(self._listener, selectors.EVENT_READ, None)
        finally:
            self._close_all()

    def _close_all(self) -> None:
        self._conns.close_all()
        try:
            self._sel.close()
        except (OSError, RuntimeError):
            pass

    def _accept(self, now: float) -> None:
        # One connection a wake-up (the listener stays readable while more wait): each socket call
        # lets the poll or stream thread take the GIL, so a scrape makes as few as it can.
        try:
            handle = self._io.accept()
        except OSError as exc:
            # Out of descriptors (EMFILE): the listener stays readable, so it is left out of the
            # selector for a moment instead of spinning the loop; the backlog waits meanwhile.
            log.warning("http_accept_failed", listener=self._name, error=exc.strerror or str(exc),
                        retry_in_s=_ACCEPT_PAUSE)
            self._sel.unregister(self._listener)
            self._accept_paused_until = now + _ACCEPT_PAUSE
            return
        if handle is None:
            return
        c = self._conns.open(handle, now, now + self.header_timeout)
        self._read(c, now)  # the request has usually arrived with the connection: no second pass
        self._conns.watch(c)

    def _read(self, c: Conn, now: float) -> None:
        try:
            data = self._io.recv(c.handle)
        except OSError:
            self._conns.close(c)
            return
        if data is None:
            return
        if not data:
            self._conns.close(c)  # the peer is gone, or sent only part of a request
            return
        if c.close_after:
            return  # lingering: what the peer still sends is dropped
        c.buf += data
        self._serve_buffered(c, now)

    def _serve_buffered(self, c: Conn, now: float) -> None:
        """Answer each complete request in the buffer in turn (pipelining), one response in flight at a time."""
        while not c.out and not c.closed and not c.close_after:
            end, blank = header_end(c.buf)
            if end < 0 or end > self.max_header_bytes:
                if end > self.max_header_bytes or len(c.buf) > self.max_header_bytes:
                    self._queue(c, 431, [b"request headers too large\n"], TEXT, close=True)
                    self._write(c, now)
                return
            head = bytes(c.buf[:end])
            del c.buf[:end + blank]
            self._answer(c, head)
            self._write(c, now)

    def _answer(self, c: Conn, head: bytes) -> None:
        try:
            req = parse_head(head, self.max_headers)
        except BadRequest as bad:
            self._queue(c, bad.code, [f"{bad}\n".encode()], TEXT, close=True)
            return
        keep = req.keep_alive
        headless = req.method == "HEAD"
        if req.method not in ("GET", "HEAD"):
            self._queue(c, 501, [f"unsupported method {req.method}\n".encode()], TEXT, close=True)
            return
        if req.body:
            self._queue(c, 400, [b"a GET or HEAD request carries no body\n"], TEXT, close=True, head=headless)
            return
        if req.target.startswith("/"):
            path, _, query = req.target.partition("?")
        else:  # absolute form (a proxy's)
            url = urlparse(req.target)
            path, query = url.path, url.query
        route = self._routes.get(path)
        if route is None:
            self._queue(c, 404, [b"not found\n"], TEXT, close=not keep, head=headless, v10=req.version != "HTTP/1.1")
            return
        try:
            code, body, ctype = route(parse_qs(query) if query else {})
        except Exception as exc:  # a failing route is an answer, not a dead listener
            log.error("http_handler_failed", path=path, error=f"{type(exc).__name__}: {exc}")
            self._queue(c, 500, [b"internal error\n"], TEXT, close=True, head=headless)
            return
        parts = list(body) if isinstance(body, list) else [body]
        if path == "/metrics" and code == 200:
            parts.append(self.exposition())
        self._queue(c, code, parts, ctype, close=not keep, head=headless, v10=req.version != "HTTP/1.1",
                    gzip=accepts_gzip(req.accept_encoding))

    def _queue(self, c: Conn, code: int, parts: Sequence[bytes | Chunk], ctype: str, *, close: bool,
               head: bool = False, v10: bool = False, gzip: bool = False) -> None:
        c.out = build_response(code, parts, ctype, self._date(), close=close, head=head, v10=v10,
                               gzip_member=self._gzip if gzip else None)
        c.offset = 0
        c.close_after = close
        c.linger = close and code >= 400

    def _write(self, c: Conn, now: float) -> None:
        """Send what the peer has not taken; once all is sent: close, or wait for the next request."""
        out = c.out
        while out:
            try:
                sent = self._io.send(c.handle, out, c.offset)
            except OSError:
                self._conns.close(c)
                return
            if sent is None:
                if not c.writing:  # the peer's window is full: wait for it to take the rest, under write_timeout
                    c.deadline, c.since = now + self.write_timeout, now
                    self._conns.wait_write(c)
                return
            sent += c.offset
            while out and sent >= len(out[0]):
                sent -= len(out.pop(0))
            c.offset = sent
        if c.close_after:
            if not (c.linger or c.buf):
                self._conns.close(c)
                return
            # Closing with the peer's bytes unread would reset the connection, and a reset can discard
            # the response before the peer reads it (an error answered mid-request): FIN first, drop
            # what still comes until the peer closes too, at most _LINGER seconds.
            self._io.shutdown_write(c.handle)
            c.buf.clear()
            c.linger = True
            c.deadline, c.since = now + min(_LINGER, self.header_timeout), now
            if c.writing:
                self._conns.wait_read(c)
            return
        c.deadline, c.since = now + self.header_timeout, now  # the next request's wait starts now
        if c.writing:
            self._conns.wait_read(c)
            self._serve_buffered(c, now)  # a pipelined request already read
