"""Bounded spool of batches the aggregator has not acknowledged.

On disk: one file per batch, ``<seq as 20 digits>.batch``, written atomically
with fsync (``fabricmon.atomic``), so names sort in replay order and a crash
never leaves a half-written batch under a real name.  A file is a small header
(magic, CRC-32, length) and a serialized *self-contained* ``fabricmon.v1.Batch``:
every series it uses is defined inline, so it can be replayed on any later
connection, after an agent restart too, whatever that connection's series table
holds.

The total size is bounded by ``max_bytes``: the oldest batches are dropped
first, counted in ``dropped_total`` and logged.  Files are verified when read;
a corrupt or truncated one is logged with its reason, counted in
``corrupt_total``, deleted and skipped; nothing here raises into the agent.

Entry names are the seqs the stream numbers from (``max_seq + 1``), so a name
outside the range a seq can take is never believed: past 2^64 - 1 (no uint64
carries it: every later batch would be unencodable) or further ahead of the
wall clock in ms than ``FUTURE_SLACK_MS`` (seqs start at the time in ms and
grow by one a batch: the aggregator would count every later batch
``seq_ahead``).  Such an entry is renamed ``set-aside-<name>`` (kept for
whoever looks, never reloaded), logged and counted in ``set_aside_total``.

``MemorySpool`` has the same interface without a disk, for the in-memory
simulator and an agent configured without a spool directory.
"""

from __future__ import annotations

import builtins
import os
import re
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import structlog

from ..atomic import atomic_write_bytes

log = structlog.get_logger("fabricmon.spool")

MAGIC = b"FMSPOOL1"
_HEADER = struct.Struct(">8sII")  # magic, crc32(payload), len(payload)
_NAME = re.compile(r"^(\d{20})\.batch$")
MAX_SEQ = 2**64 - 1  # uint64 on the wire
# The aggregator's default clock bound (max_skew_s 300 s): a seq further ahead of now in ms is dropped there.
FUTURE_SLACK_MS = 300_000
SET_ASIDE_PREFIX = "set-aside-"


def frame(payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, zlib.crc32(payload), len(payload)) + payload


def unframe(data: bytes) -> bytes:
    """Return the payload; raises ValueError naming what is wrong."""
    if len(data) < _HEADER.size:
        raise ValueError(f"truncated: {len(data)} bytes, header needs {_HEADER.size}")
    magic, crc, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("bad magic (not a fabricmon spool file)")
    payload = data[_HEADER.size:]
    if len(payload) != n:
        raise ValueError(f"truncated: payload {len(payload)} bytes, header says {n}")
    if zlib.crc32(payload) != crc:
        raise ValueError("checksum mismatch")
    return payload


class MemorySpool:
    """In-memory spool with the same interface and bound as ``Spool``."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[int, int] = OrderedDict()  # seq -> size (insertion is seq order)
        self._data: dict[int, bytes] = {}
        self._bytes = 0
        self.dropped_total = 0  # every batch lost here, whatever the reason (the three below, summed)
        self.full_dropped_total = 0
        self.write_failed_total = 0
        self.too_large_total = 0
        self.corrupt_total = 0
        self.written_total = 0
        self.set_aside_total = 0  # entries named outside the seq range (Spool._reload)

    # -- storage hooks (overridden by Spool)
    def _store(self, seq: int, data: bytes) -> None:
        self._data[seq] = data

    def _load(self, seq: int) -> bytes | None:
        return self._data.get(seq)

    def _remove(self, seq: int) -> None:
        self._data.pop(seq, None)

    # -- interface
    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def seqs(self) -> list[int]:
        with self._lock:
            return list(self._items)

    @property
    def max_seq(self) -> int:
        with self._lock:
            return next(reversed(self._items), 0) if self._items else 0

    # (below the ``bytes`` property, ``bytes`` in an annotation would name it: builtins.bytes)
    def append(self, seq: int, payload: builtins.bytes) -> bool:
        """Store one serialized self-contained batch; False if it could not be kept."""
        data = frame(payload)
        size = len(data)
        if size > self.max_bytes:
            with self._lock:
                self.dropped_total += 1
                self.too_large_total += 1
            log.warning("spool_batch_too_large", seq=seq, size=size, max_bytes=self.max_bytes)
            return False
        with self._lock:
            if self._items and seq <= next(reversed(self._items)):
                # Sequence numbers only grow; an older one means a caller bug or a
                # replayed duplicate: keep order by refusing it.
                log.warning("spool_seq_out_of_order", seq=seq, last=next(reversed(self._items)))
                return False
            dropped = []
            while self._items and self._bytes + size > self.max_bytes:
                old, osize = self._items.popitem(last=False)
                self._bytes -= osize
                self.dropped_total += 1
                self.full_dropped_total += 1
                dropped.append(old)
        for old in dropped:
            self._remove_quiet(old)
        if dropped:
            log.warning("spool_full_dropped_oldest", dropped=len(dropped), first_seq=dropped[0],
                        last_seq=dropped[-1], max_bytes=self.max_bytes, dropped_total=self.dropped_total)
        try:
            self._store(seq, data)
        except Exception as exc:  # ENOSPC, EIO, a read-only remount: this batch is lost, counted
            with self._lock:
                self.dropped_total += 1
                self.write_failed_total += 1
            log.error("spool_write_failed", seq=seq, error=f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            self._items[seq] = size
            self._bytes += size
            self.written_total += 1
        return True

    def next_after(self, seq: int) -> tuple[int, builtins.bytes] | None:
        """The first readable entry with a seq greater than ``seq`` (corrupt ones are skipped and removed)."""
        while True:
            with self._lock:
                cand = next((s for s in self._items if s > seq), None)
            if cand is None:
                return None
            payload = self.read(cand)
            if payload is not None:
                return cand, payload
            seq = cand

    def read(self, seq: int) -> builtins.bytes | None:
        try:
            data = self._load(seq)
            if data is None:
                raise ValueError("missing")
            return unframe(data)
        except (OSError, ValueError) as exc:
            with self._lock:
                present = seq in self._items
            if present:  # a file dropped concurrently is not corrupt
                self._forget(seq)
                with self._lock:
                    self.corrupt_total += 1
                log.warning("spool_entry_skipped", seq=seq, reason=str(exc))
            return None

    def ack(self, upto: int) -> int:
        """Remove every entry with seq <= ``upto``; returns how many."""
        with self._lock:
            done = [s for s in self._items if s <= upto]
        for s in done:
            self._forget(s)
        return len(done)

    def discard(self, seq: int) -> None:
        """Remove one entry (a batch the aggregator rejected as malformed)."""
        self._forget(seq)

    def _forget(self, seq: int) -> None:
        with self._lock:
            size = self._items.pop(seq, None)
            if size is None:
                return
            self._bytes -= size
        self._remove_quiet(seq)

    def _remove_quiet(self, seq: int) -> None:
        try:
            self._remove(seq)
        except OSError as exc:
            log.warning("spool_remove_failed", seq=seq, error=str(exc))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._items), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "dropped_total": self.dropped_total, "full_dropped_total": self.full_dropped_total,
                    "write_failed_total": self.write_failed_total, "too_large_total": self.too_large_total,
                    "corrupt_total": self.corrupt_total, "written_total": self.written_total,
                    "set_aside_total": self.set_aside_total}


class Spool(MemorySpool):
    """On-disk spool in ``directory``; reloads what a previous run left there."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = 64 * 1024 * 1024, *, fsync: bool = True,
                 wall: Callable[[], float] = time.time) -> None:
        super().__init__(max_bytes)
        self.directory = Path(directory)
        self._fsync = fsync
        self._wall = wall
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._reload()

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:020d}.batch"

    def _reload(self) -> None:
        found: list[tuple[int, int]] = []
        ceiling = min(MAX_SEQ, int(self._wall() * 1000) + FUTURE_SLACK_MS)
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                # an atomic write interrupted by a crash: never a complete batch
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
                log.warning("spool_entry_skipped", file=entry.name,
                            reason="leftover temporary file (interrupted write)")
                self.corrupt_total += 1
                continue
            m = _NAME.match(entry.name)
            if not m:
                continue  # not ours: leave it alone
            if not 0 < int(m.group(1)) <= ceiling:
                self._set_aside(entry.name, ceiling)
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                size = entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            found.append((int(m.group(1)), size))
        found.sort()
        for seq, size in found:
            self._items[seq] = size
            self._bytes += size
        # A smaller bound than the previous run's: trim the oldest now.
        dropped = 0
        while self._items and self._bytes > self.max_bytes:
            old, osize = self._items.popitem(last=False)
            self._bytes -= osize
            self._remove_quiet(old)
            dropped += 1
        if dropped:
            self.dropped_total += dropped
            self.full_dropped_total += dropped
            log.warning("spool_full_dropped_oldest", dropped=dropped, max_bytes=self.max_bytes)
        if self._items:
            log.info("spool_reloaded", entries=len(self._items), bytes=self._bytes, directory=str(self.directory))

    def _set_aside(self, name: str, ceiling: int) -> None:
        """An entry no seq can be: out of the numbering, kept under another name, counted."""
        self.set_aside_total += 1
        try:
            os.replace(self.directory / name, self.directory / (SET_ASIDE_PREFIX + name))
        except OSError as exc:
            log.error("spool_set_aside_failed", file=name, error=str(exc))
        log.warning("spool_entry_set_aside", file=name, reason=f"seq outside 1..{ceiling} (uint64, and at most "
                    f"{FUTURE_SLACK_MS // 1000} s ahead of the wall clock in ms)", renamed=SET_ASIDE_PREFIX + name)

    def _store(self, seq: int, data: bytes) -> None:
        atomic_write_bytes(self._path(seq), data, fsync=self._fsync)

    def _load(self, seq: int) -> bytes | None:
        with open(self._path(seq), "rb") as fh:
            return fh.read(self.max_bytes + _HEADER.size + 1)

    def _remove(self, seq: int) -> None:
        try:
            os.unlink(self._path(seq))
        except FileNotFoundError:
            pass
