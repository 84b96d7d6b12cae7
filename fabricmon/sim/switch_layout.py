"""The simulated fabric's switch side: which switch port each cable ends on (DESIGN.md "The switch side of
the fabric", "Simulator").

``cluster: {spines: N, uplinks_per_leaf: M}`` gives every leaf M uplinks.  On a generated leaf, ports
1..nodes_per_unit are its hosts in node order (the host at position i of its unit on port i + 1) and
uplink k is port ``nodes_per_unit + 1 + k``, cabled to spine ``k mod N`` (``spine-<k mod N>``).  An
imported (or fat-tree) leaf keeps the host ports the topology states (``leaf_port``, else the hosts in
node order from port 1) and its uplinks follow its highest host port, to the leaf's own spines
(``leaves: {leaf: {spines: [...]}}``) in turn, else to ``spine-<k mod N>``.  A spine's ports are handed
out in leaf order, one per uplink that reaches it.

Pure: built from the topology only, shared by scenario validation and the simulated counters."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..topology import NodeSpec, Topology, spine_id

# rail NICs the simulator models on a host (sim.hw: mlx5_0..7); the frontend NIC is not on a rail leaf
_RAIL_DEVICES = 8


@dataclass(frozen=True)
class Uplink:
    index: int  # position in SwitchLayout.uplinks
    leaf: str
    port: int  # the leaf's port (the uplink's id: <leaf>/p<port>)
    spine: str
    spine_port: int
    k: int  # the leaf's k-th uplink

    @property
    def id(self) -> str:
        return f"{self.leaf}/p{self.port}"


@dataclass(frozen=True)
class HostPort:
    leaf: str
    port: int
    node: int  # node index
    dev: int  # rail NIC index (mlx5_<dev>)


@dataclass
class SwitchLayout:
    spines: tuple[str, ...]
    uplinks: list[Uplink] = field(default_factory=list)
    host_ports: list[HostPort] = field(default_factory=list)
    leaves: list[str] = field(default_factory=list)
    by_leaf: dict[str, list[Uplink]] = field(default_factory=dict)
    by_spine: dict[str, list[Uplink]] = field(default_factory=dict)
    host_by_port: dict[tuple[str, int], HostPort] = field(default_factory=dict)

    def uplink_at(self, leaf: str, port: int) -> Uplink | None:
        return next((u for u in self.by_leaf.get(leaf, ()) if u.port == port), None)

    def uplink_to(self, leaf: str, spine: str) -> Uplink | None:
        """The leaf's first uplink to ``spine``."""
        return next((u for u in self.by_leaf.get(leaf, ()) if u.spine == spine), None)


def host_leaf_ports(topology: Topology, names: list[str]) -> dict[tuple[int, int], tuple[str, int]]:
    """(node index, rail device) -> (leaf, port) of every simulated rail NIC's cable."""
    out: dict[tuple[int, int], tuple[str, int]] = {}
    next_port: dict[str, int] = {}
    for i, name in enumerate(names):
        spec = topology.nodes[name]
        for nic in spec.nics:
            dev = _rail_dev(nic.device)
            if dev is None:
                continue
            leaf = topology.leaf_of_nic(name, nic.device)
            if leaf is None:
                continue
            numbered = _port_number(nic.leaf_port)
            if numbered is not None:
                port = numbered
            else:  # hosts in node order from port 1 (also where an Ethernet switch names its ports)
                port = next_port.get(leaf, 0) + 1
            next_port[leaf] = max(next_port.get(leaf, 0), port)
            out[(i, dev)] = (leaf, port)
    return out


def _port_number(port: int | str | None) -> int | None:
    """An InfiniBand switch port number (the simulated switches are numbered); None for an Ethernet
    switch's port name ("swp1", "Ethernet1/1") or none given."""
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    return None


def _rail_dev(device: str) -> int | None:
    tail = device[5:] if device.startswith("mlx5_") else ""
    if tail.isdigit() and int(tail) < _RAIL_DEVICES:
        return int(tail)
    return None


def build_layout(topology: Topology, names: list[str], nodes_per_unit: int, spines: int,
                 uplinks_per_leaf: int, generated: bool) -> SwitchLayout:
    hosts = host_leaf_ports(topology, names)
    default_spines = tuple(spine_id(i) for i in range(spines))
    all_spines: list[str] = list(default_spines)
    lay = SwitchLayout(tuple())
    top_port: dict[str, int] = {}
    for (node, dev), (leaf, port) in sorted(hosts.items()):
        hp = HostPort(leaf, port, node, dev)
        lay.host_ports.append(hp)
        lay.host_by_port[(leaf, port)] = hp
        top_port[leaf] = max(top_port.get(leaf, 0), port)
    lay.leaves = [leaf for leaf in topology.shape.leaves() if leaf in top_port]
    spine_next: dict[str, int] = {}
    for leaf in lay.leaves:
        own = topology.leaf_spines.get(leaf) or default_spines
        for s in own:
            if s not in all_spines:
                all_spines.append(s)
        first = nodes_per_unit + 1 if generated else top_port[leaf] + 1
        for k in range(uplinks_per_leaf):
            sp = own[k % len(own)]
            spine_next[sp] = spine_next.get(sp, 0) + 1
            u = Uplink(len(lay.uplinks), leaf, first + k, sp, spine_next[sp], k)
            lay.uplinks.append(u)
            lay.by_leaf.setdefault(leaf, []).append(u)
            lay.by_spine.setdefault(sp, []).append(u)
    lay.spines = tuple(s for s in all_spines if s in lay.by_spine)
    return lay


def cabled(topo: Topology, spines: int) -> Topology:
    """``topo`` with every NIC's switch port stated (``leaf``, ``leaf_port``: the hosts of a leaf in node
    order from port 1 where the topology gives none) and each leaf's spines (its own, else ``spine-0`` ..
    ``spine-<spines - 1>``): what the aggregator needs to put a switch port's evidence on its cable, as an
    imported fabric gives it."""
    default_spines = tuple(spine_id(i) for i in range(spines))
    used: dict[str, set[int]] = {}
    for spec in topo.nodes.values():
        for nic in spec.nics:
            numbered = _port_number(nic.leaf_port)
            if numbered is not None and nic.leaf is not None:
                used.setdefault(nic.leaf, set()).add(numbered)
    next_port: dict[str, int] = {}
    specs: dict[str, NodeSpec] = {}
    for name, spec in topo.nodes.items():
        nics = []
        for nic in spec.nics:
            leaf = topo.leaf_of_nic(name, nic.device)
            if leaf is None or nic.leaf_port is not None:
                nics.append(nic)
                continue
            port = next_port.get(leaf, 0) + 1
            while port in used.get(leaf, ()):
                port += 1
            next_port[leaf] = port
            nics.append(replace(nic, leaf=leaf, leaf_port=port))
        specs[name] = replace(spec, nics=tuple(nics))
    leaf_spines = {leaf: topo.leaf_spines.get(leaf) or default_spines for leaf in topo.shape.leaves()}
    out = Topology(topo.cluster, topo.layout, topo.nodes_per_unit, len({s for v in leaf_spines.values() for s in v}),
                   specs, version=2, rail_optimized=topo.rail_optimized, leaf_spines=leaf_spines,
                   switches=dict(topo.switches))
    # a generated topology states each NIC's GPU (an imported one keeps what its file stated)
    out.binding.gpu_stated = set(topo.binding.gpu_stated) if topo.version >= 2 else \
        {(name, nic.device) for name, spec in specs.items() for nic in spec.nics}
    return out
