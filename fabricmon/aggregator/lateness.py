"""Slow pollers and late batches: detection windows and resolve holds scale with the agents' interval.

A node polled every 10 s whose batch arrives up to ``LATE_INTERVALS`` intervals behind the cluster
clock (a restarted shard's CPU burst, a reconnect replaying the spool) still counts: its links are
judged at its own latest sample time rather than the cluster's, so the detection windows hold its
latest batch; and an incident's hold is at least ``HOLD_INTERVALS`` of the interval, so the gap
before a late batch (up to ``LATE_INTERVALS + 1`` intervals since the previous one) never resolves
an incident that the batch then fires again.  A node later than that is judged at the cluster's
time (its evidence ages out; FabricmonAgentDown is for it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from .incidents import Finding

LATE_INTERVALS = 3
HOLD_INTERVALS = LATE_INTERVALS + 2  # the gap before a late batch, plus one window


def node_time(now: float, last_ts: float, interval: float) -> float:
    """When to judge a node's evidence: its latest sample time if at most LATE_INTERVALS intervals behind."""
    if math.isfinite(last_ts) and 0.0 <= now - last_ts <= LATE_INTERVALS * interval:
        return last_ts
    return now


def scale_holds(findings: Iterable[Finding], interval_of: Callable[[str | None], float], default_hold_s: float) -> None:
    """Raise each finding's hold to HOLD_INTERVALS of its node's interval (the slowest node's for
    findings on no node: a leaf, a rail, a job).  A hold of 0 (resolve at once) stays 0."""
    for f in findings:
        base = default_hold_s if f.hold_s is None else f.hold_s
        if base <= 0.0:
            continue
        floor = HOLD_INTERVALS * interval_of(f.labels.get("node"))
        if floor > base:
            f.hold_s = floor
