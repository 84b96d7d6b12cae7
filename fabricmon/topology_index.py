"""The topology's derived indexes: a NIC by (node, device), by (node, GPU), by node GUID and by the leaf port
its cable ends on, and the named leaf of a node's rail.

``Topology`` (topology.py) builds one from its nodes and answers its lookups from it; the agents' hellos
(topology_binding.py) add a node again when they name or pair its NICs.  Kept apart so the maps have one
owner that keeps them current.
"""

from __future__ import annotations

from .topology_spec import NicSpec, NodeSpec


class TopologyIndex:
    def __init__(self) -> None:
        self.nic_by_dev: dict[tuple[str, str], NicSpec] = {}
        self.nic_by_gpu: dict[tuple[str, int], NicSpec] = {}
        self.leaf_by_rail: dict[tuple[str, int | None], str] = {}
        self.by_guid: dict[str, tuple[str, NicSpec]] = {}
        self.by_leaf_port: dict[tuple[str, str], tuple[str, NicSpec]] = {}
        # moves whenever a map changes: what is derived from the topology (a GPU's path, the /metrics
        # topology series) is kept per version and derived again after a hello binds or pairs NICs
        self.version = 0
        self.paths: dict[tuple[str, int], dict] = {}  # Topology.path_of_gpu's answers at this version

    def _changed(self) -> None:
        self.version += 1
        self.paths.clear()

    def add(self, n: NodeSpec) -> None:
        """Index ``n``'s NICs (again: a node re-added after binding replaces its entries)."""
        self._changed()
        for nic in n.nics:
            self.nic_by_dev[(n.name, nic.device)] = nic
            if nic.gpu >= 0:  # -1: a NIC the agent pairs with no GPU (pair_gpus)
                self.nic_by_gpu[(n.name, nic.gpu)] = nic
        for nic in (*n.nics, *n.unbound):
            if nic.leaf is not None:
                self.leaf_by_rail.setdefault((n.name, nic.rail), nic.leaf)
            if nic.node_guid is not None:
                self.by_guid[nic.node_guid] = (n.name, nic)
            if nic.leaf is not None and nic.leaf_port is not None:
                self.by_leaf_port[(nic.leaf, str(nic.leaf_port))] = (n.name, nic)

    def forget_gpus(self, node: str) -> None:
        """Drop ``node``'s GPU -> NIC entries before it is added with a new pairing."""
        self._changed()
        for k in [k for k in self.nic_by_gpu if k[0] == node]:
            del self.nic_by_gpu[k]
