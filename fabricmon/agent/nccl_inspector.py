"""Tail NCCL Inspector JSON logs and aggregate them per poll (never per collective).

NCCL Inspector (``NCCL_INSPECTOR_ENABLE=1``, ``NCCL_INSPECTOR_DUMP_DIR``, output
format v4.0) writes one file per process, one compact JSON object per
collective per line, for the whole life of the process.  This source keeps an
offset per file and, each poll:

* reads only what was appended, in chunks, up to a byte budget per poll (a
  backlog is finished on later polls); a file is never loaded whole;
* keeps an incomplete last line until its newline arrives;
* knows a file by (st_dev, st_ino), not by name: a renamed file (logrotate's
  ``mv r0.log r0.log.1``, NCCL still appending to it) goes on at its offset, a
  new file under the old name is read from its beginning, a hard link is read
  once, a file that shrank (truncation) restarts at 0;
* reads files present when it starts from their current end, files that appear
  later from their beginning;
* reads ``"nan"`` strings (a NaN double) as missing values.

Every line is validated (``nccl_records.parse_line``: names printable and
bounded, ranks in uint32, times, sizes and bandwidths finite, non-negative and
within a physical bound) or rejected with a reason of ``REJECT_REASONS``, counted
in ``fabricmon_intake_lines_total``.  At most ``max_series`` (rank, comm,
collective) and as many (rank, comm, direction, peer) series are held; a record that would add one more is refused
(``series_limit``) and series silent for ``series_ttl`` expire.  Running sums
restart from the new value before they leave the range a double holds
exactly (the tracker sees a counter reset), so no sum can overflow.

Output, labelled ``{rank, comm, collective}`` (``comm`` the header id, ``rank``
the header rank): running sums as MONOTONIC counters (the poller's tracker turns
them into deltas) for ``fabricmon_nccl_collectives_total``,
``fabricmon_nccl_collective_seconds_total`` (microseconds, scale 1e-6) and
``fabricmon_nccl_collective_bytes_total``, and the mean bus bandwidth of the
collectives seen this poll as ``fabricmon_nccl_bus_bandwidth_bytes_per_second``.
Send/Recv (``p2p_perf``, on by default from NCCL 2.30: pipeline-parallel traffic)
go to the same four measures under ``fabricmon_nccl_p2p_*{rank, comm, direction,
peer}`` (``direction`` tx for Send, rx for Recv; ``peer`` bounded, see
``_p2p_peer``), and the header's ``comm_name`` to ``fabricmon_nccl_comm_info``.

Prometheus mode (``NCCL_INSPECTOR_PROM_DUMP=1``, files ``nccl_inspector_metrics_<uuid>.prom``, see
``nccl_prom``) is read too, per window, never tailed: a file is read whole (bounded) once it changed
and is PROM_SETTLE_S old (NCCL truncates and rewrites it in place).  That mode carries no counts, no
rank and no communicator id, so it gives only the window's bus bandwidth per (GPU, comm_name,
collective) in ``fabricmon_nccl_window_bus_bandwidth_bytes_per_second`` (message-size and algorithm
buckets folded), ``fabricmon_nccl_window_age_seconds`` and, against the communicator's size,
``fabricmon_nccl_window_ranks`` (GPUs expected here versus reporting a fresh window).  Files that are
neither (``.tmp``, ``.gz``, ``.parquet``, a ``.prom`` NCCL did not name) are counted in
``fabricmon_intake_files{kind="skipped"}``, never silently passed over.
"""

from __future__ import annotations

import heapq
import math
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..model import Labels, Reading, Semantics, SourceResult
from ..sources.bounds import Rejected, read_bounded
from ..sources.guarded_io import open_regular
from .nccl_prom import PromSample, parse_prom_line, uuid_of_file
from .nccl_records import MAX_LINE, REJECT_REASONS, Header, NcclRecordError, parse_line

log = structlog.get_logger("fabricmon.nccl_inspector")

CHUNK = 1 << 20
# A dump dir collects the files of every past job: the most recently modified MAX_FILES are tailed,
# so at most MAX_FILES * MAX_LINE bytes of incomplete lines are held.
MAX_FILES = 1024
MAX_ENTRIES = 65536  # directory entries looked at per poll
PROM_SUFFIX = ".prom"
SKIP_SUFFIXES = (".tmp", ".gz", ".parquet")  # temporary, compressed or columnar: not read, but counted
PROM_SETTLE_S = 2.0  # a prom file rewritten less than this ago may be half-written (NCCL truncates in place)
PROM_MAX_BYTES = 1 << 20  # NCCL's README: ~12-24 KB per GPU
PROM_MAX_AGE_S = 150.0  # 5 of prom mode's 30 s windows: an older window is not shown as the current one
FILE_KINDS = ("json", "prom", "skipped")
MAX_P2P_PEERS = 8  # per (rank, comm, direction); further peers share peer="other"
SUM_LIMIT = 2**52  # a running sum restarts before a double loses integer precision


@dataclass
class _File:
    ino: int
    dev: int
    offset: int
    path: str = ""
    partial: bytearray = field(default_factory=bytearray)
    skip_first: bool = False  # started mid-file: the first fragment is not a whole line


@dataclass
class _PromFile:
    """The last window read from one prom-mode file."""

    uuid: str
    stamp: tuple[int, int] = (-1, -1)  # (st_mtime_ns, st_size) of the window read
    mtime: float = 0.0  # wall-clock time NCCL wrote it
    bandwidth: dict[tuple[str, str], float] = field(default_factory=dict)  # (comm_name, op) -> bytes/s
    comms: set[tuple[str, int, int]] = field(default_factory=set)  # (comm_name, nranks, n_nodes)


def _kind(name: str) -> str:
    if name.endswith(PROM_SUFFIX):
        return "prom" if uuid_of_file(name) is not None else "skipped"
    return "skipped" if name.endswith(SKIP_SUFFIXES) else "json"


@dataclass
class _Series:
    count: int = 0
    exec_us: float = 0.0
    bytes: int = 0
    last_seen: float = 0.0


class NcclInspectorSource:
    name = "nccl_inspector"

    def __init__(
        self,
        directory: str,
        *,
        timeout: float = 0.5,
        max_bytes_per_poll: int = 64 << 20,
        series_ttl: float = 3600.0,
        max_series: int = 2048,
        clock=time.monotonic,
        wall_clock=time.time,
    ) -> None:
        if max_series < 1 or series_ttl <= 0 or max_bytes_per_poll < 1:
            raise ValueError("nccl inspector limits must be positive")
        self.directory = directory
        self.timeout = timeout
        self._budget = max_bytes_per_poll
        self._ttl = series_ttl
        self._max_series = max_series
        self._clock = clock
        self._wall = wall_clock  # prom files are judged by their mtime, a wall-clock time
        self._files: dict[tuple[int, int], _File] = {}  # (st_dev, st_ino) -> read state
        self._prom: dict[tuple[int, int], _PromFile] = {}  # (st_dev, st_ino) -> last window
        self._file_kinds = dict.fromkeys(FILE_KINDS, 0)
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._p2p: dict[tuple[str, str, str, str], _Series] = {}  # (rank, comm, direction, peer)
        self._peers: dict[tuple[str, str, str], set[str]] = {}
        self._comms: dict[tuple[str, str, str], float] = {}  # (rank, comm, comm_name) -> last seen
        self.records_total = 0
        self.bad_lines_total = 0
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.expired_total = 0
        self._overfull_logged = False
        # Files present now are read from their current end.
        for path, st in self._scan([]):
            if _kind(os.path.basename(path)) != "json":
                continue
            self._files.setdefault((st.st_dev, st.st_ino), _File(
                st.st_ino, st.st_dev, st.st_size, path,
                skip_first=not self._ends_with_newline(path, st.st_size)))

    @staticmethod
    def _ends_with_newline(path: str, size: int) -> bool:
        if size == 0:
            return True
        try:
            fd, _ = open_regular(path)  # never blocks: a FIFO swapped in is refused (guarded_io)
            with os.fdopen(fd, "rb") as fh:
                fh.seek(size - 1)
                return fh.read(1) == b"\n"
        except OSError:
            return True

    def _scan(self, errors: list[str]) -> list[tuple[str, os.stat_result]]:
        """Regular files in the directory and its direct subdirectories (per-job dirs); no links followed.

        At most MAX_ENTRIES entries are looked at and the MAX_FILES most recently modified files
        kept (in path order), so a directory of a million stale files costs a bounded scan."""
        out: list[tuple[str, os.stat_result]] = []
        budget = [MAX_ENTRIES]

        def walk(d: str, subdirs: bool) -> None:
            try:
                it = os.scandir(d)
            except FileNotFoundError:
                return
            except OSError as exc:
                errors.append(f"{d}: {exc.strerror or exc}")
                return
            with it:
                for e in it:
                    budget[0] -= 1
                    if budget[0] < 0:
                        return
                    if e.name.startswith("."):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        out.append((e.path, st))
                    elif subdirs and stat.S_ISDIR(st.st_mode):
                        walk(e.path, False)

        walk(self.directory, True)
        if budget[0] < 0 or len(out) > MAX_FILES:
            if not self._overfull_logged:
                log.warning("nccl_inspector_dir_overfull", directory=self.directory, files=len(out),
                            tailed=MAX_FILES, entries_looked_at=MAX_ENTRIES)
                self._overfull_logged = True
            out = heapq.nlargest(MAX_FILES, out, key=lambda f: f[1].st_mtime_ns)
        out.sort()
        return out

    # ------------------------------------------------------------ the poll

    def poll(self, inventory=None) -> SourceResult:
        res = SourceResult(self.name, present=os.path.isdir(self.directory))
        if not res.present:
            return res
        t0 = time.monotonic()
        deadline = t0 + 0.8 * self.timeout
        budget = self._budget
        now = self._clock()
        interval_bw: dict[tuple[str, ...], list[float]] = {}
        errors: list[str] = []
        seen: set[tuple[int, int]] = set()
        # Evict series silent for a long time (each job brings new comm ids) before reading,
        # so their slots are free for this poll's records.
        tables: tuple[dict[Any, _Series], ...] = (self._series, self._p2p)
        for table in tables:
            expired = [k for k, s in table.items() if now - s.last_seen > self._ttl]
            for old in expired:
                del table[old]
            self.expired_total += len(expired)
        for comm_key in [k for k, seen in self._comms.items() if now - seen > self._ttl]:
            del self._comms[comm_key]
        live = {k[:3] for k in self._p2p}
        for peer_key in [k for k in self._peers if k not in live]:
            del self._peers[peer_key]
        kinds = dict.fromkeys(FILE_KINDS, 0)
        prom_seen: set[tuple[int, int]] = set()
        for path, st in self._scan(errors):
            key = (st.st_dev, st.st_ino)
            if key in seen or key in prom_seen:
                continue  # a hard link to a file already read this poll
            kind = _kind(os.path.basename(path))
            kinds[kind] += 1
            if kind == "prom":
                prom_seen.add(key)
                if budget > 0 and time.monotonic() <= deadline:  # else next poll: its stamp is unchanged
                    budget -= self._read_prom(path, st, key, errors)
                continue
            if kind != "json":
                continue
            seen.add(key)
            f = self._files.get(key)
            if f is None:
                f = self._files[key] = _File(st.st_ino, st.st_dev, 0, path)  # new file: from its beginning
            elif st.st_size < f.offset:
                log.info("nccl_inspector_truncated", file=path, size=st.st_size, offset=f.offset)
                f.offset = 0
                f.partial.clear()
                f.skip_first = False
            f.path = path  # the current name, for messages (a rename keeps the offset)
            if st.st_size == f.offset or budget <= 0 or time.monotonic() > deadline:
                continue
            budget -= self._read_file(path, f, st.st_size, budget, deadline, now, interval_bw, errors)
        for gone in [k for k in self._files if k not in seen]:
            del self._files[gone]
        for gone in [k for k in self._prom if k not in prom_seen]:
            del self._prom[gone]  # NCCL unlinks its prom files at exit
        self._file_kinds = kinds
        for msg in errors[:20]:
            res.error(msg)
        if len(errors) > 20:
            res.error(f"... and {len(errors) - 20} more")
        for (rank, comm, coll), s in self._series.items():
            labels: Labels = (("rank", rank), ("comm", comm), ("collective", coll))
            res.readings.append(Reading("fabricmon_nccl_collectives_total", labels, s.count, Semantics.MONOTONIC))
            res.readings.append(Reading("fabricmon_nccl_collective_seconds_total", labels, int(s.exec_us),
                                        Semantics.MONOTONIC, scale=1e-6))
            res.readings.append(Reading("fabricmon_nccl_collective_bytes_total", labels, s.bytes, Semantics.MONOTONIC))
        for (rank, comm, direction, peer), s in self._p2p.items():
            labels = (("rank", rank), ("comm", comm), ("direction", direction), ("peer", peer))
            res.readings.append(Reading("fabricmon_nccl_p2p_operations_total", labels, s.count, Semantics.MONOTONIC))
            res.readings.append(Reading("fabricmon_nccl_p2p_seconds_total", labels, int(s.exec_us),
                                        Semantics.MONOTONIC, scale=1e-6))
            res.readings.append(Reading("fabricmon_nccl_p2p_bytes_total", labels, s.bytes, Semantics.MONOTONIC))
        for rank, comm, name in self._comms:
            res.readings.append(Reading("fabricmon_nccl_comm_info",
                                        (("rank", rank), ("comm", comm), ("comm_name", name)), 1))
        for (kind, rank, comm, *rest), vals in interval_bw.items():
            if kind == "coll":
                family = "fabricmon_nccl_bus_bandwidth_bytes_per_second"
                labels = (("rank", rank), ("comm", comm), ("collective", rest[0]))
            else:
                family = "fabricmon_nccl_p2p_bus_bandwidth_bytes_per_second"
                labels = (("rank", rank), ("comm", comm), ("direction", rest[0]), ("peer", rest[1]))
            res.readings.append(Reading(family, labels, sum(vals) / len(vals) * 1e9))
        res.readings.extend(self._prom_readings())
        res.readings.extend(self.self_readings())
        return res

    def self_readings(self) -> list[Reading]:
        src = ("source", self.name)
        out = [Reading("fabricmon_intake_lines_total", (src, ("result", "accepted"), ("reason", "ok")),
                       self.records_total, Semantics.MONOTONIC)]
        for reason, n in self.rejected.items():
            out.append(Reading("fabricmon_intake_lines_total", (src, ("result", "rejected"), ("reason", reason)), n,
                               Semantics.MONOTONIC))
        windows = sum(len(pf.bandwidth) for pf in self._prom.values())
        out.append(Reading("fabricmon_intake_series", (src,), len(self._series) + len(self._p2p) + windows))
        for kind, n in self._file_kinds.items():
            out.append(Reading("fabricmon_intake_files", (src, ("kind", kind)), n))
        for reason, n in (("limit", self.rejected["series_limit"]), ("expired", self.expired_total)):
            out.append(Reading("fabricmon_intake_series_dropped_total", (src, ("reason", reason)), n,
                               Semantics.MONOTONIC))
        return out

    def _read_file(self, path: str, f: _File, size: int, budget: int, deadline: float, now: float,
                   bw: dict, errors: list[str]) -> int:
        used = 0
        try:
            # The dir is writable by every job: whatever was swapped in since the scan's lstat (a FIFO
            # would block a plain open for good) is refused by fstat on the opened fd, and another
            # regular file under the name waits for the next scan.
            fd, st = open_regular(path)
            if (st.st_dev, st.st_ino) != (f.dev, f.ino):
                os.close(fd)
                errors.append(f"{path}: replaced since the directory scan; read on the next poll")
                return 0
            with os.fdopen(fd, "rb") as fh:
                fh.seek(f.offset)
                while f.offset < size and used < budget and time.monotonic() < deadline:
                    chunk = fh.read(min(CHUNK, size - f.offset, budget - used))
                    if not chunk:
                        break
                    f.offset += len(chunk)
                    used += len(chunk)
                    self._consume(f, chunk, now, bw, errors, path)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
        return used

    # ------------------------------------------------------------ prom mode

    def _read_prom(self, path: str, st: os.stat_result, key: tuple[int, int], errors: list[str]) -> int:
        """Read one prom-mode file when it holds a new, settled window; the window replaces the last.
        Returns the bytes read (the poll's byte budget covers these files too)."""
        pf = self._prom.get(key)
        if pf is None:
            pf = self._prom[key] = _PromFile(uuid_of_file(os.path.basename(path)) or "")
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == pf.stamp or self._wall() - st.st_mtime < PROM_SETTLE_S:
            return 0  # the same window (NCCL leaves an idle GPU's file alone), or one still being written
        try:
            data = read_bounded(path, PROM_MAX_BYTES, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except Rejected as exc:
            pf.stamp = stamp
            self._reject("too_long", str(exc), errors, path)
            return PROM_MAX_BYTES
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
            return 0
        samples: list[PromSample] = []
        for line in data.split(b"\n"):
            try:
                sample = parse_prom_line(line)
            except NcclRecordError as exc:
                self._reject(exc.reason, str(exc), errors, path)
                continue
            if sample is not None:
                samples.append(sample)
        pf.stamp, pf.mtime = stamp, st.st_mtime
        others = sum(len(p.bandwidth) for k, p in self._prom.items() if k != key)
        logs: dict[tuple[str, str], list[float]] = {}
        pf.comms = set()
        for s in samples:
            self.records_total += 1
            pf.comms.add((s.comm_name, s.nranks, s.n_nodes))
            if s.measure != "busbw_gbs" or s.value <= 0.0:
                continue  # NCCL writes 0 for a bucket without a bandwidth: no vote
            group = (s.comm_name, s.op)
            if group not in logs and others + len(logs) >= self._max_series:
                self._reject("series_limit", f"more than {self._max_series} series", errors, path)
                continue
            logs.setdefault(group, []).append(math.log(s.value))
        # NCCL's own mean within a bucket is geometric; across buckets (message sizes, algorithms,
        # which it gives no counts for) each bucket is one vote.
        pf.bandwidth = {g: math.exp(sum(v) / len(v)) * 1e9 for g, v in logs.items()}
        return len(data)

    def _prom_readings(self) -> list[Reading]:
        out: list[Reading] = []
        now = self._wall()
        reporting: dict[tuple[str, int, int], set[str]] = {}
        for pf in self._prom.values():
            if not pf.uuid or pf.stamp[0] < 0:
                continue  # not read yet (still settling)
            age = max(0.0, now - pf.mtime)
            out.append(Reading("fabricmon_nccl_window_age_seconds", (("uuid", pf.uuid),), age))
            if age > PROM_MAX_AGE_S:
                continue  # an old window is not the current bandwidth; its age says why it is gone
            for (comm_name, op), bw in pf.bandwidth.items():
                out.append(Reading("fabricmon_nccl_window_bus_bandwidth_bytes_per_second",
                                   (("uuid", pf.uuid), ("comm_name", comm_name), ("collective", op)), bw))
            for comm in pf.comms:
                reporting.setdefault(comm, set()).add(pf.uuid)
        for (comm_name, nranks, n_nodes), uuids in reporting.items():
            base = (("comm_name", comm_name), ("nranks", str(nranks)))
            out.append(Reading("fabricmon_nccl_window_ranks", base + (("state", "reporting"),), len(uuids)))
            if n_nodes and nranks % n_nodes == 0:  # spread evenly: this node should hold nranks / n_nodes
                out.append(Reading("fabricmon_nccl_window_ranks", base + (("state", "expected"),), nranks // n_nodes))
        return out

    def _reject(self, reason: str, message: str, errors: list[str], path: str) -> None:
        self.bad_lines_total += 1
        self.rejected[reason] += 1
        if len(errors) < 100:
            errors.append(f"{os.path.basename(path)}: bad record: {reason}: {message[:100]}")

    def _consume(self, f: _File, chunk: bytes, now: float, bw: dict, errors: list[str], path: str) -> None:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                f.partial += chunk[start:]
                if len(f.partial) > MAX_LINE:
                    if not f.skip_first:
                        self._reject("too_long", f"line over {MAX_LINE} bytes dropped", errors, path)
                    f.partial.clear()
                    f.skip_first = True  # drop the rest of it too
                return
            piece = chunk[start:nl]
            start = nl + 1
            if f.partial:
                piece = bytes(f.partial) + piece
                f.partial.clear()
            if f.skip_first:
                f.skip_first = False
                continue
            if piece.strip():
                self._record(piece, now, bw, errors, path)

    def _record(self, line: bytes, now: float, bw: dict, errors: list[str], path: str) -> None:
        try:
            rec = parse_line(line)
        except NcclRecordError as exc:
            self._reject(exc.reason, str(exc), errors, path)
            return
        h = rec.header
        if rec.kind == "coll":
            key: tuple[str, ...] = (h.rank, h.comm, rec.name)
            table: dict = self._series
        else:
            key = (h.rank, h.comm, rec.name, self._p2p_peer(h, rec.name, rec.peer))
            table = self._p2p
        s = table.get(key)
        if s is None:
            if len(table) >= self._max_series:
                self._reject("series_limit", f"more than {self._max_series} series", errors, path)
                return
            s = table[key] = _Series()
        self._note_comm(h, now)
        # Each term is bounded (parse_line), so a sum grows by at most that; restarting it
        # before SUM_LIMIT reads as a counter reset to the tracker, never as an overflow.
        s.count = s.count + 1 if s.count < SUM_LIMIT else 1
        s.last_seen = now
        if rec.exec_us is not None:
            s.exec_us = s.exec_us + rec.exec_us if s.exec_us < SUM_LIMIT else rec.exec_us
        if rec.size_bytes is not None:
            s.bytes = s.bytes + rec.size_bytes if s.bytes < SUM_LIMIT else rec.size_bytes
        if rec.busbw_gbs is not None:
            bw.setdefault((rec.kind, *key), []).append(rec.busbw_gbs)
        self.records_total += 1

    def _p2p_peer(self, h: Header, direction: str, peer: str) -> str:
        """The peer label, bounded: the first MAX_P2P_PEERS peers seen per (rank, comm,
        direction) keep their rank (pipeline stages talk to one or two), later ones
        share "other" (all-to-all over send/recv would make one series per rank)."""
        peers = self._peers.setdefault((h.rank, h.comm, direction), set())
        if peer in peers:
            return peer
        if len(peers) < MAX_P2P_PEERS:
            peers.add(peer)
            return peer
        return "other"

    def _note_comm(self, h: Header, now: float) -> None:
        key = (h.rank, h.comm, h.comm_name)
        if h.comm_name and (key in self._comms or len(self._comms) < self._max_series):
            self._comms[key] = now

    def close(self) -> None:
        self._files.clear()
