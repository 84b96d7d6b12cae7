"""A stand-in for NCCL's RAS client socket on loopback, for the simulator and the tests.

It speaks the server side of the RAS client protocol as NCCL's ``rasClientEventLoop``
(src/ras/client_support.cc) does: line commands matched case-insensitively, ``SERVER PROTOCOL 2``,
``OK`` to ``TIMEOUT n`` and ``SET FORMAT json|text``, ``ERROR: ...`` to anything else, a 1,024-byte
command buffer, and after ``STATUS`` the status document, then the connection closed.  The JSON is
written by a port of the C writer's format strings (``jsonWriteHeader`` ... ``jsonWriteFooter``), so
the documented sample (ras.rst "JSON Output") comes out byte for byte; ``version="2.28.9"`` writes a
missing rank the way 2.28.7 and 2.28.9 did (no comma after ``nvml_dev``); ``version="2.27.7"`` has no
``SET FORMAT`` (older than 2.28.7) and answers ``STATUS`` in text.

What a job looks like to RAS comes from ``state()``, called per query: the sim's hung rank is a rank
whose process is alive and behind on its collective counts (it never entered the collective its
peers wait in), or, with ``hang_view="missing"``, a stopped process RAS cannot reach, considered dead
60 s after the hang began (ras.rst).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..nccl_ras import protocol as p

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # ncclFunc_t order, NCCL_NUM_FUNCTIONS 5
DEAD_AFTER_S = 60.0  # ras.rst: unreachable for 60 seconds, the process is declared dead


@dataclass(frozen=True)
class FakeRank:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    counts: tuple[int, ...] = (0, 0, 0, 0, 0)
    init_state: int = 0
    async_error: int = 0
    finalize_called: bool = False
    destroy_flag: bool = False
    abort_flag: bool = False


@dataclass(frozen=True)
class FakeMissing:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    unresponsive: bool = True
    considered_dead: bool = False


@dataclass(frozen=True)
class FakeComm:
    comm_hash: int
    host_hash: int
    pid_hash: int
    size: int
    ranks: tuple[FakeRank, ...]
    missing: tuple[FakeMissing, ...] = ()


@dataclass(frozen=True)
class FakeStatus:
    nccl_version: str = "2.29.1"
    cuda_runtime: int = 13000
    cuda_driver: int = 13000
    timestamp: str = "2025-12-19 13:06:53"
    comms: tuple[FakeComm, ...] = ()
    collection_time: float = 0.0
    timeouts: int = 0


def _b(v: bool) -> str:
    return "true" if v else "false"


def render_json(st: FakeStatus, *, missing_comma_defect: bool = False) -> str:
    """The status document as ``rasDumpCommsToJSON`` writes it (NVIDIA/nccl src/ras/client_support.cc)."""
    o = ["{\n", f'  "nccl_version": "{st.nccl_version}",\n', f'  "cuda_runtime_version": {st.cuda_runtime},\n',
         f'  "cuda_driver_version": {st.cuda_driver},\n', f'  "timestamp": "{st.timestamp}",\n',
         f'  "communicators_count": {len(st.comms)},\n', '  "communicators": [\n']
    for ci, c in enumerate(st.comms):
        if ci:
            o.append(",\n")
        o += ["    {\n", f'      "hash": "0x{c.comm_hash:x}",\n',
              f'      "secondary_hash": "0x{c.host_hash:x}:0x{c.pid_hash:x}",\n', f'      "size": {c.size},\n',
              f'      "ranks_count": {len(c.ranks)},\n', f'      "missing_ranks_count": {len(c.missing)},\n',
              '      "ranks": [\n']
        for ri, r in enumerate(c.ranks):
            if ri:
                o.append(",\n")
            o += ["        {\n", f'          "rank": {r.rank},\n', f'          "host": "{r.host}",\n',
                  f'          "pid": {r.pid},\n', f'          "cuda_dev": {r.cuda_dev},\n',
                  f'          "nvml_dev": {r.nvml_dev},\n', '          "status": {\n',
                  f'            "init_state": {r.init_state},\n', f'            "async_error": {r.async_error},\n',
                  f'            "finalize_called": {_b(r.finalize_called)},\n',
                  f'            "destroy_flag": {_b(r.destroy_flag)},\n',
                  f'            "abort_flag": {_b(r.abort_flag)}\n', "          },\n",
                  '          "collective_counts": {\n']
            for k, (name, n) in enumerate(zip(FUNCS, r.counts, strict=True)):
                o.append(f'            "{name}": {n}' + ("," if k < len(FUNCS) - 1 else "") + "\n")
            o += ["          }\n", "        }"]
        o += ["\n      ],\n", '      "missing_ranks": [\n']
        for mi, m in enumerate(c.missing):
            if mi:
                o.append(",\n")
            o += ["        {\n", f'          "rank": {m.rank},\n', f'          "host": "{m.host}",\n',
                  f'          "pid": {m.pid},\n', f'          "cuda_dev": {m.cuda_dev},\n',
                  f'          "nvml_dev": {m.nvml_dev}' + ("" if missing_comma_defect else ",") + "\n",
                  '          "status": {\n', f'            "unresponsive": {_b(m.unresponsive)},\n',
                  f'            "considered_dead": {_b(m.considered_dead)}\n', "          }\n", "        }"]
        o += ["\n      ]\n", "    }"]
    o += ["\n  ],\n", '  "ras": {\n', f'    "collection_time_sec": {st.collection_time:.3f},\n',
          f'    "timeouts_count": {st.timeouts}\n', "  }\n", "}\n"]
    return "".join(o)


def render_text_header(version: str, cuda: str = "12.9", runtime: int = 12090, driver: int = 12090) -> str:
    """The first lines of a text status (``rasClientRunInit``): what an NCCL without JSON answers."""
    return (f"NCCL version {version} compiled with CUDA {cuda}\n"
            f"CUDA runtime version {runtime}, driver version {driver}\n\n")


JSON_SINCE = (2, 28, 7)


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:3])


@dataclass
class FakeRasServer:
    """Listens on 127.0.0.1 (port 0: any free one).  ``state()`` is called per STATUS, unless ``document``
    (bytes sent as they are, e.g. a documented sample) is given.  ``behaviour``: ``normal``; ``silent``
    (accepts, never answers: a stopped process's socket); ``huge`` (a document of ``huge_bytes``);
    ``garbage`` (answers STATUS with ``garbage``)."""

    state: Callable[[], FakeStatus] = FakeStatus
    document: bytes | None = None
    version: str = "2.29.1"
    behaviour: str = "normal"
    huge_bytes: int = 40 * 1024 * 1024
    garbage: bytes = b"{not json"
    host: str = "127.0.0.1"
    port: int = 0
    queries: int = 0
    commands: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, self.port))
        self._sock.listen(16)
        self._sock.settimeout(0.05)  # how soon close() is noticed
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="fake-ras", daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._sock.close()

    def __enter__(self) -> FakeRasServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), name="fake-ras-client", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(30.0)
        json_fmt = False
        buf = b""
        try:
            while not self._stop.is_set():
                if self.behaviour == "silent":
                    self._stop.wait(30.0)
                    return
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    cmd = raw.rstrip(b"\r").decode("utf-8", "replace")
                    with self._lock:
                        self.commands.append(cmd)
                    low = cmd.lower()
                    if low.startswith("client protocol "):
                        conn.sendall(f"SERVER PROTOCOL {p.CLIENT_PROTOCOL}\n".encode())
                    elif low.startswith("timeout "):
                        arg = cmd[len("timeout "):]
                        ok = arg.isdigit()
                        conn.sendall(b"OK\n" if ok else f"ERROR: Invalid timeout value {arg}\n".encode())
                    elif low.startswith("set format ") and _vtuple(self.version) >= JSON_SINCE:
                        fmt = cmd[len("set format "):].lower()
                        if fmt in ("json", "text"):
                            json_fmt = fmt == "json"
                            conn.sendall(b"OK\n")
                        else:
                            conn.sendall(f"ERROR: Invalid format {cmd[len('set format '):]}\n".encode())
                    elif low in ("status", "verbose status"):
                        self._status(conn, json_fmt)
                        return  # RAS_CLIENT_FINISHED: the server closes once the answer is sent
                    else:
                        conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())
                if len(buf) >= p.MAX_COMMAND_BYTES:
                    return  # "RAS excessively long input line; terminating the client socket"
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _status(self, conn: socket.socket, json_fmt: bool) -> None:
        with self._lock:
            self.queries += 1
        if self.behaviour == "huge":
            block = b" " * 65536
            for _ in range(self.huge_bytes // len(block)):
                conn.sendall(block)
            return
        if self.behaviour == "garbage":
            conn.sendall(self.garbage)
            return
        if self.document is not None:
            conn.sendall(self.document)
            return
        st = self.state()
        if json_fmt:
            defect = (2, 28, 7) <= _vtuple(self.version) < (2, 29, 2)
            conn.sendall(render_json(st, missing_comma_defect=defect).encode())
        else:
            conn.sendall((render_text_header(self.version) + "Job summary\n===========\n\n").encode())


def hung_job_status(hosts: Sequence[str], gpus_per_node: int, hung_rank: int, *, hang_view: str = "behind",
                    ops_done: int = 6650, hung_for_s: float = 0.0, version: str = "2.29.1",
                    timestamp: str = "2025-12-19 13:06:53", pid_base: int = 483072) -> FakeStatus:
    """One world communicator over ``hosts`` x ``gpus_per_node`` ranks with rank ``hung_rank`` stuck:
    ``behind`` (alive, one AllReduce fewer than its peers: RAS's MISMATCH) or ``missing`` (unreachable;
    considered dead once ``hung_for_s`` reaches 60 s).  Hosts are what RAS prints: the RAS network's IPs."""
    ranks: list[FakeRank] = []
    missing: list[FakeMissing] = []
    for i, host in enumerate(hosts):
        for g in range(gpus_per_node):
            r = i * gpus_per_node + g
            pid = pid_base + r
            if r == hung_rank and hang_view == "missing":
                missing.append(FakeMissing(r, host, pid, g, g, True, hung_for_s >= DEAD_AFTER_S))
                continue
            done = ops_done - 1 if r == hung_rank else ops_done
            ranks.append(FakeRank(r, host, pid, g, g, (0, 0, 0, 0, done)))
    n = len(hosts) * gpus_per_node
    comm = FakeComm(0xcf264af53edbe986, 0xb7e7187447156001, 0xb8242ed28a71381e, n, tuple(ranks), tuple(missing))
    return FakeStatus(nccl_version=version, timestamp=timestamp, comms=(comm,),
                      collection_time=2.05 if missing else 0.0, timeouts=2 if missing and hung_for_s < 60 else 0)
