"""Pure parsing of NCCL Inspector JSON lines (no I/O, no state beyond the header passed in).

What the writer emits (NVIDIA/nccl ``plugins/profiler/inspector/inspector_json.cc``
and its README; fixtures in ``tests/fixtures/realformat/nccl/``):

* ``{"header": {...}, "metadata": {...}, "coll_perf": {...}}`` -- one collective
  (output format v4.0 to v4.2: every line carries its own header);
* ``{"header": ..., "metadata": ..., "p2p_perf": {"p2p": "Send"|"Recv",
  "p2p_peer": N, "p2p_msg_size_bytes", "p2p_exec_time_us", "p2p_busbw_gbs", ...}}``
  -- one point-to-point operation (NCCL 2.30 tracks them by default,
  ``NCCL_INSPECTOR_ENABLE_P2P=1``): pipeline-parallel traffic;
* ``{"header": ..., "metadata": ..., "dump_stats": {...}}`` -- from v4.3 a marker
  that opens each communicator's dump batch; the ``coll_perf``/``p2p_perf``
  lines after it carry no header of their own and belong to the marker's;
* ``{"proxy_trace": {...}}`` (opt-in proxy tracing): not exported.

The header names the communicator by ``id`` (a hash) and, from NCCL 2.30, by
``comm_name`` (``"unknown"`` when the application gave none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Header", "Op", "Marker", "Ignored", "parse_object", "P2P_DIRECTIONS"]

#: p2p_perf.p2p -> the ``direction`` label (the Contract's rx/tx).
P2P_DIRECTIONS = {"Send": "tx", "Recv": "rx"}


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
    size_bytes: float | None
    busbw_gbs: float | None


@dataclass(frozen=True, slots=True)
class Marker:
    """A v4.3 ``dump_stats`` marker: the header of the lines that follow it, and the
    communicator's cumulative count of records its rings overwrote before a dump
    (``coll_dropped_total``/``p2p_dropped_total``; absent counts are not there)."""

    header: Header
    dropped: tuple[tuple[str, int], ...] = ()  # (kind "coll" | "p2p", cumulative count)


@dataclass(frozen=True, slots=True)
class Ignored:
    """A well-formed record this agent does not export (proxy traces)."""


def num(v) -> float | None:
    """A finite float, or None ("nan" strings, missing, garbage)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return None
    if not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def parse_header(h) -> Header:
    if not isinstance(h, dict):
        raise ValueError("header is not an object")
    rank, comm = h.get("rank"), h.get("id")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError("header.rank is not a non-negative integer")
    if not isinstance(comm, str) or not comm:
        raise ValueError("header.id is not a string")
    name = h.get("comm_name", "")
    if not isinstance(name, str):
        raise ValueError("header.comm_name is not a string")
    return Header(str(rank), comm, name[:128])


def parse_object(obj, context: Header | None) -> Op | Marker | Ignored:
    """Classify one decoded JSON line.  ``context`` is the last v4.3 marker's header
    in the same file (None before any).  Raises ValueError/KeyError/TypeError."""
    if not isinstance(obj, dict):
        raise ValueError("record is not an object")
    if "proxy_trace" in obj:
        return Ignored()
    header = parse_header(obj["header"]) if "header" in obj else context
    if "dump_stats" in obj:
        if header is None:
            raise ValueError("dump_stats without a header")
        stats = obj["dump_stats"]
        if not isinstance(stats, dict):
            raise ValueError("dump_stats is not an object")
        dropped = tuple((kind, v) for kind in ("coll", "p2p")
                        if isinstance(v := stats.get(f"{kind}_dropped_total"), int) and not isinstance(v, bool) and v >= 0)
        return Marker(header, dropped)
    if header is None:
        raise KeyError("header")
    if "coll_perf" in obj:
        perf = obj["coll_perf"]
        coll = perf["coll"]
        if not isinstance(coll, str) or not coll or len(coll) > 64:
            raise ValueError("bad coll")
        return Op(header, "coll", coll, "", num(perf.get("coll_exec_time_us")),
                  num(perf.get("coll_msg_size_bytes")), num(perf.get("coll_busbw_gbs")))
    if "p2p_perf" in obj:
        perf = obj["p2p_perf"]
        direction = P2P_DIRECTIONS.get(perf["p2p"])
        if direction is None:
            raise ValueError(f"bad p2p {str(perf['p2p'])[:20]!r}")
        peer = perf.get("p2p_peer")
        if isinstance(peer, bool) or not isinstance(peer, int) or peer < 0:
            raise ValueError("bad p2p_peer")
        return Op(header, "p2p", direction, str(peer), num(perf.get("p2p_exec_time_us")),
                  num(perf.get("p2p_msg_size_bytes")), num(perf.get("p2p_busbw_gbs")))
    raise KeyError("coll_perf")
