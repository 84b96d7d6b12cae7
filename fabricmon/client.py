"""Report per-rank step timings to the local fabricmon agent (standard library only).

    from fabricmon.client import report_step
    report_step("llm-7b", rank=17, step=1200, step_seconds=1.82, comm_seconds=0.41)

One JSON line goes to the agent's Unix socket (``/run/fabricmon/ranks.sock``,
or ``$FABRICMON_RANKS_SOCKET``), falling back to ``POST /v1/ranks`` on
``http://127.0.0.1:9723`` (or ``$FABRICMON_RANKS_HTTP``; an empty value turns
the fallback off).  Both use a short timeout, and nothing here ever raises into
the training loop: the result is True when the line was handed over, else False.
``start_heartbeat`` runs a rank's 5 s heartbeat thread over one connection (hung jobs are named
from them).
"""

from __future__ import annotations

import http.client as _httpclient
import json
import math
import os
import socket
import threading
import time
import urllib.parse

DEFAULT_SOCKET = "/run/fabricmon/ranks.sock"
DEFAULT_HTTP = "http://127.0.0.1:9723/v1/ranks"
DEFAULT_TIMEOUT = 0.1
_UNSET = object()


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _socket_answer(s: socket.socket) -> bool:
    """Half-close and read the agent's answer: False when it refused the line.  No answer (an agent
    before it answered, or one too slow) is True: the line was handed over."""
    try:
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while len(reply) < 4096:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        return int(json.loads(reply)["rejected"]) == 0 if reply.strip() else True
    except (OSError, ValueError, KeyError, TypeError):
        return True


def send_line(line: str, *, socket_path=_UNSET, http=_UNSET, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Send one JSON line to the agent; never raises."""
    try:
        if socket_path is _UNSET:
            socket_path = os.environ.get("FABRICMON_RANKS_SOCKET", DEFAULT_SOCKET)
        if http is _UNSET:
            http = os.environ.get("FABRICMON_RANKS_HTTP", DEFAULT_HTTP)
        data = (line.rstrip("\n") + "\n").encode()
        if socket_path:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(timeout)
                    s.connect(socket_path)
                    s.sendall(data)
                    return _socket_answer(s)
            except OSError:
                pass
        if http:
            u = urllib.parse.urlsplit(http if "://" in http else f"http://{http}")
            conn = _httpclient.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
            try:
                conn.request("POST", u.path or "/v1/ranks", body=data,
                             headers={"Content-Type": "application/x-ndjson"})
                resp = conn.getresponse()
                resp.read()
                return resp.status == 200
            finally:
                conn.close()
    except Exception:
        return False
    return False


def report_step(
    job: str,
    rank: int,
    step: int,
    step_seconds: float,
    comm_seconds: float = 0.0,
    local_rank: int | None = None,
    gpu: int | None = None,
    group: dict[str, int] | None = None,
    socket_path=_UNSET,
    http=_UNSET,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    ts: float | None = None,
) -> bool:
    """Report one training step of one rank.  ``local_rank`` defaults to ``$LOCAL_RANK``
    (else 0); ``gpu`` defaults, on the agent, to ``local_rank``."""
    try:
        if local_rank is None:
            local_rank = _env_int("LOCAL_RANK") or 0
        step_s, comm_s = float(step_seconds), float(comm_seconds)
        obj = {"job": str(job), "rank": int(rank), "local_rank": int(local_rank), "step": int(step),
               "step_seconds": step_s, "comm_seconds": comm_s, "ts": time.time() if ts is None else float(ts)}
        if not (math.isfinite(step_s) and math.isfinite(comm_s)):
            return False
        if gpu is not None:
            obj["gpu"] = int(gpu)
        if group:
            obj["group"] = {str(k): int(v) for k, v in group.items()}
        return send_line(json.dumps(obj, separators=(",", ":")), socket_path=socket_path, http=http, timeout=timeout)
    except Exception:
        return False


def report_layout(job: str, layout: dict[str, int], socket_path=_UNSET, http=_UNSET, *,
                  timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Describe a job's parallel layout once, e.g. ``{"tp": 8, "pp": 4, "dp": 64}``."""
    try:
        line = json.dumps({"job": str(job), "layout": {str(k): int(v) for k, v in layout.items()}},
                          separators=(",", ":"))
        return send_line(line, socket_path=socket_path, http=http, timeout=timeout)
    except Exception:
        return False


HEARTBEAT_SECONDS = 5.0
NCCL_RAS_DEFAULT_ADDR = "localhost:28028"  # NCCL's default NCCL_RAS_ADDR


def nccl_ras_addr(want: bool | str | None = None) -> str:
    """The RAS address a rank's heartbeats announce, "" for none.  ``want``: True (the job's
    ``$NCCL_RAS_ADDR``, else NCCL's default ``localhost:28028``), an address, False (never), or None:
    ``$FABRICMON_NCCL_RAS`` decides (``1`` as True, a HOST:PORT as that address, unset or ``0`` off).
    Off whenever ``$NCCL_RAS_ENABLE`` is ``0``: NCCL then runs no RAS to ask.  Opt-in because only
    NCCL 2.28.7 and later answer in JSON, which the job knows and the agent does not."""
    if os.environ.get("NCCL_RAS_ENABLE", "").strip() == "0":
        return ""
    if want is None:
        env = os.environ.get("FABRICMON_NCCL_RAS", "").strip()
        want = env if ":" in env else env.lower() in ("1", "true", "yes")
    if want is True:
        return os.environ.get("NCCL_RAS_ADDR", "").strip() or NCCL_RAS_DEFAULT_ADDR
    return want if isinstance(want, str) else ""


class HeartbeatSender:
    """A rank's liveness, every ``interval`` seconds from a daemon thread over one Unix-socket connection
    (DESIGN "Jobs, decoys and cost"): its step, its collective sequence number and whether it is inside a
    collective.  The training loop only calls ``update`` (a few attribute writes, no I/O); a hang shows as
    heartbeats that go on while ``coll_sn`` stays.  Falls back to the HTTP intake, per line, when the
    socket is unavailable; never raises into the training loop.

        hb = start_heartbeat("llm-70b", rank=17, job_id=os.environ.get("SLURM_JOB_ID"), nccl_ras=True)
        hb.update(step=step, coll_sn=sn, in_collective=True)

    ``nccl_ras`` (see ``nccl_ras_addr``) announces the job's NCCL RAS address: when the aggregator
    suspects the job of hanging, one agent of the job queries it and the ranks it reports missing or dead
    go into the ``JobHung`` evidence.
    """

    def __init__(self, job: str, rank: int, *, job_id: str | None = None, interval: float = HEARTBEAT_SECONDS,
                 socket_path=_UNSET, http=_UNSET, timeout: float = DEFAULT_TIMEOUT,
                 nccl_ras: bool | str | None = None) -> None:
        self.job, self.rank, self.job_id = str(job), int(rank), job_id
        self.nccl_ras = nccl_ras_addr(nccl_ras)
        self.interval = float(interval)
        self.step = 0
        self.coll_sn = 0
        self.in_collective = False
        self.sent_total = 0
        self.failed_total = 0
        self._socket_path = os.environ.get("FABRICMON_RANKS_SOCKET", DEFAULT_SOCKET) if socket_path is _UNSET \
            else socket_path
        self._http = http
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, step: int | None = None, coll_sn: int | None = None, in_collective: bool | None = None) -> None:
        if step is not None:
            self.step = int(step)
        if coll_sn is not None:
            self.coll_sn = int(coll_sn)
        if in_collective is not None:
            self.in_collective = bool(in_collective)

    def line(self) -> str:
        obj: dict = {"job": self.job, "rank": self.rank, "ts": time.time(),
                     "heartbeat": {"step": self.step, "coll_sn": self.coll_sn, "in_collective": self.in_collective}}
        if self.job_id:
            obj["job_id"] = str(self.job_id)
        if self.nccl_ras:
            obj["nccl_ras"] = self.nccl_ras
        return json.dumps(obj, separators=(",", ":"))

    def beat(self) -> bool:
        """Send one heartbeat now (the thread calls this every ``interval``)."""
        data = (self.line() + "\n").encode()
        ok = False
        if self._socket_path:
            try:
                if self._sock is None:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.settimeout(self._timeout)
                    s.connect(self._socket_path)
                    self._sock = s
                self._sock.sendall(data)
                ok = True
            except OSError:
                self._close()  # reconnect on the next beat
        if not ok:
            ok = send_line(data.decode(), socket_path="", http=self._http, timeout=self._timeout)
        if ok:
            self.sent_total += 1
        else:
            self.failed_total += 1
        return ok

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:  # never let the thread die: a missing heartbeat reads as an exited rank
                self.failed_total += 1

    def start(self) -> HeartbeatSender:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fabricmon-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 1.0)
        self._close()

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None


def start_heartbeat(job: str, rank: int, **kwargs) -> HeartbeatSender:
    """Start a rank's heartbeat thread; see ``HeartbeatSender``."""
    return HeartbeatSender(job, rank, **kwargs).start()
