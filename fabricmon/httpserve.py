"""Small threaded HTTP servers with GET routes, shared by the agent, the aggregator and the rank intake.

Every listener is bounded for the whole life of a connection: at most
``max_connections`` connections hold a thread, and every wait on the peer has a
deadline: a request's line and headers within ``header_timeout`` (a slowloris
client that drips a byte at a time is cut off, not only one that goes silent),
its body within ``body_timeout`` (a large Content-Length and a stalled body),
each response written within ``write_timeout`` (pipelined requests whose
responses are never read); the server's own work on a request within
``request_timeout``.  When the limit is reached the connection that has waited
on its peer longest (for headers, a body, or to take a response) makes room for
the new one; only when every connection is busy in the server is the new one
refused.  Each closed connection is counted by reason.

Basic auth (a ``WebConfig``) is checked in the handler; a refused check answers
401, and one the WebConfig could not afford to run (too many bcrypt checks at
once) answers 429; both are counted (``fabricmon_http_auth_refused_total``),
and a ``/metrics`` route gets the listener's own counters appended.
"""

from __future__ import annotations

import errno
import gzip
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import structlog

log = structlog.get_logger("fabricmon.http")

TEXT = "text/plain; charset=utf-8"

# Why a listener closed a connection: a fixed set (a self-metric label).
CLOSE_REASONS = ("limit", "timeout")
# Why a request was refused before its route ran (fabricmon_http_auth_refused_total{reason}).
AUTH_REFUSALS = ("wrong", "throttled")


class Chunk:
    """Part of a response body whose gzip form is computed at most once (the agent renders one a poll)."""

    __slots__ = ("data", "_gz", "_lock")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._gz: bytes | None = None
        self._lock = threading.Lock()

    def gzipped(self) -> bytes:
        with self._lock:
            if self._gz is None:
                self._gz = gzip.compress(self.data, compresslevel=6, mtime=0)
            return self._gz


def join_gzip(parts: Sequence[bytes | Chunk]) -> bytes:
    """Concatenated gzip members (RFC 1952 2.2: a gzip file is a series of members; Go's gzip.Reader,
    which Prometheus uses, and every browser read them as one stream): a cached chunk is not recompressed."""
    return b"".join(p.gzipped() if isinstance(p, Chunk) else gzip.compress(p, compresslevel=6, mtime=0)
                    for p in parts if (p.data if isinstance(p, Chunk) else p))


def plain_parts(parts: Sequence[bytes | Chunk]) -> list[bytes]:
    return [p.data if isinstance(p, Chunk) else p for p in parts]


class _Workers:
    """Handler threads kept for the next connection.

    Starting a thread per connection costs more than answering a scrape from a pre-rendered
    body; a finished handler thread instead waits for the next connection, at most ``keep`` of
    them idle (the rest end).  A connection that finds none idle gets a new thread, as before:
    the connection limit, not this pool, bounds how many run."""

    def __init__(self, run: Callable[..., None], name: str, keep: int = 4) -> None:
        self._run = run
        self._name = name
        self._keep = keep
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting on _jobs (or about to): each put is owed to one of them
        self._closed = False

    def submit(self, *job) -> None:
        with self._lock:
            if self._idle and not self._closed:
                self._idle -= 1
                self._jobs.put(job)
                return
        threading.Thread(target=self._work, args=(job,), name=self._name, daemon=True).start()

    def _work(self, job) -> None:
        while job is not None:
            self._run(*job)
            with self._lock:
                if self._closed or self._idle >= self._keep:
                    return
                self._idle += 1
            job = self._jobs.get()

    def close(self) -> None:
        """End the idle threads; busy ones end after their connection (daemon threads: ThreadingMixIn's
        server_close never waited for them either)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)


# A route takes the parsed query string and returns (status, body, content type); the body may be
# a list of parts (bytes or Chunk) so a cached part's gzip form is reused.
Route = Callable[[dict[str, list[str]]], tuple[int, "bytes | list[bytes | Chunk]", str]]


def landing_page(title: str, links: Sequence[str]) -> Route:
    """The small page at / that node_exporter serves: what this is and where the metrics are."""
    items = "".join(f'<li><a href="{p.lstrip("/")}">{p}</a></li>' for p in links)
    body = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>"
            f"<body><h1>{title}</h1><ul>{items}</ul></body></html>\n").encode()
    return lambda q: (200, body, "text/html; charset=utf-8")


def probe(ok: Callable[[], bool], good: bytes, bad: bytes) -> Route:
    """A health or readiness route: 200 with ``good`` when ``ok()``, else 503 with ``bad``."""
    return lambda q: (200, good, TEXT) if ok() else (503, bad, TEXT)


class _Conn:
    __slots__ = ("sock", "deadline", "waiting", "since", "closed")

    def __init__(self, sock: socket.socket, now: float, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.waiting = True  # waiting on the peer: for headers, a body, or to take a response
        self.since = now  # when the current wait (or the server's work) began
        self.closed = False


class GuardedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection limit and per-request deadlines (see the module doc)."""

    daemon_threads = True
    request_queue_size = 128
    ssl_context = None  # set from a WebConfig: TLS per connection (GuardedHandler.setup)
    web = None  # the WebConfig whose basic_auth_users RoutedHTTPServer checks

    def __init__(self, addr, handler, *, max_connections: int = 64, header_timeout: float = 10.0,
                 request_timeout: float = 60.0, body_timeout: float | None = None,
                 write_timeout: float = 10.0) -> None:
        body_timeout = header_timeout if body_timeout is None else body_timeout
        if max_connections < 1 or min(header_timeout, request_timeout, body_timeout, write_timeout) <= 0:
            raise ValueError("max_connections and every timeout must be positive")
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.request_timeout = request_timeout
        self.body_timeout = body_timeout
        self.write_timeout = write_timeout
        self.auth_refused_total = dict.fromkeys(AUTH_REFUSALS, 0)
        self._conns: dict[socket.socket, _Conn] = {}
        self._guard = threading.Lock()
        self.closed_total = dict.fromkeys(CLOSE_REASONS, 0)
        self._exposition: tuple[tuple, bytes] | None = None
        self._workers = _Workers(self.process_request_thread, f"{type(self).__name__}-conn")
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
                    self._kill(min(waiting, key=lambda c: c.since), "limit")
                    refuse = False
            else:
                refuse = False
            if not refuse:
                self._conns[request] = _Conn(request, now, now + self.header_timeout)
        if refuse:
            self.shutdown_request(request)
            return
        self._workers.submit(request, client_address)

    def server_close(self) -> None:
        super().server_close()
        self._workers.close()

    def _kill(self, c: _Conn, reason: str) -> None:
        """Under the guard: wake the handler thread blocked on this socket; it then ends."""
        c.closed = True
        self.closed_total[reason] += 1
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close_connections(self) -> None:
        """End every open connection (at stop): a keep-alive client such as Prometheus would
        otherwise go on being served by its handler thread after the listener is closed."""
        with self._guard:
            for c in self._conns.values():
                if not c.closed:
                    c.closed = True
                    try:
                        c.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def arm(self, sock: socket.socket, timeout: float, waiting: bool) -> None:
        """The connection's next phase: ``waiting`` on the peer (evictable at the limit) or busy in
        the server, until ``timeout`` from now."""
        now = time.monotonic()
        with self._guard:
            c = self._conns.get(sock)
            if c is not None:
                c.deadline = now + timeout
                c.waiting = waiting
                c.since = now

    def rewrap(self, raw: socket.socket, tls: socket.socket) -> None:
        """A connection now speaks TLS: cut-offs shut the TLS socket down (the raw one is detached)."""
        with self._guard:
            c = self._conns.get(raw)
            if c is not None:
                c.sock = tls

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
                    **{f"closed_{k}": v for k, v in self.closed_total.items()},
                    **{f"auth_{k}": v for k, v in self.auth_refused_total.items()}}

    def exposition(self) -> bytes:
        """This listener's own counters, appended to a /metrics it serves."""
        with self._guard:
            closed, refused = dict(self.closed_total), dict(self.auth_refused_total)
        key = (tuple(closed.values()), tuple(refused.values()))
        cached = self._exposition
        if cached is not None and cached[0] == key:
            return cached[1]  # the counters rarely move: most scrapes reuse the last text
        text = listener_counters_text(closed, refused)
        self._exposition = (key, text)
        return text


def listener_counters_text(closed: dict[str, int], refused: dict[str, int]) -> bytes:
    """A listener's own counters (closed connections and refused requests, by reason) as exposition text."""
    lines = ["# HELP fabricmon_http_connections_closed_total HTTP connections this listener cut: at its "
             "connection limit (limit) or past a deadline for headers, body, a response write or the request "
             "(timeout).", "# TYPE fabricmon_http_connections_closed_total counter"]
    lines += [f'fabricmon_http_connections_closed_total{{reason="{k}"}} {v}' for k, v in closed.items()]
    lines += ["# HELP fabricmon_http_auth_refused_total HTTP requests refused before their route: wrong "
              "credentials (wrong, 401) or too many credential checks at once (throttled, 429).",
              "# TYPE fabricmon_http_auth_refused_total counter"]
    lines += [f'fabricmon_http_auth_refused_total{{reason="{k}"}} {v}' for k, v in refused.items()]
    return ("\n".join(lines) + "\n").encode()


class _DeadlineWriter:
    """The handler's ``wfile``: each write is a wait on the peer (it must take the bytes) under
    ``write_timeout``; the connection is busy in the server again afterwards."""

    def __init__(self, handler: GuardedHandler, raw) -> None:
        self._h = handler
        self._raw = raw

    def write(self, data) -> int:
        srv = self._h.server
        srv.arm(self._h._guard_key, srv.write_timeout, waiting=True)
        try:
            return self._raw.write(data)
        finally:
            srv.arm(self._h._guard_key, srv.request_timeout, waiting=False)

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return self._raw.closed


class GuardedHandler(BaseHTTPRequestHandler):
    """Arms the server's deadline for each request: headers first, then the whole request."""

    server: GuardedHTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        # each recv (StreamRequestHandler.setup applies it per connection); the deadline bounds the sum
        self.timeout = self.server.header_timeout  # type: ignore[misc]  # a ClassVar in the stubs
        self._guard_key = self.request
        ctx = getattr(self.server, "ssl_context", None)
        if ctx is not None:
            # The handshake runs here, in the connection's own thread under its deadline, not in the
            # accept loop where one slow client would stall every other.  A plain-HTTP client fails it.
            self.request.settimeout(self.server.header_timeout)
            tls = ctx.wrap_socket(self.request, server_side=True)
            self.server.rewrap(self._guard_key, tls)
            self.request = tls
        super().setup()
        self.wfile = _DeadlineWriter(self, self.wfile)  # type: ignore[assignment]  # write and flush suffice

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.request is not self._guard_key:
                try:
                    self.request.close()
                except OSError:
                    pass

    def handle_one_request(self) -> None:
        self.server.arm(self._guard_key, self.server.header_timeout, waiting=True)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.arm(self._guard_key, self.server.request_timeout, waiting=False)
        return ok

    def read_body(self, n: int) -> bytes | None:
        """The request body (``n`` bytes, checked by the caller), under ``body_timeout``; None when
        it did not all arrive (cut off or the peer closed): nothing of it may be used, and the
        connection is closed without an answer."""
        self.server.arm(self._guard_key, self.server.body_timeout, waiting=True)
        try:
            body = self.rfile.read(n)
        except OSError:
            body = b""
        finally:
            self.server.arm(self._guard_key, self.server.request_timeout, waiting=False)
        if len(body) != n:
            self.close_connection = True
            return None
        return body

    def check_auth(self) -> int:
        """0 when the server's WebConfig lets this request through, else the status to answer
        (401 wrong or missing credentials, 429 too many credential checks at once); counted."""
        web = self.server.web
        if web is None:
            return 0
        verdict = web.check(self.headers.get("Authorization"))
        if verdict == "ok":
            return 0
        reason = "throttled" if verdict == "busy" else "wrong"
        with self.server._guard:
            self.server.auth_refused_total[reason] += 1
        return 429 if verdict == "busy" else 401

    def log_message(self, *args) -> None:
        pass  # scrapes every second would flood the log; structlog is the log


def accepts_gzip(header: str | None) -> bool:
    for item in (header or "").split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


class RoutedHTTPServer:
    """GET and HEAD routes; gzip when the client asks; TLS and basic auth from a ``WebConfig``.

    A port already taken raises an OSError whose strerror names the listener (the CLI prints it, exit 2)."""

    def __init__(self, host: str, port: int, routes: dict[str, Route], name: str = "http", *,
                 max_connections: int = 64, header_timeout: float = 10.0, request_timeout: float = 60.0,
                 write_timeout: float = 10.0, web=None) -> None:
        class Handler(GuardedHandler):
            def do_GET(self) -> None:  # http.server API
                self._serve(head=False)

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def _serve(self, head: bool) -> None:
                refused = self.check_auth()
                if refused == 401:
                    self._send(401, b"Unauthorized\n", TEXT, head, [("WWW-Authenticate", 'Basic realm="fabricmon"')])
                    return
                if refused:
                    self.close_connection = True
                    self._send(429, b"Too many credential checks at once; retry\n", TEXT, head,
                               [("Retry-After", "1")])
                    return
                u = urlparse(self.path)
                route = routes.get(u.path)
                if route is None:
                    self._send(404, b"not found\n", TEXT, head)
                    return
                code, body, ctype = route(parse_qs(u.query))
                parts = body if isinstance(body, list) else [body]
                if u.path == "/metrics" and code == 200:
                    parts = [*parts, self.server.exposition()]
                if accepts_gzip(self.headers.get("Accept-Encoding")):
                    self._send(code, join_gzip(parts), ctype, head, [("Content-Encoding", "gzip"),
                                                                       ("Vary", "Accept-Encoding")])
                else:
                    self._send(code, plain_parts(parts), ctype, head)

            def _send(self, code: int, body: bytes | list[bytes], ctype: str, head: bool = False,
                      extra: Sequence[tuple[str, str]] = ()) -> None:
                chunks = body if isinstance(body, list) else [body]
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(sum(map(len, chunks))))
                for k, v in extra:
                    self.send_header(k, v)
                if self.request_version == "HTTP/0.9":
                    if not head:
                        self.wfile.write(b"".join(chunks))
                    return
                # Headers and body in one write (one copy of the body, one send), and no small last
                # segment left waiting on the peer's delayed ACK (Nagle) behind a separate header write.
                buffer: list[bytes] = self._headers_buffer  # type: ignore[attr-defined]  # send_header's
                buffer.append(b"\r\n")
                if not head:
                    buffer.extend(chunks)
                self.flush_headers()

        try:
            self._server = GuardedHTTPServer((host, port), Handler, max_connections=max_connections,
                                             header_timeout=header_timeout, request_timeout=request_timeout,
                                             write_timeout=write_timeout)
        except OSError as exc:
            why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            # Still an OSError (the rank intake carries on without its listener), with a message the CLI prints.
            raise OSError(exc.errno, f"{name}: cannot listen on {host}:{port}: {why}") from None
        self.set_web(web)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name=name, daemon=True)

    def set_web(self, web) -> None:
        """TLS and basic auth for the connections accepted from now on (a reload rotates certificates)."""
        self._server.web = web
        self._server.ssl_context = web.ssl_context if web is not None else None

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

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close_dead(self) -> None:
        """Release the listening socket of a server whose thread died (``stop()`` would wait for it)."""
        try:
            self._server.server_close()
        except OSError:
            pass

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        self._thread.join(timeout=5)
