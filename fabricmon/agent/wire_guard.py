"""Keeps out of a batch every item the wire cannot carry or the aggregator would refuse.

The protobuf encoder raises on one out-of-range integer or one lone surrogate,
and the aggregator refuses a whole batch for one non-finite delta or one over-long
label; either way one bad item would cost the whole batch (or the session).  So
each item is checked here, before encoding, against the field types of
``fabricmon/proto/fabricmon.proto`` and the limits of ``proto/codec.py``'s
decoder; an item that fails is dropped and counted under a fixed reason.

Pure: no I/O, no state but a cache of series keys already found good.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeGuard

from ..batch import NodeBatch
from ..proto.codec import MAX_LABELS, MAX_NAME, MAX_VALUE
from ..rank_timing import Heartbeat, JobLayout, RankTiming

# The reasons an item is dropped (label values of fabricmon_stream_items_dropped_total).
ITEM_REASONS = ("rank", "layout", "series", "delta", "heartbeat")

MAX_JOB = 128  # codec's decoder: ranks.job / layouts.job at most 128 characters
U32 = 2**32 - 1
U64 = 2**64 - 1
S32 = (-(2**31), 2**31 - 1)
S64 = (-(2**63), 2**63 - 1)


def _text(s: object, limit: int, *, empty_ok: bool = False) -> bool:
    if not isinstance(s, str) or len(s) > limit or (not s and not empty_ok):
        return False
    try:
        s.encode("utf-8")  # a lone surrogate cannot be encoded (protobuf strings are UTF-8)
    except UnicodeEncodeError:
        return False
    return True


def _uint(v: object, top: int) -> bool:
    return type(v) is int and 0 <= v <= top


def _sint(v: object, lo_hi: tuple[int, int]) -> bool:
    return type(v) is int and lo_hi[0] <= v <= lo_hi[1]


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pairs(pairs: Any) -> bool:  # anything off the wire: what is not pairs raises, and is refused
    try:
        return all(_text(k, MAX_NAME) and _sint(v, S64) for k, v in pairs)
    except (TypeError, ValueError):
        return False


def rank_ok(r: RankTiming) -> bool:
    return (_text(r.job, MAX_JOB) and _uint(r.rank, U32) and _uint(r.local_rank, U32) and _uint(r.step, U64)
            and _finite(r.step_seconds) and _finite(r.comm_seconds) and _finite(r.ts) and _sint(r.gpu, S32)
            and _pairs(r.group))


def heartbeat_ok(h: Heartbeat) -> bool:
    return (_text(h.job, MAX_JOB) and _text(h.job_id, MAX_JOB, empty_ok=True) and _uint(h.rank, U32)
            and _uint(h.step, U64) and _uint(h.coll_sn, U64) and isinstance(h.in_collective, bool) and _finite(h.ts)
            and _text(h.nccl_ras, MAX_JOB, empty_ok=True))


def layout_ok(lay: JobLayout) -> bool:
    return _text(lay.job, MAX_JOB) and _pairs(lay.layout)


def series_ok(family: object, labels: Any) -> bool:  # labels: anything off the wire, as _pairs
    if not _text(family, MAX_NAME):
        return False
    try:
        if len(labels) > MAX_LABELS:
            return False
        return all(_text(k, MAX_NAME) and _text(v, MAX_VALUE, empty_ok=True) for k, v in labels)
    except (TypeError, ValueError):
        return False


def delta_ok(v: object) -> bool:
    return _finite(v) and v >= 0


class WireGuard:
    """Filters batches; ``dropped`` counts the items dropped per reason (monotonic)."""

    def __init__(self, max_cached_series: int = 200_000) -> None:
        self.dropped = dict.fromkeys(ITEM_REASONS, 0)
        self._good: set = set()  # series keys already checked (a node's series rarely change)
        self._max_cached = max_cached_series

    def _series(self, key: tuple) -> bool:
        if key in self._good:
            return True
        if not series_ok(*key):
            return False
        if len(self._good) >= self._max_cached:
            self._good.clear()  # bounded: churned series are checked again
        self._good.add(key)
        return True

    def _keep(self, items: Iterable, ok, reason: str) -> tuple:
        out = []
        for it in items:
            try:
                good = ok(it)
            except Exception:  # an item of a shape nobody expected is just as unsendable
                good = False
            if good:
                out.append(it)
            else:
                self.dropped[reason] += 1
        return tuple(out)

    def clean(self, b: NodeBatch) -> NodeBatch:
        """The batch without the items it cannot carry (the same object when nothing was dropped)."""
        before = sum(self.dropped.values())
        deltas = []
        for d in b.deltas:
            try:
                good_series = self._series((d.family, d.labels))
            except Exception:
                good_series = False
            if not good_series:
                self.dropped["series"] += 1
            elif not delta_ok(d.delta):
                self.dropped["delta"] += 1
            else:
                deltas.append(d)
        gauges = self._keep(b.gauges,
                            lambda s: self._series((s.family, s.labels)) and isinstance(s.value, (int, float)),
                            "series")
        ranks = self._keep(b.ranks, rank_ok, "rank")
        layouts = self._keep(b.layouts, layout_ok, "layout")
        heartbeats = self._keep(b.heartbeats, heartbeat_ok, "heartbeat")
        if sum(self.dropped.values()) == before:
            return b
        return NodeBatch(node=b.node, seq=b.seq, ts=b.ts, interval_seconds=b.interval_seconds, deltas=tuple(deltas),
                         gauges=gauges, ranks=ranks, layouts=layouts, heartbeats=heartbeats)
