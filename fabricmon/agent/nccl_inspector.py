"""Tail NCCL Inspector JSON logs and aggregate them per poll (never per collective).

NCCL Inspector (``NCCL_INSPECTOR_ENABLE=1``, ``NCCL_INSPECTOR_DUMP_DIR``, output
format v4.0) writes one file per process, one compact JSON object per
collective per line, for the whole life of the process.  This source keeps an
offset per file and, each poll:

* reads only what was appended, in chunks, up to a byte budget per poll (a
  backlog is finished on later polls); a file is never loaded whole;
* keeps an incomplete last line until its newline arrives;
* restarts a file at 0 when it shrank (truncation) and treats a changed inode
  as a new file (rotation);
* reads files present when it starts from their current end, files that appear
  later from their beginning;
* reads ``"nan"`` strings (a NaN double) as missing values;
* parses each line with ``nccl_records.parse_object``: ``coll_perf`` and
  ``p2p_perf`` records, and the v4.3 ``dump_stats`` marker whose header the
  following header-less lines of the same file belong to.

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
v4.3 ``dump_stats`` markers also give ``fabricmon_nccl_dropped_records_total{rank,
comm, kind}``: records the Inspector's rings overwrote before it could dump them.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field

import structlog

from ..model import Reading, Semantics, SourceResult
from .nccl_records import Header, Ignored, Marker, parse_object

log = structlog.get_logger("fabricmon.nccl_inspector")

CHUNK = 1 << 20
MAX_LINE = 1 << 20  # a "line" longer than this is garbage: dropped
MAX_FILES = 4096
MAX_P2P_PEERS = 8  # per (rank, comm, direction); further peers share peer="other"
SKIP_SUFFIXES = (".prom", ".tmp", ".gz", ".parquet")


@dataclass
class _File:
    ino: int
    dev: int
    offset: int
    partial: bytearray = field(default_factory=bytearray)
    skip_first: bool = False  # started mid-file: the first fragment is not a whole line


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
        clock=time.monotonic,
    ) -> None:
        self.directory = directory
        self.timeout = timeout
        self._budget = max_bytes_per_poll
        self._ttl = series_ttl
        self._clock = clock
        self._files: dict[str, _File] = {}
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._p2p: dict[tuple[str, str, str, str], _Series] = {}  # (rank, comm, direction, peer)
        self._peers: dict[tuple[str, str, str], set[str]] = {}
        self._comms: dict[tuple[str, str, str], float] = {}  # (rank, comm, comm_name) -> last seen
        self._context: dict[str, Header] = {}  # per file: header of the last v4.3 dump_stats marker
        self._dropped: dict[tuple[str, str, str], tuple[int, float]] = {}  # (rank, comm, kind) -> (total, seen)
        self.records_total = 0
        self.bad_lines_total = 0
        # Files present now are read from their current end.
        for path, st in self._scan([]):
            self._files[path] = _File(st.st_ino, st.st_dev, st.st_size, skip_first=not self._ends_with_newline(path, st.st_size))

    @staticmethod
    def _ends_with_newline(path: str, size: int) -> bool:
        if size == 0:
            return True
        try:
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                return fh.read(1) == b"\n"
        except OSError:
            return True

    def _scan(self, errors: list[str]) -> list[tuple[str, os.stat_result]]:
        """Regular files in the directory and its direct subdirectories (per-job dirs); no links followed."""
        out: list[tuple[str, os.stat_result]] = []

        def walk(d: str, subdirs: bool) -> None:
            try:
                entries = list(os.scandir(d))
            except FileNotFoundError:
                return
            except OSError as exc:
                errors.append(f"{d}: {exc.strerror or exc}")
                return
            for e in entries:
                if e.name.startswith(".") or e.name.endswith(SKIP_SUFFIXES):
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
        out.sort()
        return out[:MAX_FILES]

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
        seen: set[str] = set()
        for path, st in self._scan(errors):
            seen.add(path)
            f = self._files.get(path)
            if f is None or f.ino != st.st_ino or f.dev != st.st_dev:
                f = _File(st.st_ino, st.st_dev, 0)  # new (or rotated) file: from its beginning
                self._files[path] = f
                self._context.pop(path, None)
            elif st.st_size < f.offset:
                log.info("nccl_inspector_truncated", file=path, size=st.st_size, offset=f.offset)
                f.offset = 0
                f.partial.clear()
                f.skip_first = False
                self._context.pop(path, None)
            if st.st_size == f.offset or budget <= 0 or time.monotonic() > deadline:
                continue
            budget -= self._read_file(path, f, st.st_size, budget, deadline, now, interval_bw, errors)
        for gone in [p for p in self._files if p not in seen]:
            del self._files[gone]
        for msg in errors[:20]:
            res.error(msg)
        if len(errors) > 20:
            res.error(f"... and {len(errors) - 20} more")
        # evict series silent for a long time (each job brings new comm ids)
        for table in (self._series, self._p2p):
            for key in [k for k, v in table.items() if now - v.last_seen > self._ttl]:
                del table[key]
        for key in [k for k, seen in self._comms.items() if now - seen > self._ttl]:
            del self._comms[key]
        for key in [k for k, (_, seen) in self._dropped.items() if now - seen > self._ttl]:
            del self._dropped[key]
        live = {k[:3] for k in self._p2p}
        for key in [k for k in self._peers if k not in live]:
            del self._peers[key]
        for path in [p for p in self._context if p not in self._files]:
            del self._context[path]
        for (rank, comm, coll), s in self._series.items():
            labels = (("rank", rank), ("comm", comm), ("collective", coll))
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
        for (rank, comm, kind), (total, _) in self._dropped.items():
            # The Inspector's own cumulative count: its rings overwrote these before a dump,
            # so the sums above undercount by as much.
            res.readings.append(Reading("fabricmon_nccl_dropped_records_total",
                                        (("rank", rank), ("comm", comm), ("kind", kind)), total, Semantics.MONOTONIC))
        for rank, comm, name in self._comms:
            res.readings.append(Reading("fabricmon_nccl_comm_info", (("rank", rank), ("comm", comm), ("comm_name", name)), 1))
        for (kind, rank, comm, *rest), vals in interval_bw.items():
            if kind == "coll":
                family = "fabricmon_nccl_bus_bandwidth_bytes_per_second"
                labels = (("rank", rank), ("comm", comm), ("collective", rest[0]))
            else:
                family = "fabricmon_nccl_p2p_bus_bandwidth_bytes_per_second"
                labels = (("rank", rank), ("comm", comm), ("direction", rest[0]), ("peer", rest[1]))
            res.readings.append(Reading(family, labels, sum(vals) / len(vals) * 1e9))
        return res

    def _read_file(self, path: str, f: _File, size: int, budget: int, deadline: float, now: float,
                   bw: dict, errors: list[str]) -> int:
        used = 0
        try:
            with open(path, "rb") as fh:
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

    def _consume(self, f: _File, chunk: bytes, now: float, bw: dict, errors: list[str], path: str) -> None:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                f.partial += chunk[start:]
                if len(f.partial) > MAX_LINE:
                    errors.append(f"{path}: line over {MAX_LINE} bytes dropped")
                    self.bad_lines_total += 1
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
            rec = parse_object(json.loads(line), self._context.get(path))
        except (ValueError, KeyError, TypeError) as exc:
            self.bad_lines_total += 1
            if len(errors) < 100:
                errors.append(f"{os.path.basename(path)}: bad record: {type(exc).__name__}: {str(exc)[:80]}")
            return
        if isinstance(rec, Marker):
            self._context[path] = rec.header
            self._note_comm(rec.header, now)
            for kind, total in rec.dropped:
                self._dropped[(rec.header.rank, rec.header.comm, kind)] = (total, now)
            return
        if isinstance(rec, Ignored):
            return
        self._note_comm(rec.header, now)
        h = rec.header
        if rec.kind == "coll":
            key = (h.rank, h.comm, rec.name)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series()
        else:
            key = (h.rank, h.comm, rec.name, self._p2p_peer(h, rec.name, rec.peer))
            s = self._p2p.get(key)
            if s is None:
                s = self._p2p[key] = _Series()
        s.count += 1
        s.last_seen = now
        if rec.exec_us is not None and rec.exec_us >= 0:
            s.exec_us += rec.exec_us
        if rec.size_bytes is not None and rec.size_bytes >= 0:
            s.bytes += int(rec.size_bytes)
        if rec.busbw_gbs is not None and rec.busbw_gbs >= 0:
            bw.setdefault((rec.kind,) + key, []).append(rec.busbw_gbs)
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
        if h.comm_name:
            self._comms[(h.rank, h.comm, h.comm_name)] = now

    def close(self) -> None:
        self._files.clear()
