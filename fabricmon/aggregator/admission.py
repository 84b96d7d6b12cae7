"""Which batches the engine may believe, and the cluster clock they are judged against.

A batch's ``ts`` is the node's own clock.  Before this module one batch stamped
ten years ahead moved the cluster's "now" for good: every node looked down, no
burst was new, no incident resolved.  Now time is per node and bounded:

* ``ClusterClock`` is what the engine ticks at.  ``wall`` mode (production):
  the aggregator's own wall clock, so no sample can move it.  ``sample`` mode
  (simulated time: demo, tests, benchmarks): the lower median of the time each
  node with a live stream last claimed, so one node, or a minority, cannot move
  it, and nodes that went silent stop holding it back once they disconnect.  A
  claim rejected as too far ahead still votes (only its node's one vote): when
  most of the cluster jumps ahead together (a simulation skipping time) the
  clock follows.
* ``admit`` rejects a sample time further than ``max_skew_s`` ahead of the
  clock, older than ``max_age_s`` behind it, or behind the node's own last
  admitted time.  Every rejection has a reason the caller counts and exports.
  In sample mode the bounds apply once three nodes vote: one outlier, ahead or
  behind, cannot be the median of three, so a bad first batch cannot lock out
  the honest nodes.  Below three nodes only the per-node bound applies (and with
  two, one node far behind holds the clock back): sample mode is for simulated
  clusters; production runs ``wall``.

The median is recomputed lazily (after a share of the nodes reported, or when
the tick asks), so admission stays O(1) amortized on the ingest hot path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

CLOCK_MODES = ("wall", "sample")

# Reasons a batch is dropped before it reaches the detectors (label values of
# fabricmon_ingest_batches_dropped_total{reason}).
TS_AHEAD = "ts_ahead"
TS_STALE = "ts_stale"
TS_BEHIND = "ts_behind"

# The median of three is the first that one outlier, ahead or behind, cannot pick.
MIN_VOTERS = 3


class ClusterClock:
    def __init__(self, mode: str = "sample", *, max_skew_s: float = 300.0, max_age_s: float = 3600.0,
                 wall: Callable[[], float] = time.time) -> None:
        if mode not in CLOCK_MODES:
            raise ValueError(f"clock mode must be one of {CLOCK_MODES}, got {mode!r}")
        self.mode = mode
        self.max_skew_s = max_skew_s
        self.max_age_s = max_age_s
        self.wall = wall
        self.latest: dict[str, float] = {}  # node -> latest admitted sample time
        self._claimed: dict[str, float] = {}  # node -> sample time of its last batch, admitted or not
        self._live: set[str] = set()  # nodes whose claim votes for the sample clock
        self._median = 0.0
        self._voters = 0
        self._stale = 0  # claims since the median was computed

    # ------------------------------------------------------------------ the clock
    def now(self) -> float:
        """The cluster's current time; 0.0 in sample mode before any node reported."""
        if self.mode == "wall":
            return self.wall()
        if self._stale:
            self._recompute()
        return self._median

    def _recompute(self) -> None:
        votes = sorted(self._claimed[n] for n in self._live) or sorted(self._claimed.values())
        self._median = votes[(len(votes) - 1) // 2] if votes else 0.0
        self._voters = len(votes)
        self._stale = 0

    def _reference(self) -> float | None:
        if self.mode == "wall":
            return self.wall()
        if self._stale and (self._voters < MIN_VOTERS or self._stale * 8 >= len(self._live)):
            self._recompute()
        return self._median if self._voters >= MIN_VOTERS else None

    def receipt(self, fallback: float) -> float:
        """The time a batch arrives, on this clock: the wall clock (injectable: ``wall``) in wall mode, the
        last computed median in sample mode (the simulated clock in the demo; one node cannot move it);
        ``fallback`` (the batch's own time) before any median.  Liveness is judged on it (agents_down)."""
        if self.mode == "wall":
            return self.wall()
        return self._median if self._median else fallback

    # ------------------------------------------------------------------ admission
    def judge(self, ts: float) -> str | None:
        """Bounds only, nothing recorded: for times carried inside a batch (rank timings)."""
        if not math.isfinite(ts):
            return TS_AHEAD
        ref = self._reference()
        if ref is None:
            return None
        if ts > ref + self.max_skew_s:
            return TS_AHEAD
        if ts < ref - self.max_age_s:
            return TS_STALE
        return None

    def admit(self, node: str, ts: float) -> str | None:
        """None when ``ts`` is believable for ``node`` (and recorded), else the reason it is not."""
        if not math.isfinite(ts):
            return TS_AHEAD
        ref = self._reference()
        if ref is not None and ts < ref - self.max_age_s:
            return TS_STALE
        last = self.latest.get(node)
        if last is not None and ts < last:
            return TS_BEHIND
        if self.mode == "sample":
            self._claimed[node] = ts
            self._live.add(node)
            self._stale += 1
        if ref is not None and ts > ref + self.max_skew_s:
            return TS_AHEAD
        self.latest[node] = ts
        return None

    def connected(self, node: str) -> None:
        if node in self._claimed:
            self._live.add(node)
            self._stale += 1

    def disconnected(self, node: str) -> None:
        """A node without a stream stops voting; its last time still bounds its next batch."""
        if node in self._live:
            self._live.discard(node)
            self._stale += 1
