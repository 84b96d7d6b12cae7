"""What the agents' hellos teach an imported topology: the RDMA device names of NICs the import knew only by
node GUID or netdev (``bind_devices``), and each NIC's GPU by PCI affinity (``pair_gpus``); remembered, so a
reloaded topology file is bound the same way (``rebind``) before it is compared with the running one.

One ``AgentBinding`` per ``Topology`` (its ``binding``); it replaces the node's ``NodeSpec`` in the
topology and indexes it again (topology_index.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from .topology_index import TopologyIndex
from .topology_spec import NodeSpec, canonical_guid


class BoundTopology(Protocol):
    """What binding reads and replaces of its ``Topology``."""

    nodes: dict[str, NodeSpec]
    version: int


class AgentBinding:
    def __init__(self, topology: BoundTopology, index: TopologyIndex) -> None:
        self.topology = topology
        self.index = index
        self.bound_names: dict[str, dict[str, str]] = {}  # bind_devices' inputs, per node
        self.paired: dict[str, dict[str, int]] = {}  # pair_gpus' inputs, per node
        # version 2: (node, device) of NICs whose file states their GPU; the others take the agent's pairing
        self.gpu_stated: set[tuple[str, str]] = set()

    def bind_devices(self, node: str, names: dict[str, str]) -> int:
        """Name the RDMA device of ``node``'s unbound NICs from the agent's inventory: ``names`` maps a node
        GUID (``0x...`` or sysfs' ``b8ce:f603:00a1:b2c3``) or a netdev to the device (``mlx5_3``).  Returns
        how many NICs were bound.  The names are remembered (``rebind``), so a reloaded topology file binds
        the same way before it is compared with this one."""
        spec = self.topology.nodes.get(node)
        if spec is None or not spec.unbound:
            return 0
        keyed: dict[str, str] = {}
        for k, v in names.items():
            if k and v:
                keyed[k] = v
                guid = canonical_guid(k)
                if guid is not None:
                    keyed[guid] = v
        bound, still = list(spec.nics), []
        taken = {nic.device for nic in spec.nics}
        for nic in spec.unbound:
            device = keyed.get(nic.node_guid or "") or keyed.get(nic.interface or "")
            if device and device not in taken:
                bound.append(replace(nic, device=device))
                taken.add(device)
            else:
                still.append(nic)
        if len(still) == len(spec.unbound):
            return 0
        self.bound_names.setdefault(node, {}).update(names)
        new = replace(spec, nics=tuple(bound), unbound=tuple(still))
        self.topology.nodes[node] = new
        self.index.add(new)
        return len(spec.unbound) - len(still)

    def rebind(self, other: AgentBinding) -> None:
        """Bind this (freshly loaded) topology's NICs as ``other``'s were bound by the agents' hellos."""
        for node, names in other.bound_names.items():
            self.bind_devices(node, names)
        for node, pairing in other.paired.items():
            self.pair_gpus(node, pairing)

    def pair_gpus(self, node: str, pairing: dict[str, int]) -> int:
        """An imported topology's GPU of each NIC from the agent's PCI-affinity pairing (its hello: device ->
        nearest GPU, -1 none), never from name order, which stays only until a hello says.  A NIC the agent
        pairs with no GPU while it pairs others (a storage or frontend port) serves none: it is no rail and
        no rank's path.  A ``gpu`` the file states stands.  Returns how many NICs changed."""
        spec = self.topology.nodes.get(node)
        if self.topology.version < 2 or spec is None or not any(g >= 0 for g in pairing.values()):
            return 0
        nics, changed = [], 0
        for nic in spec.nics:
            g = pairing.get(nic.device)
            if g is None or (node, nic.device) in self.gpu_stated:
                nics.append(nic)
                continue
            new = replace(nic, gpu=g) if g >= 0 else replace(nic, gpu=-1, rail=None)
            changed += new != nic
            nics.append(new)
        self.paired[node] = dict(pairing)
        if not changed:
            return 0
        self.index.forget_gpus(node)
        new_spec = replace(spec, nics=tuple(nics))
        self.topology.nodes[node] = new_spec
        self.index.add(new_spec)
        return changed
