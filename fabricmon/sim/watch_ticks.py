"""The simulated agents' link watch between two regular polls.

Each simulated agent watches its links between polls as the real agent does (``agent/linkwatch.py``,
``link_watch`` seconds, only when shorter than the interval).  At each watch tick where some link's state
(up, width, speed) differs from the previous tick, the cluster advances to that tick and the nodes
concerned poll off their cadence, at most once between two regular polls (the poller's
``OffCadenceGate``): in tree mode the real agents' watches read their re-rendered trees and decide, in
memory mode the same rule picks the nodes; ``on_tick(ts)`` is then called (a benchmark ticks its
aggregator there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..batch import NodeBatch
from ..model import Snapshot
from ..rank_timing import RankTiming
from .cluster import ClusterState
from .tree_agents import TreeAgents

if TYPE_CHECKING:
    from .inmemory import BatchBuilder


class WatchTicks:
    def __init__(self, cluster: ClusterState, every: float, node_index: list[int]) -> None:
        self.cluster = cluster
        self.every = every  # the agents' link watch period (> 0)
        self.node_index = node_index  # tree mode: the nodes this instance renders
        self.batches = 0  # off-cadence batches the link watch caused

    def between(self, t_new: float, rates: tuple, extra: dict, deliver: Callable[[NodeBatch], None], *,
                builder: BatchBuilder | None = None, tree_agents: TreeAgents | None = None,
                on_snapshot: Callable[[str, Snapshot, list[RankTiming]], None] | None = None,
                on_tick: Callable[[float], None] | None = None) -> int:
        """The watch ticks from the cluster's time to ``t_new`` (the next regular poll), the cluster
        advancing at ``rates`` to each tick that sends batches (memory mode: ``builder``'s; tree mode:
        ``tree_agents``'); returns the tree files written."""
        c = self.cluster
        every = self.every
        t0 = c.t
        base = (c.links.up, c.links.lanes, c.links.speed)
        allowed = np.ones(c.n, dtype=bool)  # memory mode: each agent's OffCadenceGate
        files = 0
        k = 1
        while t0 + k * every < t_new - 1e-9:
            t_k = t0 + k * every
            k += 1
            now = c.faults.link_state(t_k)
            moved = np.zeros(c.n, dtype=bool)
            for now_k, base_k in zip(now, base, strict=True):
                moved |= (now_k != base_k).any(axis=1)
            base = now
            if tree_agents is None:
                fire = moved & allowed
                if not fire.any():
                    continue
                allowed &= ~fire
                c.advance(t_k - c.t, *rates)
                assert builder is not None  # memory mode: made by the runner's start()
                batches = builder.build({}, (), nodes=np.flatnonzero(fire).tolist())
                for b in batches:
                    deliver(b)
            else:
                mine = moved[self.node_index]
                if not mine.any():
                    continue  # no tree's link files change: the watches would read what they read before
                c.advance(t_k - c.t, *rates)
                files += tree_agents.render()
                batches = self._tree_polls(tree_agents, deliver, on_snapshot)
            self.batches += len(batches)
            extra["watch_batches"] = extra.get("watch_batches", 0) + len(batches)
            if batches and on_tick is not None:
                on_tick(c.ts())
        return files

    @staticmethod
    def _tree_polls(agents: TreeAgents, deliver: Callable[[NodeBatch], None],
                    on_snapshot: Callable[[str, Snapshot, list[RankTiming]], None] | None) -> list[NodeBatch]:
        """Tree mode: the batches of the agents whose link watch saw a change and polled off the cadence."""
        out: list[NodeBatch] = []
        for i, snap in agents.watch_polls():
            name = agents.name(i)
            if on_snapshot is not None:
                on_snapshot(name, snap, [])
            b = agents.batch(i, snap, ())
            out.append(b)
            deliver(b)
        return out
