"""Tree mode of the simulator: a node tree (``sim.tree.NodeTree``) and a real agent (``sim.agents``) for
every node this instance renders, the thread pool that polls them, and their lifecycle.

Each interval the trees are re-rendered from the cluster state and every agent polls its tree on the
simulated clock; between polls the agents' link watches read their trees (``watch_polls``).  Each
node's snapshot becomes the batch its agent would stream (``batch``: the stream client's gauge rule and
sequence numbers).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Callable, Iterator

import structlog

from ..batch import NodeBatch, NodeHello
from ..model import Snapshot
from ..rank_timing import RankTiming
from .cluster import ClusterState

log = structlog.get_logger("fabricmon.sim")


class TreeAgents:
    def __init__(self, cluster: ClusterState, node_index: list[int], base_dir: str, clock: Callable[[], float],
                 interval: float, link_watch: float, *, http: bool = False, poll_workers: int = 1) -> None:
        self.cluster = cluster
        self.node_index = node_index  # the cluster's node indexes this instance renders and polls
        self.base_dir = base_dir
        self._clock = clock
        self.interval = interval
        self.link_watch = link_watch
        self.http = http
        self.trees: list = []
        self.agents: list = []
        self.http_ports: dict[str, int] = {}
        self._filters: list = []
        self._seq: list[int] = []
        self._pool: cf.ThreadPoolExecutor | None = None
        self._poll_workers = poll_workers

    def node_root(self, node: str) -> str:
        return os.path.join(self.base_dir, node)

    def start(self, sweep_node: str | None, switch_file: str | None) -> None:
        """Render every tree and start its agent (``sweep_node``'s agent reads ``switch_file``)."""
        from .agents import make_sim_agent
        from .inmemory import GaugeFilter
        from .tree import NodeTree

        c = self.cluster
        for i in self.node_index:
            name = c.names[i]
            tree = NodeTree(c, i, self.node_root(name))
            tree.render()
            self.trees.append(tree)
            agent = make_sim_agent(tree, self._clock, self.interval, self.link_watch,
                                   switch_file=switch_file if name == sweep_node else None)
            self.agents.append(agent)
            if self.http:
                self.http_ports[name] = agent.start_http("127.0.0.1:0")
            self._filters.append(GaugeFilter())
            self._seq.append(0)
        self._pool = cf.ThreadPoolExecutor(max_workers=self._poll_workers, thread_name_prefix="sim-poll")

    def hellos(self) -> list[NodeHello]:
        """The hello each node's agent sends when it connects."""
        from ..agent.stream_batches import hello_from_snapshot

        return [hello_from_snapshot(a.node, a.poller.latest, self.interval, boot_id=f"sim-{a.node}")
                for a in self.agents]

    def render(self) -> int:
        """Re-render every tree from the cluster state; returns the files written."""
        return sum(tree.render() for tree in self.trees)

    def watch_pass(self) -> None:
        """The link watches' pass of this tick: what changed since is in the regular poll that follows."""
        for a in self.agents:
            if a.link_watch is not None:
                a.link_watch.tick()

    def poll(self) -> list[Snapshot]:
        """Every agent's regular poll, in node order."""
        assert self._pool is not None  # start()
        return list(self._pool.map(lambda a: a.poller.poll_regular(), self.agents))

    def name(self, i: int) -> str:
        """The node name of the i-th tree."""
        return self.cluster.names[self.node_index[i]]

    def batch(self, i: int, snap: Snapshot, ranks: tuple[RankTiming, ...]) -> NodeBatch:
        """The next batch the i-th node's agent streams of ``snap``."""
        from .inmemory import batch_from_snapshot

        self._seq[i] += 1
        return batch_from_snapshot(snap, self._filters[i], self._seq[i], ranks)

    def first_batch(self, i: int) -> bool:
        """Whether the i-th node's last batch was its first (the one that carries the layouts)."""
        return self._seq[i] == 1

    def watch_polls(self) -> Iterator[tuple[int, Snapshot]]:
        """Every real agent's link watch reads its tree; those that saw a change poll off the cadence if
        their poller's gate allows: (tree index, snapshot) of each, one agent at a time."""
        for i, a in enumerate(self.agents):
            watch = a.link_watch
            if watch is None:
                continue
            before = watch.requests_total
            watch.tick()
            if watch.requests_total == before:
                continue
            snap = a.poller.poll_off_cadence()
            if snap is not None:
                yield i, snap

    def close(self) -> None:
        for a in self.agents:
            try:
                a.stop()
            except Exception as exc:  # pragma: no cover - best effort
                log.warning("sim_agent_stop_failed", node=a.node, error=str(exc))
        if self._pool is not None:
            self._pool.shutdown(wait=True)
