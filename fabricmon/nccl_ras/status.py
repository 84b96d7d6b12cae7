"""The RAS JSON status document (NCCL >= 2.28.7) as typed values; pure, no I/O.

Shape (client_support.cc ``jsonWriteHeader`` ... ``jsonWriteFooter``; ras.rst "JSON Output")::

    {"nccl_version": "2.29.1", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
     "timestamp": "2025-12-19 13:06:53", "communicators_count": 1,
     "communicators": [{"hash": "0x...", "secondary_hash": "0x...:0x...", "size": 2,
                        "ranks_count": 1, "missing_ranks_count": 1,
                        "ranks": [{"rank", "host", "pid", "cuda_dev", "nvml_dev",
                                   "status": {"init_state", "async_error", "finalize_called",
                                              "destroy_flag", "abort_flag"},
                                   "collective_counts": {"Broadcast": 0, ...}}],
                        "missing_ranks": [{"rank", "host", "pid", "cuda_dev", "nvml_dev",
                                           "status": {"unresponsive", "considered_dead"}}]}],
     "ras": {"collection_time_sec": 0.000, "timeouts_count": 0}}

Ranks are communicator ranks.  A rank is *missing* when RAS got no data for it; ``considered_dead``
once RAS could not reach its process for 60 s.  A present rank with ``init_state`` other than 0
(ncclSuccess) or 7 (ncclInProgress), or a non-zero ``async_error``, is in *error*.  A present rank
whose collective count of some operation is below its peers' is *behind*: RAS's MISMATCH (the
hung-rank shape, ras.rst "Sample Output").

NCCL 2.28.7 and 2.28.9 write a missing rank without the comma after ``nvml_dev`` (their
``jsonWriteMissingRank``; fixed in 2.29.2): invalid JSON exactly when a rank is missing.  That one
known defect is repaired (``KNOWN_DEFECTS``) when a strict parse fails; nothing else is guessed.

The answer comes from whatever listens on the RAS port, so parsing is bounded as well as the I/O: the
repair pattern cannot backtrack (possessive quantifiers: one pass, linear in the document) and runs only
on documents up to ``MAX_REPAIR_BYTES``; a document holding more than ``MAX_VALUES`` JSON values (counted
from its separators before decoding) is refused, since 32 MiB of ``{},`` would decode into 11 million
dicts, near a gigabyte, where the same bytes of a real status decode into about 150 MiB.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .protocol import TEXT_STATUS_START

MAX_DOCUMENT_BYTES = 32 * 1024 * 1024
MAX_REPAIR_BYTES = 16 * 1024 * 1024  # a 2.28 document with ~50,000 ranks; larger ones are not rewritten
# A real status carries one value per ~15 bytes (render_json of a 1,000-node world: 4.3 MB, 280,000
# values), so 32 MiB of it is ~2.2 million; this bound admits that with room and caps the decoded
# heap of a hostile document of the costliest shape ('"ab",' each a new str) near 250 MiB.
MAX_VALUES = 1 << 21
MAX_COMMUNICATORS = 1 << 16
MAX_RANKS = 1 << 20  # per communicator, present and missing each
MAX_TEXT = 256
MAX_COUNT = 2**64 - 1  # collective counts are uint64 (%lu)
INIT_OK = (0, 7)  # ncclSuccess, ncclInProgress (ras.rst: any other value is an error)

# (name, the NCCL versions that write it, pattern, replacement): repaired only after a strict parse failed.
# Each run (the digits, the whitespace before the first newline ([^\S\n]) and after it) is taken once and
# never given back, so no input makes the pattern backtrack.  ``(?=(?P<x>R))(?P=x)`` is an atomic R: a
# lookahead matches R greedily and the backreference consumes exactly that (Python 3.10 has no possessive
# ``*+``, which 3.11 added).
def _atomic(name: str, run: str) -> str:
    return f"(?=(?P<{name}>{run}))(?P={name})"


KNOWN_DEFECTS: tuple[tuple[str, str, re.Pattern[str], str], ...] = (
    ("missing_rank_nvml_dev_comma", "2.28.7-2.28.9",
     re.compile(r'(?P<head>"nvml_dev": -?' + _atomic("digits", "[0-9]+") + ")"
                r"(?P<tail>" + _atomic("pad", r"[^\S\n]*") + r"\n" + _atomic("indent", r"\s*") + '"status")'),
     r"\g<head>,\g<tail>"),
)


class RasFormatError(ValueError):
    """A status document refused; ``outcome`` is ``bad_json``, ``too_large`` or ``old_protocol``."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


@dataclass(frozen=True, slots=True)
class RankStatus:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    init_state: int
    async_error: int
    finalize_called: bool
    destroy_flag: bool
    abort_flag: bool
    collective_counts: tuple[tuple[str, int], ...]

    @property
    def in_error(self) -> bool:
        return self.init_state not in INIT_OK or self.async_error != 0


@dataclass(frozen=True, slots=True)
class MissingRank:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    unresponsive: bool
    considered_dead: bool


@dataclass(frozen=True, slots=True)
class Behind:
    """A present rank that launched fewer operations of ``op`` than the most any peer launched."""

    rank: int
    host: str
    pid: int
    op: str
    count: int
    peers: int  # the highest count of ``op`` among the communicator's ranks


@dataclass(frozen=True, slots=True)
class Communicator:
    hash: str
    secondary_hash: str
    size: int
    ranks: tuple[RankStatus, ...]
    missing: tuple[MissingRank, ...]

    def behind(self) -> list[Behind]:
        """Per rank, its most-behind operation (the largest gap), ranks in order."""
        if len(self.ranks) < 2:
            return []
        top: dict[str, int] = {}
        for r in self.ranks:
            for op, n in r.collective_counts:
                if n > top.get(op, -1):
                    top[op] = n
        out = []
        for r in self.ranks:
            worst: tuple[int, str, int] | None = None
            for op, n in r.collective_counts:
                gap = top[op] - n
                if gap > 0 and (worst is None or gap > worst[0]):
                    worst = (gap, op, n)
            if worst is not None:
                out.append(Behind(r.rank, r.host, r.pid, worst[1], worst[2], top[worst[1]]))
        return out


@dataclass(frozen=True, slots=True)
class RasStatus:
    nccl_version: str
    timestamp: str  # the RAS process's local time, no zone (strftime "%F %T")
    communicators: tuple[Communicator, ...]
    collection_time_s: float
    timeouts: int
    repaired: str = ""  # the KNOWN_DEFECTS entry applied, "" for a document that parsed as it came

    def world(self) -> Communicator | None:
        """The largest communicator (the job's world one, whose ranks are the job's ranks); None if none."""
        return max(self.communicators, key=lambda c: c.size, default=None)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _obj(v: object, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise RasFormatError("bad_json", f"{where}: expected an object, got {type(v).__name__}")
    return v


def _list(v: object, where: str, limit: int) -> list[Any]:
    if not isinstance(v, list):
        raise RasFormatError("bad_json", f"{where}: expected an array, got {type(v).__name__}")
    if len(v) > limit:
        raise RasFormatError("bad_json", f"{where}: {len(v)} entries, at most {limit}")
    return v


def _int(o: dict[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    v = o.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise RasFormatError("bad_json", f"{where}.{key}: expected an integer, got {_short(v)}")
    if not lo <= v <= hi:
        raise RasFormatError("bad_json", f"{where}.{key}: {v} out of [{lo}, {hi}]")
    return v


def _bool(o: dict[str, Any], key: str, where: str) -> bool:
    v = o.get(key)
    if not isinstance(v, bool):
        raise RasFormatError("bad_json", f"{where}.{key}: expected true or false, got {_short(v)}")
    return v


def _str(o: dict[str, Any], key: str, where: str) -> str:
    v = o.get(key)
    if not isinstance(v, str):
        raise RasFormatError("bad_json", f"{where}.{key}: expected a string, got {_short(v)}")
    if len(v) > MAX_TEXT or not v.isprintable():
        raise RasFormatError("bad_json", f"{where}.{key}: at most {MAX_TEXT} printable characters")
    return v


def _short(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


I32 = 2**31 - 1


def _rank(o: object, where: str) -> RankStatus:
    r = _obj(o, where)
    st = _obj(r.get("status"), f"{where}.status")
    counts = _obj(r.get("collective_counts"), f"{where}.collective_counts")
    if len(counts) > 64:
        raise RasFormatError("bad_json", f"{where}.collective_counts: {len(counts)} operations, at most 64")
    ops = []
    for op in counts:
        if not (0 < len(op) <= 64 and op.isprintable()):
            raise RasFormatError("bad_json", f"{where}.collective_counts: a bad operation name {_short(op)}")
        ops.append((op, _int(counts, op, f"{where}.collective_counts", 0, MAX_COUNT)))
    return RankStatus(
        rank=_int(r, "rank", where, 0, I32), host=_str(r, "host", where), pid=_int(r, "pid", where, -1, I32),
        cuda_dev=_int(r, "cuda_dev", where, -1, I32), nvml_dev=_int(r, "nvml_dev", where, -1, I32),
        init_state=_int(st, "init_state", f"{where}.status", -I32 - 1, I32),
        async_error=_int(st, "async_error", f"{where}.status", -I32 - 1, I32),
        finalize_called=_bool(st, "finalize_called", f"{where}.status"),
        destroy_flag=_bool(st, "destroy_flag", f"{where}.status"),
        abort_flag=_bool(st, "abort_flag", f"{where}.status"), collective_counts=tuple(ops))


def _missing(o: object, where: str) -> MissingRank:
    r = _obj(o, where)
    st = _obj(r.get("status"), f"{where}.status")
    return MissingRank(
        rank=_int(r, "rank", where, 0, I32), host=_str(r, "host", where), pid=_int(r, "pid", where, -1, I32),
        cuda_dev=_int(r, "cuda_dev", where, -1, I32), nvml_dev=_int(r, "nvml_dev", where, -1, I32),
        unresponsive=_bool(st, "unresponsive", f"{where}.status"),
        considered_dead=_bool(st, "considered_dead", f"{where}.status"))


def _loads(text: str) -> object:
    return json.loads(text, parse_constant=_reject_constant)


def _decode(data: bytes) -> tuple[object, str]:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise RasFormatError("too_large", f"status document of {len(data)} bytes, at most {MAX_DOCUMENT_BYTES}")
    values = sum(data.count(c) for c in (b",", b":", b"{", b"["))  # >= the values and keys it decodes into
    if values > MAX_VALUES:
        raise RasFormatError("too_large", f"status document of about {values} JSON values, at most {MAX_VALUES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RasFormatError("bad_json", f"not UTF-8 at byte {exc.start}") from None
    head = text.lstrip()[:32]
    if head.startswith(TEXT_STATUS_START):
        raise RasFormatError("old_protocol", "a text status (the server ignored SET FORMAT json: NCCL < 2.28.7)")
    try:
        return _loads(text), ""
    except (ValueError, RecursionError) as first:
        if len(data) > MAX_REPAIR_BYTES:
            raise RasFormatError("bad_json", f"not JSON (no repair over {MAX_REPAIR_BYTES} bytes): "
                                             f"{str(first)[:100]}") from None
        for name, _versions, pattern, repl in KNOWN_DEFECTS:
            fixed, n = pattern.subn(repl, text)
            if not n:
                continue
            try:
                return _loads(fixed), name
            except (ValueError, RecursionError):
                pass
        raise RasFormatError("bad_json", f"not JSON: {str(first)[:120]}") from None


def parse_status(data: bytes) -> RasStatus:
    """The status document ``STATUS`` answers in JSON format; raises RasFormatError naming the field."""
    doc, repaired = _decode(data)
    top = _obj(doc, "document")
    comms = []
    for i, c in enumerate(_list(top.get("communicators"), "communicators", MAX_COMMUNICATORS)):
        where = f"communicators[{i}]"
        co = _obj(c, where)
        ranks = tuple(_rank(r, f"{where}.ranks[{k}]")
                      for k, r in enumerate(_list(co.get("ranks"), f"{where}.ranks", MAX_RANKS)))
        missing = tuple(_missing(r, f"{where}.missing_ranks[{k}]")
                        for k, r in enumerate(_list(co.get("missing_ranks"), f"{where}.missing_ranks", MAX_RANKS)))
        size = _int(co, "size", where, 0, I32)
        if len(ranks) + len(missing) > size:
            raise RasFormatError("bad_json", f"{where}: {len(ranks)} ranks and {len(missing)} missing exceed its "
                                             f"size {size}")
        comms.append(Communicator(_str(co, "hash", where), _str(co, "secondary_hash", where), size, ranks, missing))
    ras = _obj(top.get("ras"), "ras")
    t = ras.get("collection_time_sec")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise RasFormatError("bad_json", f"ras.collection_time_sec: expected a number >= 0, got {_short(t)}")
    return RasStatus(nccl_version=_str(top, "nccl_version", "document"), timestamp=_str(top, "timestamp", "document"),
                     communicators=tuple(comms), collection_time_s=float(t),
                     timeouts=_int(ras, "timeouts_count", "ras", 0, I32), repaired=repaired)


MAX_LISTED = 64  # ranks listed per kind in a summary: the evidence names a handful, the counts tell the rest


@dataclass(frozen=True, slots=True)
class RankNote:
    """One rank RAS reports as missing, behind or in error, in communicator ``comm`` of ``comm_size``."""

    comm: str
    comm_size: int
    rank: int
    host: str
    pid: int
    cuda_dev: int
    dead: bool = False  # missing: RAS considers its process dead (unreachable for 60 s)
    unresponsive: bool = False  # missing: RAS could not reach it while gathering
    op: str = ""  # behind: the operation it launched fewer of
    count: int = 0  # behind: its count of ``op``
    peers: int = 0  # behind: the highest count of ``op`` among its peers
    init_state: int = 0  # error
    async_error: int = 0  # error


@dataclass(frozen=True, slots=True)
class RasSummary:
    """What a query found, bounded for the wire: the world communicator's ranks first, then any other
    communicator's whose process was not named yet (a process missing from the world is missing from
    its sub-communicators too)."""

    nccl_version: str
    communicators: int
    world_size: int
    missing: tuple[RankNote, ...]
    behind: tuple[RankNote, ...]
    errors: tuple[RankNote, ...]
    timeouts: int
    repaired: str = ""
    missing_total: int = 0
    behind_total: int = 0
    errors_total: int = 0


def summarize(st: RasStatus) -> RasSummary:
    world = st.world()
    order = ([world] if world is not None else []) + [c for c in st.communicators if c is not world]
    seen: dict[str, set[tuple[str, int]]] = {"missing": set(), "behind": set(), "errors": set()}
    out: dict[str, list[RankNote]] = {"missing": [], "behind": [], "errors": []}
    totals = {"missing": 0, "behind": 0, "errors": 0}

    def note(kind: str, n: RankNote) -> None:
        key = (n.host, n.pid) if n.pid >= 0 else (n.comm, n.rank)
        if key in seen[kind]:
            return
        seen[kind].add(key)
        totals[kind] += 1
        if len(out[kind]) < MAX_LISTED:
            out[kind].append(n)

    for c in order:
        for m in c.missing:
            note("missing", RankNote(c.hash, c.size, m.rank, m.host, m.pid, m.cuda_dev, dead=m.considered_dead,
                                     unresponsive=m.unresponsive))
        for b in c.behind():
            note("behind", RankNote(c.hash, c.size, b.rank, b.host, b.pid, -1, op=b.op, count=b.count, peers=b.peers))
        for r in c.ranks:
            if r.in_error:
                note("errors", RankNote(c.hash, c.size, r.rank, r.host, r.pid, r.cuda_dev, init_state=r.init_state,
                                        async_error=r.async_error))
    return RasSummary(st.nccl_version, len(st.communicators), world.size if world is not None else 0,
                      tuple(out["missing"]), tuple(out["behind"]), tuple(out["errors"]), st.timeouts, st.repaired,
                      totals["missing"], totals["behind"], totals["errors"])
