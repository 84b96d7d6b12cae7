"""Pure parsing and validation of NCCL Inspector JSON lines (no I/O, no state: each line stands alone).

What the writer emits (NVIDIA/nccl ``plugins/profiler/inspector/inspector_json.cc``
and its README; fixtures in ``tests/fixtures/realformat/nccl/``), every line with
``"inspector_output_format_version": "v4.0"`` in its ``metadata`` (the only version
string any NVIDIA/nccl commit writes, ``inspectorCommInfoMetaHeader``):

* ``{"header": {...}, "metadata": {...}, "coll_perf": {...}}`` -- one collective;
* ``{"header": ..., "metadata": ..., "p2p_perf": {"p2p": "Send"|"Recv",
  "p2p_peer": N, "p2p_msg_size_bytes", "p2p_exec_time_us", "p2p_busbw_gbs", ...}}``
  -- one point-to-point operation (NCCL 2.30 tracks them by default,
  ``NCCL_INSPECTOR_ENABLE_P2P=1``): pipeline-parallel traffic.

Every operation line carries its own header; a line of any other shape (no header,
or neither ``coll_perf`` nor ``p2p_perf``) is refused with ``missing_field``.

The header names the communicator by ``id`` (a hash) and, from NCCL 2.30, by
``comm_name`` (``"unknown"`` when the application gave none).

Everything that becomes a label is printable and bounded, every number finite,
non-negative and within a physical bound; anything else raises
``NcclRecordError`` with a reason of ``REJECT_REASONS`` (the self-metric label).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..rejected import InputRejected
from ..textcheck import label_text_ok

__all__ = ["Header", "Op", "NcclRecordError", "REJECT_REASONS", "P2P_DIRECTIONS",
           "parse_line", "parse_object", "MAX_LINE"]

#: p2p_perf.p2p -> the ``direction`` label (the Contract's rx/tx).
P2P_DIRECTIONS = {"Send": "tx", "Recv": "rx"}

MAX_LINE = 64 << 10  # records are ~1 KiB (more with NCCL_INSPECTOR_DUMP_VERBOSE); longer is garbage
MAX_NAME = 64
MAX_COMM_NAME = 128
MAX_RANK = 2**32 - 1
MAX_EXEC_US = 1e12        # 11.6 days for one operation
MAX_MSG_BYTES = 2**48     # 256 TiB in one operation
MAX_BUSBW_GBS = 1e6       # 1 PB/s

# Why a record was rejected: a fixed set (the self-metric label).
REJECT_REASONS = ("too_long", "not_utf8", "not_json", "not_object", "missing_field", "bad_type", "out_of_range",
                  "bad_string", "series_limit", "not_prom", "unknown_metric")  # the last two: prom mode (nccl_prom)


class NcclRecordError(InputRejected):
    """An NCCL Inspector line refused; ``reason`` is one of REJECT_REASONS."""


@dataclass(frozen=True, slots=True)
class Header:
    rank: str
    comm: str
    comm_name: str  # "" when the writer predates comm_name


@dataclass(frozen=True, slots=True)
class Op:
    """One completed collective (kind "coll", name = collective) or p2p op (kind "p2p")."""

    header: Header
    kind: str
    name: str  # AllReduce, ... for collectives; "tx"/"rx" for p2p
    peer: str  # p2p peer rank; "" for collectives
    exec_us: float | None
    size_bytes: int | None
    busbw_gbs: float | None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _measure(perf: dict, section: str, key: str, hi: float) -> float | None:
    """A finite value in [0, hi]; None when missing or "nan" (NCCL writes a NaN double as that string)."""
    v = perf.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        if v.strip().lower() == "nan":
            return None
        try:
            v = float(v)
        except ValueError:
            raise NcclRecordError("bad_type", f"{section}.{key}: not a number") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise NcclRecordError("bad_type", f"{section}.{key}: not a number")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if math.isnan(f):
        return None
    if not 0.0 <= f <= hi:
        raise NcclRecordError("out_of_range", f"{section}.{key}: must be in [0, {hi:g}], got {str(v)[:40]}")
    return f


def _rank(v, field: str) -> str:
    if v is None:
        raise NcclRecordError("missing_field", f"{field}: required")
    if isinstance(v, bool) or not isinstance(v, int):
        raise NcclRecordError("bad_type", f"{field}: expected an integer")
    if not 0 <= v <= MAX_RANK:
        raise NcclRecordError("out_of_range", f"{field}: must be in [0, {MAX_RANK}]")
    return str(v)


def _name(v, field: str, max_len: int) -> str:
    if not isinstance(v, str):
        raise NcclRecordError("bad_type", f"{field}: expected a string")
    if not label_text_ok(v, max_len):
        raise NcclRecordError("bad_string", f"{field}: must be 1 to {max_len} printable characters")
    return v


# The field checks, shared with the prom-mode parser (nccl_prom).
check_rank = _rank
check_name = _name


def parse_header(h) -> Header:
    if not isinstance(h, dict):
        raise NcclRecordError("bad_type", "header: expected an object")
    rank = _rank(h.get("rank"), "header.rank")
    comm = h.get("id")
    if comm is None:
        raise NcclRecordError("missing_field", "header.id: required")
    if isinstance(comm, int) and not isinstance(comm, bool) and 0 <= comm < 2**64:
        comm = f"0x{comm:x}"
    comm = _name(comm, "header.id", MAX_NAME)
    name = h.get("comm_name")
    name = "" if name is None else _name(name, "header.comm_name", MAX_COMM_NAME)
    return Header(rank, comm, name)


def _perf(obj: dict, key: str) -> dict:
    perf = obj[key]
    if not isinstance(perf, dict):
        raise NcclRecordError("bad_type", f"{key}: expected an object")
    return perf


def parse_object(obj) -> Op:
    """Classify and validate one decoded JSON line.  Raises NcclRecordError."""
    if not isinstance(obj, dict):
        raise NcclRecordError("not_object", "expected a JSON object")
    if "header" not in obj:
        raise NcclRecordError("missing_field", "header: required")
    header = parse_header(obj["header"])
    for kind in ("coll", "p2p"):
        if f"{kind}_perf" not in obj:
            continue
        section = f"{kind}_perf"
        perf = _perf(obj, section)
        what = perf.get(kind)  # collective name, or Send/Recv
        if what is None:
            raise NcclRecordError("missing_field", f"{section}.{kind}: required")
        if kind == "coll":
            name, peer = _name(what, "coll_perf.coll", MAX_NAME), ""
        else:
            direction = P2P_DIRECTIONS.get(what) if isinstance(what, str) else None
            if direction is None:
                raise NcclRecordError("bad_string", "p2p_perf.p2p: expected Send or Recv")
            name, peer = direction, _rank(perf.get("p2p_peer"), "p2p_perf.p2p_peer")
        size = _measure(perf, section, f"{kind}_msg_size_bytes", MAX_MSG_BYTES)
        return Op(header, kind, name, peer, _measure(perf, section, f"{kind}_exec_time_us", MAX_EXEC_US),
                  None if size is None else int(size), _measure(perf, section, f"{kind}_busbw_gbs", MAX_BUSBW_GBS))
    raise NcclRecordError("missing_field", "coll_perf or p2p_perf: required")


def parse_line(line: bytes) -> Op:
    """One NCCL Inspector JSON line; raises NcclRecordError with a reason of REJECT_REASONS."""
    if len(line) > MAX_LINE:
        raise NcclRecordError("too_long", f"line over {MAX_LINE} bytes")
    try:
        text = bytes(line).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NcclRecordError("not_utf8", f"not UTF-8 at byte {exc.start}") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise NcclRecordError("not_json", f"not JSON: {str(exc)[:80]}") from None
    return parse_object(obj)
