"""The node registry: which nodes this replica watches, as their agents say hello and go away.

A hello binds an imported topology's NICs (known only by node GUID or netdev) to the RDMA devices it
names, restarts a node's counters' grace on a new boot id, and announces its NICs and rails to the
component registry (state.Registry).  Nodes the topology lacks are watched all the same and listed
as unknown; topology nodes never heard from are listed once the start-up grace has passed.  The
node lookups detection needs (a node's poll interval, window, rail links, connection) live here.
"""

from __future__ import annotations

from typing import Any

import structlog

from ..batch import NodeHello
from .agents_down import restart_grace
from .engine_state import EngineState, Stage

_log = structlog.get_logger("fabricmon.aggregator.engine")


class NodeRegistry(Stage):
    def __init__(self, state: EngineState) -> None:
        super().__init__(state)
        self._unknown_warned: set[str] = set()

    def _note_unknown(self, node: str) -> None:
        if node in self.topology.nodes or node in self._unknown_warned or node in self.switch_side.sources:
            return  # a switch source (auth.switch_sources) is known by the config: a sweeper's own identity
        self._unknown_warned.add(node)  # once per node: a reconnecting agent would log every time
        _log.warning("unknown_node", node=node, cluster=self.cluster,
                     hint="not in the topology: monitored at node, NIC, link and GPU level without rail or leaf "
                          "(add it to the topology, or check the agent's --node-name)")

    def nodes_view(self) -> dict[str, Any]:
        """/api/nodes: every node this replica watches (topology nodes it owns, streaming nodes the
        topology lacks) and, once the start-up grace has passed, the topology nodes never heard from."""
        with self.lock:
            now = self.last_tick if self.last_tick is not None else self.cluster_clock.now()
            unknown = set(self.unknown_nodes())
            rows = []
            for name, ns in sorted(self.nodes.items()):
                rows.append({"node": name, "in_topology": name in self.topology.nodes, "unit": ns.unit,
                             "connected": ns.connected, "ever_seen": ns.ever_seen,
                             "last_seen": ns.last_ts if ns.ever_seen else None, "unknown": name in unknown})
            never = self._never_connected(now)
            return {"nodes": rows, "unknown": sorted(unknown), "never_connected": never}

    def _never_connected(self, now: float) -> list[str]:
        """Topology nodes with no batch and no hello after a grace of max(60 s, 5 intervals) from the first
        tick: a restart does not list the whole cluster while agents reconnect."""
        if self.started_at is None:
            return []
        iv = max((ns.interval for ns in self.nodes.values()), default=1.0)
        if now - self.started_at < restart_grace(self.settings, iv):
            return []
        return sorted(n for n, ns in self.nodes.items()
                      if n in self.topology.nodes and not ns.ever_seen and not ns.connected)

    def unknown_nodes(self) -> list[str]:
        """Streaming nodes the topology does not know: connected now, or heard from within the
        agents-down silence (a node that left for good stops counting when it would go down).  A switch
        source (``auth.switch_sources``: a sweeper with its own identity, ``<node>-ibsweep``) is not one."""
        with self.lock:
            now = self.cluster_clock.now()
            down_s = self.settings.agent_down_s
            return sorted(ns.name for ns in self.nodes.values()
                          if ns.name not in self.topology.nodes and ns.name not in self.switch_side.sources
                          and (ns.connected or (ns.ever_seen and now - ns.last_heard < max(down_s, 5 * ns.interval))))

    def hello(self, hello: NodeHello) -> None:
        reg = self.registry
        if not reg.owned(hello.node):
            return
        with self.lock:
            self.state.inputs += 1  # tick_gate.py
            self._note_unknown(hello.node)
            ns = reg.node(hello.node)
            rebooted = bool(ns.boot_id and hello.boot_id and hello.boot_id != ns.boot_id)
            if rebooted:
                ns.grace_batches = 1  # counters began again: the first deltas are not evidence
            self.startup.hello(hello.node, self.cluster_clock.now(), hello.boot_time, rebooted)
            if hello.boot_id:
                ns.boot_id = hello.boot_id
            if hello.interval_seconds > 0:
                ns.interval = ns.announced_interval = hello.interval_seconds
            ns.connected = True
            self.cluster_clock.connected(hello.node)
            self._bind(hello)
            self.topology.binding.pair_gpus(hello.node, {nic.device: nic.gpu for nic in hello.nics if nic.device})
            for nic in hello.nics:
                reg.announce(ns, nic.device, str(nic.port), nic.rail, nic.netdev)

    def _bind(self, hello: NodeHello) -> None:
        """An imported topology knows some NICs only by node GUID (``gpu-a17-03 HCA-1``) or netdev (LLDP):
        the hello names their RDMA devices, so their links get the leaf the fabric says."""
        spec = self.topology.nodes.get(hello.node)
        if spec is None or not spec.unbound:
            return
        names: dict[str, str] = {}
        for nic in hello.nics:
            for key in (nic.node_guid, nic.netdev):
                if key:
                    names[key] = nic.device
        bound = self.topology.binding.bind_devices(hello.node, names)
        left = self.topology.nodes[hello.node].unbound
        if bound or left:
            _log.info("topology_bound", node=hello.node, bound=bound, unbound=len(left),
                      hint="" if not left else "NICs of the topology this hello names by neither node GUID "
                                               "nor netdev stay unmonitored at leaf level")

    def disconnected(self, node: str) -> None:
        with self.lock:
            self.state.inputs += 1  # tick_gate.py
            ns = self.nodes.get(node)
            if ns is not None:
                ns.connected = False
            self.cluster_clock.disconnected(node)

    def _interval_of(self, node: str | None) -> float:
        """A node's poll interval; for no node (a leaf, a rail, a job), the slowest node's."""
        ns = self.nodes.get(node) if node else None
        if ns is not None:
            return ns.interval
        return max((n.interval for n in self.nodes.values()), default=1.0)

    def _rail_links(self, node: str) -> int:
        ns = self.nodes.get(node)
        return 0 if ns is None else sum(1 for link in ns.links.values() if link is not None)

    def _window(self, node: str) -> float:
        ns = self.nodes.get(node)
        # a node that never streamed (a host cable seen from its switch end) or none (an uplink): the sweep's cadence
        iv = ns.interval if ns is not None and ns.ever_seen else self.switch_side.interval
        return max(self.settings.window_s, iv)

    def _connected(self, node: str) -> bool:
        ns = self.nodes.get(node)
        return ns is not None and ns.connected
