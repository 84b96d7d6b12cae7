"""Memory mode of the simulator: no files, no agents; ``inmemory.BatchBuilder`` makes the NodeBatch each
node's agent would stream, and this completes each with what the agent streams beside its series: the
switch sweep on the sweeping node, the node's ranks' timings, heartbeats and the jobs' layouts (as
values, or through the node's real rank intake with ``rank_intake``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..batch import NodeBatch, NodeHello
from ..rank_timing import Heartbeat, RankTiming
from .cluster import ClusterState
from .intake_feed import IntakeFeed
from .sweep_feed import SweepFeed


class MemoryBatches:
    def __init__(self, cluster: ClusterState, interval: float, sweep: SweepFeed | None, now: Callable[[], float],
                 layouts: Callable[[], tuple], intake_feed: IntakeFeed | None) -> None:
        from .inmemory import BatchBuilder

        self.cluster = cluster
        self.builder = BatchBuilder(cluster, interval)
        self.sweep = sweep
        self._now = now
        self._layouts = layouts
        self._intake_feed = intake_feed  # rank_intake: the nodes' real rank intakes (sim/intake_feed.py)

    def hellos(self) -> list[NodeHello]:
        return self.builder.hellos()

    def emit(self, by_node: dict[str, list[RankTiming]], heartbeats: dict[str, list[Heartbeat]],
             deliver: Callable[[NodeBatch], None]) -> int:
        """Every node's batch of this interval, each delivered before the next is made
        (``BatchBuilder.stream``); returns how many."""
        feed = self._intake_feed
        if feed is not None:
            batches = self.builder.stream()
        else:
            batches = self.builder.stream(by_node, self._layouts())
        t = self.cluster.t
        sweep_node = self.sweep.node if self.sweep is not None else None
        sweep = self.sweep.series(t, self._now()) if self.sweep is not None and self.sweep.due(t) else None
        made = 0
        for b in batches:
            made += 1
            if sweep is not None and b.node == sweep_node:
                # the sweeping node's agent streams the sweep with its own series (one batch)
                b = replace(b, deltas=b.deltas + tuple(sweep[0]), gauges=b.gauges + tuple(sweep[1]))
            hb = heartbeats.get(b.node)
            if feed is not None:
                ranks, layouts, hbs = feed.through(b.node, by_node.get(b.node, []), hb or [])
                b = replace(b, ranks=ranks, layouts=layouts, heartbeats=hbs)
            elif hb:
                b = replace(b, heartbeats=tuple(hb))
            deliver(b)
        return made
