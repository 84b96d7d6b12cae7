"""Report per-rank step timings to the local fabricmon agent (standard library only).

    from fabricmon.client import report_step
    report_step("llm-7b", rank=17, step=1200, step_seconds=1.82, comm_seconds=0.41)

    timer = StepTimer()                 # job: $SLURM_JOB_NAME, job_id: $FABRICMON_JOB_ID / $SLURM_JOB_ID /
    for step, batch in enumerate(data): # $TORCHELASTIC_RUN_ID; heartbeats on (hung jobs are named from them)
        with timer.step(step):
            ...
            with timer.comm():          # a collective: coll_sn counts it, the heartbeat says "inside"
                ...

Every line carries the job's scheduler id (``job_id``) when there is one, so the rank series, stragglers,
cost and ``JobHung`` (from heartbeats) name one job, and two jobs of one name stay apart.

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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_SOCKET = "/run/fabricmon/ranks.sock"
DEFAULT_HTTP = "http://127.0.0.1:9723/v1/ranks"
DEFAULT_TIMEOUT = 0.1
_UNSET = object()


# where a job's scheduler id comes from, first set wins (Slurm's job id, torchrun's rendezvous run id)
JOB_ID_ENV = ("FABRICMON_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
JOB_NAME_ENV = "SLURM_JOB_NAME"


def default_job_id() -> str:
    """The job's identity from its environment (``JOB_ID_ENV`` in order), "" when none is set."""
    for name in JOB_ID_ENV:
        v = os.environ.get(name, "").strip()
        if v:
            return v
    return ""


def default_job_name() -> str:
    return os.environ.get(JOB_NAME_ENV, "").strip()


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
    job_id: str | None = None,
) -> bool:
    """Report one training step of one rank.  ``local_rank`` defaults to ``$LOCAL_RANK``
    (else 0); ``gpu`` defaults, on the agent, to ``local_rank``; ``job_id`` to ``default_job_id()``
    (pass "" to send none)."""
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
        jid = default_job_id() if job_id is None else str(job_id)
        if jid:
            obj["job_id"] = jid
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
        self.job, self.rank = str(job), int(rank)
        self.job_id = default_job_id() if job_id is None else job_id
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


def _cuda() -> Any:
    """torch when CUDA is usable, else None (torch is never required)."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


class StepTimer:
    """Times a training loop's steps and its collectives and reports each step (``report_step``), with the
    rank's heartbeats (``HeartbeatSender``): ``coll_sn`` counts the collectives ``comm()`` wraps and
    ``in_collective`` says whether the rank is inside one, so a rank that never enters the collective its
    peers wait in is named by ``JobHung``.

    ``job`` defaults to ``$SLURM_JOB_NAME`` (else "job"), ``job_id`` to ``default_job_id()``, ``rank`` to
    ``$RANK``, ``local_rank`` to ``$LOCAL_RANK``.  With CUDA, times come from CUDA events so asynchronous
    kernels count where they run; the step end synchronizes on its last event only.  Never raises into
    the training loop from reporting."""

    def __init__(self, job: str | None = None, job_id: str | None = None, heartbeat: bool = True, *,
                 rank: int | None = None, local_rank: int | None = None, group: dict[str, int] | None = None,
                 every: int = 1, socket_path=_UNSET, http=_UNSET, heartbeat_interval: float = HEARTBEAT_SECONDS,
                 nccl_ras: bool | str | None = None) -> None:
        self.job = job if job else (default_job_name() or "job")
        self.job_id = default_job_id() if job_id is None else job_id
        self.rank = rank if rank is not None else (_env_int("RANK") or 0)
        self.local_rank = local_rank if local_rank is not None else (_env_int("LOCAL_RANK") or 0)
        self.group = group
        self.every = max(1, int(every))
        self._socket_path, self._http = socket_path, http
        self._comm_pairs: list[Any] = []
        self._comm_cpu = 0.0
        self.coll_sn = 0
        self.heartbeat: HeartbeatSender | None = None
        if heartbeat:
            self.heartbeat = HeartbeatSender(self.job, self.rank, job_id=self.job_id, interval=heartbeat_interval,
                                             socket_path=socket_path, http=http, nccl_ras=nccl_ras).start()

    def close(self) -> None:
        """Stop the heartbeats (a rank that exits stops them anyway: the thread is a daemon)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def _hb(self, **kw: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.update(**kw)

    @contextmanager
    def comm(self) -> Iterator[None]:
        """Time one collective of a step (entered once per collective, several times a step is fine)."""
        self.coll_sn += 1
        self._hb(coll_sn=self.coll_sn, in_collective=True)
        torch = _cuda()
        try:
            if torch is not None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                try:
                    yield
                finally:
                    end.record()
                    self._comm_pairs.append((start, end))
            else:
                t0 = time.perf_counter()
                try:
                    yield
                finally:
                    self._comm_cpu += time.perf_counter() - t0
        finally:
            self._hb(in_collective=False)

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        self._comm_pairs = []
        self._comm_cpu = 0.0
        self._hb(step=step)
        torch = _cuda()
        if torch is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                end.synchronize()
                step_s = start.elapsed_time(end) / 1000.0
                comm_s = sum(a.elapsed_time(b) for a, b in self._comm_pairs) / 1000.0
                self._report(step, step_s, comm_s)
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._report(step, time.perf_counter() - t0, self._comm_cpu)

    def _report(self, step: int, step_s: float, comm_s: float) -> None:
        if step % self.every == 0:
            report_step(self.job, self.rank, step, step_s, comm_s, local_rank=self.local_rank, group=self.group,
                        socket_path=self._socket_path, http=self._http, job_id=self.job_id)
