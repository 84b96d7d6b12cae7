"""Small threaded HTTP servers with GET routes, shared by the agent, the aggregator and the rank intake.

Every listener is bounded: at most ``max_connections`` connections hold a
thread, a request's line and headers must arrive within ``header_timeout``
(a slowloris client that drips a byte at a time is cut off, not only one that
goes silent), and the whole request within ``request_timeout``.  When the
limit is reached the connection that has waited longest for its request
headers (a keep-alive idler or a slow client) makes room for the new one; only
when every connection is busy serving is the new one refused.  Each closed
connection is counted by reason.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import structlog

log = structlog.get_logger("fabricmon.http")

TEXT = "text/plain; charset=utf-8"

# Why a listener closed a connection: a fixed set (a self-metric label).
CLOSE_REASONS = ("limit", "timeout")

# A route takes the parsed query string and returns (status, body, content type).
Route = Callable[[dict[str, list[str]]], tuple[int, bytes, str]]


def probe(ok: Callable[[], bool], good: bytes, bad: bytes) -> Route:
    """A health or readiness route: 200 with ``good`` when ``ok()``, else 503 with ``bad``."""
    return lambda q: (200, good, TEXT) if ok() else (503, bad, TEXT)


class _Conn:
    __slots__ = ("sock", "deadline", "waiting", "closed")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.waiting = True  # waiting for a request line and headers
        self.closed = False


class GuardedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection limit and per-request deadlines (see the module doc)."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr, handler, *, max_connections: int = 64, header_timeout: float = 10.0,
                 request_timeout: float = 60.0) -> None:
        if max_connections < 1 or header_timeout <= 0 or request_timeout <= 0:
            raise ValueError("max_connections, header_timeout and request_timeout must be positive")
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.request_timeout = request_timeout
        self._conns: dict[socket.socket, _Conn] = {}
        self._guard = threading.Lock()
        self.closed_total = dict.fromkeys(CLOSE_REASONS, 0)
        super().__init__(addr, handler)

    # -- connection bookkeeping (called from the accept thread and handler threads)

    def process_request(self, request, client_address) -> None:
        now = time.monotonic()
        with self._guard:
            live = [c for c in self._conns.values() if not c.closed]
            if len(live) >= self.max_connections:
                waiting = [c for c in live if c.waiting]
                if not waiting:
                    self.closed_total["limit"] += 1
                    refuse = True
                else:
                    self._kill(min(waiting, key=lambda c: c.deadline), "limit")
                    refuse = False
            else:
                refuse = False
            if not refuse:
                self._conns[request] = _Conn(request, now + self.header_timeout)
        if refuse:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _kill(self, c: _Conn, reason: str) -> None:
        """Under the guard: wake the handler thread blocked on this socket; it then ends."""
        c.closed = True
        self.closed_total[reason] += 1
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def arm(self, sock: socket.socket, timeout: float, waiting: bool) -> None:
        with self._guard:
            c = self._conns.get(sock)
            if c is not None:
                c.deadline = time.monotonic() + timeout
                c.waiting = waiting

    def shutdown_request(self, request) -> None:
        with self._guard:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        # serve_forever calls this every poll interval: cut off connections past their deadline
        now = time.monotonic()
        with self._guard:
            for c in self._conns.values():
                if not c.closed and now > c.deadline:
                    self._kill(c, "timeout")

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return  # a client that went away mid-request, or was cut off (counted), is routine
        log.error("http_handler_failed", error=f"{type(exc).__name__}: {exc}")

    def stats(self) -> dict[str, int]:
        with self._guard:
            live = sum(1 for c in self._conns.values() if not c.closed)
            return {"connections": live, "closed_total": sum(self.closed_total.values()),
                    **{f"closed_{k}": v for k, v in self.closed_total.items()}}


class GuardedHandler(BaseHTTPRequestHandler):
    """Arms the server's deadline for each request: headers first, then the whole request."""

    server: GuardedHTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.header_timeout  # each recv; the deadline bounds the sum
        super().setup()

    def handle_one_request(self) -> None:
        self.server.arm(self.connection, self.server.header_timeout, waiting=True)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.arm(self.connection, self.server.request_timeout, waiting=False)
        return ok

    def log_message(self, *args) -> None:
        pass  # scrapes every second would flood the log; structlog is the log


class RoutedHTTPServer:
    def __init__(self, host: str, port: int, routes: dict[str, Route], name: str = "http", *,
                 max_connections: int = 64, header_timeout: float = 10.0, request_timeout: float = 60.0) -> None:
        class Handler(GuardedHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                u = urlparse(self.path)
                route = routes.get(u.path)
                if route is None:
                    self._send(404, b"not found\n", TEXT)
                    return
                self._send(*route(parse_qs(u.query)))

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = GuardedHTTPServer((host, port), Handler, max_connections=max_connections,
                                         header_timeout=header_timeout, request_timeout=request_timeout)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name=name, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def max_connections(self) -> int:
        return self._server.max_connections

    def stats(self) -> dict[str, int]:
        return self._server.stats()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
