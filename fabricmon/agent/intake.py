"""Rank-timing intake on the node: a Unix socket and a loopback HTTP endpoint.

Training processes send JSON lines (``fabricmon.rank_timing``), one per step:
over the Unix socket (stream; a missing directory is created 0750, the socket
gets ``socket_mode``: 0660 here, the agent's ``intake.socket_mode`` config, default
0666, the same reach as the loopback HTTP endpoint every local user has anyway) or ``POST /v1/ranks`` on
127.0.0.1:9723 with a JSON-lines body (the answer gives the accepted and
rejected counts).  The HTTP endpoint refuses to listen anywhere but loopback.

Parsed timings go to a bounded buffer (oldest dropped, counted) that the stream
client drains each poll; the latest step and communication time per (job, job_id, rank)
are kept for the agent's ``fabricmon_rank_step_seconds`` and
``fabricmon_rank_comm_seconds`` gauges (``readings()``, or use the intake as a
poller Source named ``rank_intake``).  Bad lines are counted and logged (rate
limited) with their reason; nothing a client sends can stop the intake.

Bounds, so no client can grow the agent: every field is checked against its
wire range (``rank_timing.parse_line``); at most ``max_jobs`` jobs and
``max_series`` (job, rank) series are held (a line that would add one more is
rejected as ``job_limit`` or ``series_limit``), and both expire after
``latest_ttl`` seconds of silence; at most ``max_connections`` Unix clients
(the least recently active one makes room for a new one), each closed after
``idle_timeout`` seconds without a byte (long: a rank may keep one connection
and send a line per step), and as many HTTP connections, whose request headers
must arrive within ``HTTP_HEADER_TIMEOUT`` (see ``httpserve``); the two listeners are
``intake_listeners``, this module judges and holds the lines.  The counts
are exported as ``fabricmon_intake_*`` self-metrics with fixed label sets.

Local users (docs/security.md): every line has a source, the peer credential of its Unix connection
(``SO_PEERCRED``: the uid owns, the pid is logged) or, over HTTP, the loopback peer (every HTTP client is
one source: the socket is the way to be told apart).  A heartbeat's time is the agent's receipt time,
never the client's ``ts`` (a line stamped ahead cannot make the real ones look old).  A (job, job_id,
rank) belongs to the source that sent it while that source keeps it alive (``OWNER_TTL_S``): lines for
it from another source are rejected as ``conflict`` (counted), never a takeover.  When every job slot
is taken, a source holding fewer than its share (``max_jobs // 4``) of them makes room by the least
recently used job of the source holding the most; one at or over its share is refused as
``job_limit``.  A Unix client that half-closes its connection is answered with one JSON line of the
accepted and rejected counts (``fabricmon.client.send_line`` returns False on a refusal).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable

import structlog

from ..httpserve import CLOSE_REASONS, GuardedHTTPServer
from ..model import Reading, Semantics, SourceResult
from ..rank_timing import (
    Heartbeat,
    JobLayout,
    RankTiming,
    RankTimingError,
    parse_line,
)
from .intake_counts import LineCounts
from .intake_listeners import API_PEER, Peer, UnixListener, start_http

log = structlog.get_logger("fabricmon.intake")

OWNER_TTL_S = 60.0  # a (job, rank) silent this long from its source may be claimed by another one
JOB_SHARE = 4  # a source holding max_jobs // JOB_SHARE jobs or more is refused when the slots are full


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
        max_jobs: int = 64,
        max_series: int = 4096,
        latest_ttl: float = 600.0,
        max_connections: int = 64,
        idle_timeout: float = 300.0,
        socket_mode: int = 0o660,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min(max_buffer, max_jobs, max_series, max_connections) < 1 or latest_ttl <= 0 or idle_timeout <= 0:
            raise ValueError("rank intake limits must be positive")
        if listen is not None:
            host, _, port = listen.rpartition(":")
            if not _is_loopback(host):
                raise ValueError(f"rank intake must listen on loopback, got {host!r}")
            self._http_addr: tuple[str, int] | None = (host.strip("[]"), int(port))
        else:
            self._http_addr = None
        self.node = node
        self.socket_path = socket_path
        self.socket_mode = socket_mode
        self._max_buffer = max_buffer
        self._max_jobs = max_jobs
        self._max_series = max_series
        self._ttl = latest_ttl
        self._idle = idle_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: deque[RankTiming] = deque()
        self._new_layouts: list[JobLayout] = []
        # the newest heartbeat per (job, job_id, rank) since the last drain: one a rank per batch is enough
        self._heartbeats: dict[tuple[str, str, int], Heartbeat] = {}
        self._layouts: dict[str, JobLayout] = {}
        # (job, job_id, rank) -> (step_s, comm_s, seen): job_id keeps two jobs of one name apart
        self._latest: dict[tuple[str, str, int], tuple[float, float, float]] = {}
        self._jobs: dict[str, float] = {}  # job -> last seen
        self._job_user: dict[str, str] = {}  # job -> the source (Peer.user) that brought it
        # (job, job_id, rank) -> (Peer.user, last line): the source that speaks for that rank
        self._owners: dict[tuple[str, str, int], tuple[str, float]] = {}
        self._next_expiry = float("-inf")
        self.counts = LineCounts()  # intake_counts.py: accepted, rejected by reason, series dropped
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # the listeners (intake_listeners.py): the Unix socket's loop, the loopback HTTP server
        self.unix = UnixListener(self, self._lock, self._stop, max_connections=max_connections,
                                 idle_timeout=idle_timeout)
        self._http: GuardedHTTPServer | None = None

    # ------------------------------------------------------------ core

    def submit_lines(self, data: bytes | str, *, origin: str = "api",
                     peer: Peer = API_PEER) -> tuple[int, int, list[str]]:
        """Parse a block of JSON lines; returns (accepted, rejected, first few reasons)."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")  # a lone surrogate is then rejected as not UTF-8
        acc = rej = 0
        reasons: list[str] = []
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            ok, reason = self.submit_line(raw, origin=origin, peer=peer)
            if ok:
                acc += 1
            else:
                rej += 1
                if len(reasons) < 10:
                    reasons.append(reason)
        return acc, rej, reasons

    def submit_line(self, raw: bytes | str, *, origin: str = "api", peer: Peer = API_PEER) -> tuple[bool, str]:
        now = self._clock()
        try:
            item = parse_line(raw, node=self.node, now=now)
        except RankTimingError as exc:
            return self.reject(exc.reason, str(exc), origin)
        except Exception as exc:  # parse_line is ours, but never let a line stop the intake
            return self.reject("not_json", f"{type(exc).__name__}: {exc}", origin)
        if isinstance(item, Heartbeat):
            item = dataclasses.replace(item, ts=now)  # judged on receipt: a client's ts ahead hides nothing
        with self._lock:
            if item.job not in self._jobs and len(self._jobs) >= self._max_jobs:
                self._expire(now)
                if len(self._jobs) >= self._max_jobs and not self._make_room(peer):
                    return self.counts.rejected("job_limit", f"job: more than {self._max_jobs} jobs active "
                                                f"({peer.who} holds its share)", origin)
            if not isinstance(item, JobLayout):
                okey = (item.job, item.job_id, item.rank)
                owner = self._owners.get(okey)
                if owner is not None and owner[0] != peer.user and now - owner[1] <= OWNER_TTL_S:
                    self.counts.conflicts_total += 1
                    return self.counts.rejected("conflict", f"rank {item.rank} of job {item.job}: sent by another "
                                                f"source than its own ({peer.who})", origin)
                if owner is None and len(self._owners) >= 2 * self._max_series:
                    self._expire(now)
                    if len(self._owners) >= 2 * self._max_series:
                        return self.counts.rejected("series_limit", "rank: too many (job, rank) sources", origin)
                self._owners[okey] = (peer.user, now)
            self._job_user.setdefault(item.job, peer.user)
            if isinstance(item, Heartbeat):
                hkey = (item.job, item.job_id, item.rank)
                if hkey not in self._heartbeats and len(self._heartbeats) >= self._max_series:
                    return self.counts.rejected("series_limit",
                                                f"heartbeat: more than {self._max_series} (job, rank) pending", origin)
                self._jobs[item.job] = now
                self._heartbeats[hkey] = item
                self.counts.accepted()
                return True, ""
            if isinstance(item, JobLayout):
                self._jobs[item.job] = now
                self._layouts[item.job] = item
                self._new_layouts.append(item)
                if len(self._new_layouts) > self._max_jobs:
                    del self._new_layouts[0]
                self.counts.accepted()
                return True, ""
            key = (item.job, item.job_id, item.rank)
            if key not in self._latest and len(self._latest) >= self._max_series:
                self._expire(now)
                if len(self._latest) >= self._max_series:
                    return self.counts.rejected("series_limit",
                                                f"rank: more than {self._max_series} (job, rank) series active", origin)
            self._jobs[item.job] = now
            if len(self._ranks) >= self._max_buffer:
                self._ranks.popleft()
                self.counts.dropped_total += 1
            self._ranks.append(item)
            self._latest[key] = (item.step_seconds, item.comm_seconds, now)
            self.counts.accepted()
        return True, ""

    def _make_room(self, peer: Peer) -> bool:
        """Under the lock, every job slot taken: free the least recently used job of the source holding the
        most, unless ``peer`` itself holds its share (then it is refused)."""
        held: dict[str, int] = {}
        for user in self._job_user.values():
            held[user] = held.get(user, 0) + 1
        if held.get(peer.user, 0) >= max(1, self._max_jobs // JOB_SHARE):
            return False
        top = max(held, key=lambda u: held[u], default=None)
        if top is None:
            return False
        victim = min((j for j, u in self._job_user.items() if u == top), key=lambda j: self._jobs.get(j, 0.0))
        self._forget_job(victim)
        log.warning("rank_intake_job_evicted", job=victim, holder=top, for_source=peer.who)
        return True

    def _forget_job(self, job: str) -> None:
        self._jobs.pop(job, None)
        self._job_user.pop(job, None)
        self._layouts.pop(job, None)

    def _expire(self, now: float, force: bool = False) -> None:
        """Under the lock: forget series and jobs silent for ``latest_ttl`` (at most once a second unless forced,
        so a flood of lines over the limit does not rescan every series per line)."""
        if not force and now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        old = now - self._ttl
        gone = [k for k, v in self._latest.items() if v[2] < old]
        for k in gone:
            del self._latest[k]
        self.counts.expired_total += len(gone)
        for job in [j for j, seen in self._jobs.items() if seen < old]:
            self._forget_job(job)
        for j in [j for j in self._job_user if j not in self._jobs]:
            del self._job_user[j]
        stale = now - OWNER_TTL_S
        for k in [k for k, (_, seen) in self._owners.items() if seen < stale]:
            del self._owners[k]

    def reject(self, reason: str, message: str, origin: str) -> tuple[bool, str]:
        with self._lock:
            return self.counts.rejected(reason, message, origin)

    def drain(self) -> tuple[list[RankTiming], list[JobLayout]]:
        """Everything received since the last drain (the stream client calls this each poll)."""
        with self._lock:
            ranks = list(self._ranks)
            self._ranks.clear()
            layouts, self._new_layouts = self._new_layouts, []
        return ranks, layouts

    def drain_heartbeats(self) -> list[Heartbeat]:
        """The newest heartbeat of each rank since the last drain."""
        with self._lock:
            out, self._heartbeats = list(self._heartbeats.values()), {}
        return out

    def layouts(self) -> list[JobLayout]:
        """Every job layout known (resent on each new stream connection)."""
        with self._lock:
            return list(self._layouts.values())

    def readings(self) -> list[Reading]:
        """Latest step and communication time per (job, job_id, rank), forgetting ranks silent for ``latest_ttl``."""
        out: list[Reading] = []
        with self._lock:
            self._expire(self._clock(), force=True)
            for (job, job_id, rank), (step_s, comm_s, _) in self._latest.items():
                # an empty job_id is no label at all in Prometheus (a job that sends none)
                labels = (("hpc_job", job), ("job_id", job_id), ("rank", str(rank)))
                out.append(Reading("fabricmon_rank_step_seconds", labels, step_s))
                out.append(Reading("fabricmon_rank_comm_seconds", labels, comm_s))
        return out

    def self_readings(self) -> list[Reading]:
        """The intake's own counters, every label set always present (a rate over them needs no guessing)."""
        with self._lock:
            out = self.counts.readings(self.name, len(self._latest))
        http = self._http.closed_total if self._http is not None else dict.fromkeys(CLOSE_REASONS, 0)
        for listener, closed in (("unix", self.unix.closed), ("http", http)):
            for reason in CLOSE_REASONS:
                out.append(Reading("fabricmon_intake_connections_closed_total",
                                   (("listener", listener), ("reason", reason)), closed[reason], Semantics.MONOTONIC))
        return out

    def stats(self) -> dict[str, int]:
        with self._lock:
            c = self.counts
            out = {"accepted_total": c.accepted_total, "rejected_total": c.rejected_total,
                   "dropped_total": c.dropped_total, "buffered": len(self._ranks), "jobs": len(self._jobs),
                   "series": len(self._latest), "connections": self.unix.clients,
                   "connections_closed": sum(self.unix.closed.values())}
        if self._http is not None:
            h = self._http.stats()
            out["connections"] += h["connections"]
            out["connections_closed"] += h["closed_total"]
        return out

    # Source protocol (poller): the gauges of the latest timings and the intake's own counters.
    def poll(self, inventory) -> SourceResult:
        return SourceResult(self.name, readings=self.readings() + self.self_readings())

    def close(self) -> None:
        self.stop()

    # ------------------------------------------------------------ listeners

    def start(self) -> RankIntake:
        if self.socket_path:
            self._threads.append(self.unix.start(self.socket_path, self.socket_mode))
        if self._http_addr is not None:
            self._http, t = start_http(self, self._http_addr, max_connections=self.unix.max_connections,
                                       idle_timeout=self._idle)
            self._threads.append(t)
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
        self.unix.close(self.socket_path)
