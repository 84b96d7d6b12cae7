"""Write ``ibnetdiscover`` output (and ibsim's net file) for a described fabric.

The text is what infiniband-diags' ``ibnetdiscover`` prints against the ``ibsim`` simulator: the
discovery is breadth-first from the local port (switch ports in ascending order; a CA is never a
transit node), each node type listed in reverse discovery order (libibnetdisc prepends to its
per-type lists), ``lid 0`` (ibsim runs without a subnet manager) and ``4xSDR`` (ibsim's link
default), port GUIDs the node GUID plus the port number (ibsim's numbering).
``tests/core/test_topology_import.py`` holds small outputs of the real tools byte for byte against
this writer; the benchmark uses it for fabrics larger than ibsim takes (256 switches).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# kind -> (GUID line key, id letter, record word), as ibnetdiscover.c writes them
_RECORD = {"switch": ("switchguid", "S", "Switch"), "ca": ("caguid", "H", "Ca"), "router": ("rtguid", "R", "Rt")}


@dataclass
class GenNode:
    kind: str  # switch | ca | router
    guid: int
    nports: int
    description: str
    links: dict[int, tuple[int, int]] = field(default_factory=dict)  # port -> (peer guid, peer port)


class GenFabric:
    def __init__(self) -> None:
        self.nodes: dict[int, GenNode] = {}
        self.order: list[int] = []  # as written to the net file

    def add(self, kind: str, guid: int, nports: int, description: str) -> GenNode:
        if guid in self.nodes:
            raise ValueError(f"GUID 0x{guid:x} used twice")
        node = GenNode(kind, guid, nports, description)
        self.nodes[guid] = node
        self.order.append(guid)
        return node

    def link(self, a: int, pa: int, b: int, pb: int) -> None:
        for g, p in ((a, pa), (b, pb)):
            n = self.nodes[g]
            if not 1 <= p <= n.nports or p in n.links:
                raise ValueError(f"port {p} of 0x{g:x} out of range or used")
        self.nodes[a].links[pa] = (b, pb)
        self.nodes[b].links[pb] = (a, pa)

    # ---------------------------------------------------------------- ibsim's input
    def net_file(self) -> str:
        """ibsim's topology input (its parser reads ibnetdiscover's own format); the first node is where
        ibsim attaches the client, i.e. where ibnetdiscover runs."""
        out = []
        for guid in self.order:
            n = self.nodes[guid]
            key, letter, word = _RECORD[n.kind]
            out.append(f"{key}=0x{guid:x}")
            out.append(f'{word}\t{n.nports} "{letter}-{guid:016x}"\t\t# "{n.description}"')
            for port in sorted(n.links):
                peer, pport = n.links[port]
                out.append(f'[{port}]\t"{_RECORD[self.nodes[peer].kind][1]}-{peer:016x}"[{pport}]')
            out.append("")
        return "\n".join(out) + "\n"

    # ---------------------------------------------------------------- ibnetdiscover's output
    def discovery_order(self, start: int) -> list[int]:
        first = self.nodes[start]
        seen = {start}
        order = [start]
        queue: deque[int] = deque()
        if first.kind == "switch":
            queue.append(start)
        else:  # from a CA only its local port (port 1) leads on
            local = first.links.get(1)
            if local is not None and local[0] not in seen:
                seen.add(local[0])
                order.append(local[0])
                if self.nodes[local[0]].kind == "switch":
                    queue.append(local[0])
        while queue:
            sw = self.nodes[queue.popleft()]
            for port in sorted(sw.links):
                peer = sw.links[port][0]
                if peer in seen:
                    continue
                seen.add(peer)
                order.append(peer)
                if self.nodes[peer].kind == "switch":
                    queue.append(peer)
        return order

    def ibnetdiscover(self, generated: str, start: int | None = None) -> str:
        """The text ``ibnetdiscover`` prints; ``generated`` is its date (``Thu Nov 26 03:44:47 2026``)."""
        start = self.order[0] if start is None else start
        s = self.nodes[start]
        port_guid = start if s.kind == "switch" else start + 1
        parts = ["#\n", f"# Topology file: generated on {generated}\n", "#\n",
                 f"# Initiated from node {start:016x} port {port_guid:016x}\n"]
        order = self.discovery_order(start)
        for kind in ("switch", "ca", "router"):
            for guid in reversed([g for g in order if self.nodes[g].kind == kind]):
                parts.append("\n")
                parts.append(self._record(self.nodes[guid]))
        return "".join(parts)

    def _record(self, n: GenNode) -> str:
        g = n.guid
        lines = ["vendid=0x0\n", "devid=0x0\n", f"sysimgguid=0x{g:x}\n"]
        if n.kind == "switch":
            lines.append(f"switchguid=0x{g:x}({g:x})\n")
            lines.append(f'Switch\t{n.nports} "S-{g:016x}"\t\t# "{n.description}" base port 0 lid 0 lmc 0\n')
            for port in sorted(n.links):
                peer, pport = n.links[port]
                p = self.nodes[peer]
                if p.kind == "switch":
                    lines.append(f'[{port}]\t"S-{peer:016x}"[{pport}]\t\t# "{p.description}" lid 0 4xSDR\n')
                else:  # a CA's or router's port GUID follows its number
                    lines.append(f'[{port}]\t"{_RECORD[p.kind][1]}-{peer:016x}"[{pport}]({peer + pport:x}) \t\t# '
                                 f'"{p.description}" lid 0 4xSDR\n')
        else:
            key, letter, word = _RECORD[n.kind]
            lines.append(f"{key}=0x{g:x}\n")
            lines.append(f'{word}\t{n.nports} "{letter}-{g:016x}"\t\t# "{n.description}"\n')
            for port in sorted(n.links):
                peer, pport = n.links[port]
                p = self.nodes[peer]
                letter = _RECORD[p.kind][1]
                lines.append(f'[{port}]({g + port:x}) \t"{letter}-{peer:016x}"[{pport}]\t\t# lid 0 lmc 0 '
                             f'"{p.description}" lid 0 4xSDR\n')
        return "".join(lines)


# -------------------------------------------------------------------- fabrics


def rail_optimized(nodes: int, *, rails: int = 8, nodes_per_leaf: int = 32, spines_per_rail: int = 4,
                   cores: int = 4, host: str = "gpu-{i:04d}", leaf: str = "MF0;leaf-su{u:02d}-r{r}:MQM9700/U1",
                   spine: str = "MF0;spine-r{r}-{s}:MQM9790/U1", core: str = "MF0;core-{c}:MQM9790/U1",
                   ports: int = 64) -> GenFabric:
    """A rail-optimized fabric: node i's NIC r (``mlx5_r``) on leaf (i // nodes_per_leaf, r); the leaves of
    rail r up to that rail's spines, every spine up to every core (one subnet, as a DGX SuperPOD's
    compute fabric).  The first node is where ibnetdiscover runs."""
    f = GenFabric()
    units = (nodes + nodes_per_leaf - 1) // nodes_per_leaf
    ca = [[0x0000_0c42_a100_0000 + (i << 8) + (r << 1) for r in range(rails)] for i in range(nodes)]
    leaves = {(u, r): 0x0000_0c42_b000_0000 + (u << 8) + r for u in range(units) for r in range(rails)}
    spine_guids = {(r, s): 0x0000_0c42_c000_0000 + (r << 8) + s for r in range(rails) for s in range(spines_per_rail)}
    for i in range(nodes):
        for r in range(rails):
            f.add("ca", ca[i][r], 1, f"{host.format(i=i)} mlx5_{r}")
    for (u, r), g in leaves.items():
        f.add("switch", g, ports, leaf.format(u=u, r=r))
    core_guids = [0x0000_0c42_c100_0000 + c for c in range(cores)]
    for (r, s), g in spine_guids.items():
        f.add("switch", g, max(ports, units + cores), spine.format(r=r, s=s))
    for c, g in enumerate(core_guids):
        f.add("switch", g, max(ports, len(spine_guids)), core.format(c=c))
    for i in range(nodes):
        u = i // nodes_per_leaf
        for r in range(rails):
            f.link(ca[i][r], 1, leaves[(u, r)], 1 + i % nodes_per_leaf)
    for (u, r), g in leaves.items():
        for s in range(spines_per_rail):
            f.link(g, nodes_per_leaf + 1 + s, spine_guids[(r, s)], 1 + u)
    for k, g in enumerate(spine_guids.values()):
        for c, cg in enumerate(core_guids):
            f.link(g, units + 1 + c, cg, 1 + k)
    return f


def fat_tree(nodes: int, *, nics: int = 2, nodes_per_leaf: int = 4, spines: int = 2, host: str = "node{i:02d}",
             leaf: str = "MF0;leaf-{u}:MQM8700/U1", spine: str = "Quantum Mellanox Technologies",
             ports: int = 40) -> GenFabric:
    """A fat tree: all NICs of a node on one leaf (``nodes_per_leaf`` nodes each), every leaf to every spine."""
    f = GenFabric()
    units = (nodes + nodes_per_leaf - 1) // nodes_per_leaf
    ca = [[0x0000_0c42_d100_0000 + (i << 8) + (k << 1) for k in range(nics)] for i in range(nodes)]
    leaves = [0x0000_0c42_e000_0000 + u for u in range(units)]
    spine_guids = [0x0000_0c42_f000_0000 + s for s in range(spines)]
    for i in range(nodes):
        for k in range(nics):
            f.add("ca", ca[i][k], 1, f"{host.format(i=i)} mlx5_{k}")
    for u, g in enumerate(leaves):
        f.add("switch", g, ports, leaf.format(u=u))
    for s, g in enumerate(spine_guids):
        f.add("switch", g, ports, spine.format(s=s))
    for i in range(nodes):
        for k in range(nics):
            f.link(ca[i][k], 1, leaves[i // nodes_per_leaf], 1 + (i % nodes_per_leaf) * nics + k)
    for u, g in enumerate(leaves):
        for s, sg in enumerate(spine_guids):
            f.link(g, ports - spines + 1 + s, sg, 1 + u)
    return f
