"""The rank intake's listeners: the Unix stream socket and the loopback ``POST /v1/ranks`` endpoint.

Each hands the lines it reads to a ``LineSink`` (``intake.RankIntake``: ``submit_line`` / ``submit_lines``,
``reject`` for a line over ``MAX_LINE_BYTES``) with the line's source (``Peer``), and bounds its clients:
``max_connections`` (the least recently active Unix client makes room), ``idle_timeout`` without a byte,
HTTP request headers within ``HTTP_HEADER_TIMEOUT`` and bodies up to ``MAX_HTTP_BODY``.  A Unix client
that half-closes is answered with one JSON line of its accepted and rejected counts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import socket
import stat
import struct
import threading
import time
from typing import Protocol, cast

import structlog

from ..httpserve import CLOSE_REASONS, GuardedHandler, GuardedHTTPServer
from ..rank_timing import MAX_LINE_BYTES

log = structlog.get_logger("fabricmon.intake")

MAX_HTTP_BODY = 4 * 1024 * 1024
HTTP_HEADER_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    """Where a line came from.  ``user`` owns ranks and job slots ("uid:1000", "http", "api");
    ``who`` is what a log names (with the pid)."""

    user: str
    who: str


API_PEER = Peer("api", "api")
HTTP_PEER = Peer("http", "http:loopback")


class LineSink(Protocol):
    def submit_line(self, raw: bytes | str, *, origin: str = ..., peer: Peer = ...) -> tuple[bool, str]: ...

    def submit_lines(self, data: bytes | str, *, origin: str = ...,
                     peer: Peer = ...) -> tuple[int, int, list[str]]: ...

    def reject(self, reason: str, message: str, origin: str) -> tuple[bool, str]: ...


def unix_peer(conn: socket.socket) -> Peer:
    """The peer credential of a Unix stream connection (Linux ``SO_PEERCRED``)."""
    try:
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
    except (OSError, AttributeError, struct.error):
        return Peer("unix:unknown", "unix:unknown")
    return Peer(f"uid:{uid}", f"uid:{uid} pid:{pid}")


class UnixListener:
    """The Unix socket's accept-and-read loop on one thread; ``closed`` counts closed clients by reason and
    ``clients`` the ones connected (both under ``lock``, the intake's, which its stats read under)."""

    def __init__(self, intake: LineSink, lock: threading.Lock, stop: threading.Event, *,
                 max_connections: int, idle_timeout: float) -> None:
        self.intake = intake
        self._lock = lock
        self._stop = stop
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)
        self.clients = 0
        self._sock: socket.socket | None = None

    def close(self, path: str | None) -> None:
        """Close the listening socket (after the loop's thread ended) and remove its file."""
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        try:
            if path and stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:
            pass

    def start(self, path: str, mode: int) -> threading.Thread:
        d = os.path.dirname(path) or "."
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o750, exist_ok=True)
            os.chmod(d, 0o750)  # makedirs applies the umask
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise RuntimeError(f"{path}: exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(0.2)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # stale socket of a previous run
            else:
                raise RuntimeError(f"{path}: another process is listening on it")
            finally:
                probe.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        os.chmod(path, mode)
        s.listen(128)
        s.setblocking(False)
        self._sock = s
        t = threading.Thread(target=self._loop, args=(s,), name="fabricmon-intake-uds", daemon=True)
        t.start()
        log.info("rank_intake_listening", socket=path)
        return t

    def _loop(self, lsock: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(lsock, selectors.EVENT_READ, None)
        bufs: dict[socket.socket, bytearray] = {}
        peers: dict[socket.socket, Peer] = {}
        counts: dict[socket.socket, list] = {}  # -> [accepted, rejected, first reasons]
        active: dict[socket.socket, float] = {}  # -> last byte received (monotonic); insertion order = LRU
        skipping: set[socket.socket] = set()

        def close(c: socket.socket, reason: str | None = None) -> None:
            sel.unregister(c)
            bufs.pop(c, None)
            peers.pop(c, None)
            counts.pop(c, None)
            active.pop(c, None)
            skipping.discard(c)
            c.close()
            with self._lock:
                self.clients = len(bufs)
                if reason:
                    self.closed[reason] += 1

        def submit(c: socket.socket, line: bytes) -> None:
            ok, reason = self.intake.submit_line(line, origin="unix", peer=peers.get(c, API_PEER))
            n = counts.setdefault(c, [0, 0, []])
            n[0 if ok else 1] += 1
            if not ok and len(n[2]) < 10:
                n[2].append(reason)

        def answer(c: socket.socket) -> None:
            """The client half-closed: tell it what became of its lines (best effort, never blocks)."""
            a, r, reasons = counts.get(c, [0, 0, []])
            try:
                c.send((json.dumps({"accepted": a, "rejected": r, "errors": reasons}) + "\n").encode())
            except OSError:
                pass

        def touch(c: socket.socket, now: float) -> None:
            active.pop(c, None)
            active[c] = now

        next_sweep = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_sweep:  # idle clients (a slowloris or a hung rank) give their slot back
                    next_sweep = now + min(0.2, self.idle_timeout / 4)
                    for c in [c for c, t in active.items() if now - t > self.idle_timeout]:
                        close(c, "timeout")
                for key, _ in sel.select(timeout=min(0.2, self.idle_timeout / 4)):
                    try:
                        if key.data is None:
                            try:
                                conn, _ = lsock.accept()
                            except OSError:
                                continue
                            if len(bufs) >= self.max_connections:
                                close(next(iter(active)), "limit")  # the least recently active one
                            conn.setblocking(False)
                            peers[conn] = unix_peer(conn)
                            sel.register(conn, selectors.EVENT_READ, "c")
                            bufs[conn] = bytearray()
                            touch(conn, time.monotonic())
                            with self._lock:
                                self.clients = len(bufs)
                            continue
                        c = cast(socket.socket, key.fileobj)  # the rest are client connections
                        if c not in bufs:
                            continue  # closed earlier in this round
                        try:
                            chunk = c.recv(65536)
                        except BlockingIOError:
                            continue
                        except OSError:
                            chunk = b""
                        buf = bufs[c]
                        if not chunk:
                            if buf.strip() and c not in skipping:
                                submit(c, bytes(buf))  # last line without newline
                            answer(c)
                            close(c)
                            continue
                        touch(c, time.monotonic())
                        buf += chunk
                        while True:
                            nl = buf.find(b"\n")
                            if nl < 0:
                                break
                            line = bytes(buf[:nl])
                            del buf[:nl + 1]
                            if c in skipping:
                                skipping.discard(c)  # end of an over-long line
                                continue
                            if line.strip():
                                submit(c, line)
                        if len(buf) > MAX_LINE_BYTES:
                            if c not in skipping:
                                self.intake.reject("too_long", f"line longer than {MAX_LINE_BYTES} bytes", "unix")
                            skipping.add(c)
                            buf.clear()
                    except Exception as exc:  # never let one client stop the loop
                        log.error("rank_intake_error", error=f"{type(exc).__name__}: {exc}")
                        if key.data is not None and key.fileobj in bufs:
                            try:
                                close(key.fileobj)
                            except Exception:
                                pass
        finally:
            for c in list(bufs):
                close(c)
            sel.close()


def start_http(intake: LineSink, addr: tuple[str, int], *, max_connections: int,
               idle_timeout: float) -> tuple[GuardedHTTPServer, threading.Thread]:
    """Serve ``POST /v1/ranks`` on loopback ``addr`` on its own thread; the server and that thread."""

    class Handler(GuardedHandler):
        server_version = "fabricmon-intake"

        def _reply(self, code: int, obj: dict) -> None:
            body = (json.dumps(obj) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # http.server API
            if self.path.split("?")[0] != "/v1/ranks":
                self._reply(404, {"error": "not found; POST /v1/ranks"})
                return
            try:
                n = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                self._reply(411, {"error": "Content-Length required"})
                return
            if n < 0 or n > MAX_HTTP_BODY:
                self.close_connection = True
                self._reply(413, {"error": f"body over {MAX_HTTP_BODY} bytes"})
                return
            body = self.read_body(n)  # under body_timeout: a stalled body is cut, and evictable
            if body is None:
                return  # cut off before it all arrived: a partial body is never read as lines
            acc, rej, reasons = intake.submit_lines(body, origin="http", peer=HTTP_PEER)
            self._reply(200 if acc or not rej else 400, {"accepted": acc, "rejected": rej, "errors": reasons})

        def do_GET(self):
            if self.path == "/healthz":
                self._reply(200, {"status": "ok"})
            else:
                self._reply(405 if self.path == "/v1/ranks" else 404, {"error": "POST /v1/ranks"})

    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET

    class Server(GuardedHTTPServer):
        address_family = family

    server = Server(addr, Handler, max_connections=max_connections,
                    header_timeout=min(idle_timeout, HTTP_HEADER_TIMEOUT), request_timeout=60.0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                         name="fabricmon-intake-http", daemon=True)
    t.start()
    log.info("rank_intake_listening", http=f"{addr[0]}:{server.server_address[1]}")
    return server, t
