"""Rank-timing intake on the node: a Unix socket and a loopback HTTP endpoint.

Training processes send JSON lines (``fabricmon.rank_timing``), one per step:
over the Unix socket (stream; the socket's directory is created 0750, the
socket 0660, so ranks need the agent's group) or ``POST /v1/ranks`` on
127.0.0.1:9723 with a JSON-lines body (the answer gives the accepted and
rejected counts).  The HTTP endpoint refuses to listen anywhere but loopback.

Parsed timings go to a bounded buffer (oldest dropped, counted) that the stream
client drains each poll; the latest step and communication time per (job, rank)
are kept for the agent's ``fabricmon_rank_step_seconds`` and
``fabricmon_rank_comm_seconds`` gauges (``readings()``, or use the intake as a
poller Source named ``rank_intake``).  Bad lines are counted and logged (rate
limited) with their reason; nothing a client sends can stop the intake.
"""

from __future__ import annotations

import ipaddress
import json
import os
import selectors
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog

from ..model import Reading, SourceResult
from ..rank_timing import JobLayout, RankTiming, RankTimingError, parse_line

log = structlog.get_logger("fabricmon.intake")

MAX_LINE_BYTES = 64 * 1024
MAX_HTTP_BODY = 4 * 1024 * 1024
MAX_UNIX_CLIENTS = 256


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RankIntake:
    """Receives rank timings; thread-safe.  ``start()`` opens the listeners."""

    name = "rank_intake"
    timeout = 0.5

    def __init__(
        self,
        node: str,
        *,
        socket_path: str | None = None,
        listen: str | None = None,
        max_buffer: int = 10_000,
        max_jobs_layouts: int = 1_000,
        max_latest: int = 100_000,
        latest_ttl: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if listen is not None:
            host, _, port = listen.rpartition(":")
            if not _is_loopback(host):
                raise ValueError(f"rank intake must listen on loopback, got {host!r}")
            self._http_addr: tuple[str, int] | None = (host.strip("[]"), int(port))
        else:
            self._http_addr = None
        self.node = node
        self.socket_path = socket_path
        self._max_buffer = max_buffer
        self._max_layouts = max_jobs_layouts
        self._max_latest = max_latest
        self._ttl = latest_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: deque[RankTiming] = deque()
        self._new_layouts: list[JobLayout] = []
        self._layouts: dict[str, JobLayout] = {}
        self._latest: dict[tuple[str, int], tuple[float, float, float]] = {}  # -> (step_s, comm_s, seen)
        self.accepted_total = 0
        self.rejected_total = 0
        self.dropped_total = 0
        self._last_log = 0.0
        self._suppressed = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._unix: socket.socket | None = None
        self._http: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ core

    def submit_lines(self, data: bytes | str, *, origin: str = "api") -> tuple[int, int, list[str]]:
        """Parse a block of JSON lines; returns (accepted, rejected, first few reasons)."""
        if isinstance(data, str):
            data = data.encode()
        acc = rej = 0
        reasons: list[str] = []
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            ok, reason = self.submit_line(raw, origin=origin)
            if ok:
                acc += 1
            else:
                rej += 1
                if len(reasons) < 10:
                    reasons.append(reason)
        return acc, rej, reasons

    def submit_line(self, raw: bytes | str, *, origin: str = "api") -> tuple[bool, str]:
        if len(raw) > MAX_LINE_BYTES:
            return self._bad(f"line longer than {MAX_LINE_BYTES} bytes", origin)
        now = self._clock()
        try:
            item = parse_line(raw, node=self.node, now=now)
        except RankTimingError as exc:
            return self._bad(str(exc), origin)
        except Exception as exc:  # parse_line is ours, but never let a line stop the intake
            return self._bad(f"{type(exc).__name__}: {exc}", origin)
        with self._lock:
            self.accepted_total += 1
            if isinstance(item, JobLayout):
                if item.job not in self._layouts and len(self._layouts) >= self._max_layouts:
                    self._layouts.pop(next(iter(self._layouts)))
                self._layouts[item.job] = item
                self._new_layouts.append(item)
                if len(self._new_layouts) > self._max_layouts:
                    del self._new_layouts[0]
                return True, ""
            if len(self._ranks) >= self._max_buffer:
                self._ranks.popleft()
                self.dropped_total += 1
            self._ranks.append(item)
            key = (item.job, item.rank)
            if key not in self._latest and len(self._latest) >= self._max_latest:
                self._latest.pop(next(iter(self._latest)))
            self._latest[key] = (item.step_seconds, item.comm_seconds, now)
        return True, ""

    def _bad(self, reason: str, origin: str) -> tuple[bool, str]:
        with self._lock:
            self.rejected_total += 1
            now = time.monotonic()
            if now - self._last_log < 1.0:
                self._suppressed += 1
                return False, reason
            suppressed, self._suppressed, self._last_log = self._suppressed, 0, now
        log.warning("rank_line_rejected", origin=origin, reason=reason, suppressed_since_last=suppressed,
                    rejected_total=self.rejected_total)
        return False, reason

    def drain(self) -> tuple[list[RankTiming], list[JobLayout]]:
        """Everything received since the last drain (the stream client calls this each poll)."""
        with self._lock:
            ranks = list(self._ranks)
            self._ranks.clear()
            layouts, self._new_layouts = self._new_layouts, []
        return ranks, layouts

    def layouts(self) -> list[JobLayout]:
        """Every job layout known (resent on each new stream connection)."""
        with self._lock:
            return list(self._layouts.values())

    def readings(self) -> list[Reading]:
        """Latest step and communication time per (job, rank), forgetting ranks silent for ``latest_ttl``."""
        now = self._clock()
        out: list[Reading] = []
        with self._lock:
            for key in [k for k, v in self._latest.items() if now - v[2] > self._ttl]:
                del self._latest[key]
            for (job, rank), (step_s, comm_s, _) in self._latest.items():
                labels = (("job", job), ("rank", str(rank)))
                out.append(Reading("fabricmon_rank_step_seconds", labels, step_s))
                out.append(Reading("fabricmon_rank_comm_seconds", labels, comm_s))
        return out

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"accepted_total": self.accepted_total, "rejected_total": self.rejected_total,
                    "dropped_total": self.dropped_total, "buffered": len(self._ranks)}

    # Source protocol (poller): the gauges of the latest timings.
    def poll(self, inventory) -> SourceResult:
        return SourceResult(self.name, readings=self.readings())

    def close(self) -> None:
        self.stop()

    # ------------------------------------------------------------ listeners

    def start(self) -> RankIntake:
        if self.socket_path:
            self._start_unix(self.socket_path)
        if self._http_addr is not None:
            self._start_http(self._http_addr)
        return self

    @property
    def http_port(self) -> int:
        return self._http.server_address[1] if self._http else 0

    def stop(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        for t in self._threads:
            t.join(5.0)
        self._threads.clear()
        if self._unix is not None:
            self._unix.close()
            self._unix = None
            try:
                if self.socket_path and stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                    os.unlink(self.socket_path)
            except OSError:
                pass

    def _start_unix(self, path: str) -> None:
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
        os.chmod(path, 0o660)
        s.listen(64)
        s.setblocking(False)
        self._unix = s
        t = threading.Thread(target=self._unix_loop, args=(s,), name="fabricmon-intake-uds", daemon=True)
        self._threads.append(t)
        t.start()
        log.info("rank_intake_listening", socket=path)

    def _unix_loop(self, lsock: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(lsock, selectors.EVENT_READ, None)
        bufs: dict[socket.socket, bytearray] = {}
        skipping: set[socket.socket] = set()

        def close(c: socket.socket) -> None:
            sel.unregister(c)
            bufs.pop(c, None)
            skipping.discard(c)
            c.close()

        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    try:
                        if key.data is None:
                            try:
                                conn, _ = lsock.accept()
                            except OSError:
                                continue
                            if len(bufs) >= MAX_UNIX_CLIENTS:
                                conn.close()
                                self._bad("too many intake connections", "unix")
                                continue
                            conn.setblocking(False)
                            sel.register(conn, selectors.EVENT_READ, "c")
                            bufs[conn] = bytearray()
                            continue
                        c = key.fileobj
                        try:
                            chunk = c.recv(65536)
                        except BlockingIOError:
                            continue
                        except OSError:
                            chunk = b""
                        buf = bufs[c]
                        if not chunk:
                            if buf.strip() and c not in skipping:
                                self.submit_line(bytes(buf), origin="unix")  # last line without newline
                            close(c)
                            continue
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
                                self.submit_line(line, origin="unix")
                        if len(buf) > MAX_LINE_BYTES:
                            if c not in skipping:
                                self._bad(f"line longer than {MAX_LINE_BYTES} bytes", "unix")
                            skipping.add(c)
                            buf.clear()
                    except Exception as exc:  # never let one client stop the loop
                        log.error("rank_intake_error", error=f"{type(exc).__name__}: {exc}")
                        if key.data is not None:
                            try:
                                close(key.fileobj)
                            except Exception:
                                pass
        finally:
            for c in list(bufs):
                close(c)
            sel.close()

    def _start_http(self, addr: tuple[str, int]) -> None:
        intake = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "fabricmon-intake"
            timeout = 5  # a stalled client costs one thread for at most this long
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):  # structlog instead of stderr lines
                pass

            def _reply(self, code: int, obj: dict) -> None:
                body = (json.dumps(obj) + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                if self.path.split("?")[0] != "/v1/ranks":
                    self._reply(404, {"error": "not found; POST /v1/ranks"})
                    return
                try:
                    n = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    self._reply(411, {"error": "Content-Length required"})
                    return
                if n < 0 or n > MAX_HTTP_BODY:
                    self.close_connection = True
                    self._reply(413, {"error": f"body over {MAX_HTTP_BODY} bytes"})
                    return
                body = self.rfile.read(n)
                acc, rej, reasons = intake.submit_lines(body, origin="http")
                self._reply(200 if acc or not rej else 400, {"accepted": acc, "rejected": rej, "errors": reasons})

            def do_GET(self):
                if self.path == "/healthz":
                    self._reply(200, {"status": "ok"})
                else:
                    self._reply(405 if self.path == "/v1/ranks" else 404, {"error": "POST /v1/ranks"})

        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        self._http = Server(addr, Handler)
        self._http.timeout = 5
        t = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.2},
                             name="fabricmon-intake-http", daemon=True)
        self._threads.append(t)
        t.start()
        log.info("rank_intake_listening", http=f"{addr[0]}:{self.http_port}")
