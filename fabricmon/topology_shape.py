"""The fabric's switch layer as a topology describes it: its rails, units (leaf groups), leaves and each
leaf's spines, and which nodes sit under a unit or a leaf.

One ``FabricShape`` per ``Topology`` (its ``shape``), reading the topology's nodes as they are now (the
agents' hellos may bind or pair NICs after loading).  Leaves and groups sort in natural order
(``leaf-2`` before ``leaf-10``).
"""

from __future__ import annotations

from typing import Protocol

from .configload import ConfigError
from .topology_spec import NodeSpec, leaf_id, natural_key, spine_id


class ShapedTopology(Protocol):
    """What the shape reads of its ``Topology``."""

    nodes: dict[str, NodeSpec]
    version: int
    spines: int
    leaf_spines: dict[str, tuple[str, ...]]


class FabricShape:
    def __init__(self, topology: ShapedTopology) -> None:
        self.topology = topology

    def rails(self) -> list[int]:
        return sorted({nic.rail for n in self.topology.nodes.values() for nic in (*n.nics, *n.unbound)
                       if nic.rail is not None})

    def units(self) -> list[int]:
        return sorted({n.unit for n in self.topology.nodes.values()})

    def nodes_in_unit(self, unit: int) -> list[str]:
        return [n.name for n in self.topology.nodes.values() if n.unit == unit]

    def leaves(self) -> list[str]:
        """Every leaf name: imported, else generated from the units and rails."""
        names = set(self.topology.leaf_spines)
        for n in self.topology.nodes.values():
            for nic in (*n.nics, *n.unbound):
                if nic.leaf is not None:
                    names.add(nic.leaf)
                elif nic.rail is not None:
                    names.add(leaf_id(n.unit, nic.rail))
        return sorted(names, key=natural_key)

    def leaf_groups(self) -> dict[int, list[str]]:
        """Unit (leaf group) -> its leaves: a scalable unit's leaves (one per rail), a fat tree's one leaf,
        an imported fabric's leaves that share nodes.  The grain shards own."""
        out: dict[int, set[str]] = {}
        for n in self.topology.nodes.values():
            for nic in (*n.nics, *n.unbound):
                leaf = nic.leaf if nic.leaf is not None else (leaf_id(n.unit, nic.rail) if nic.rail is not None
                                                              else None)
                if leaf is not None:
                    out.setdefault(n.unit, set()).add(leaf)
        return {u: sorted(v, key=natural_key) for u, v in sorted(out.items())}

    def units_of_leaves(self, leaves: tuple[str, ...] | list[str], where: str) -> tuple[int, ...]:
        """The units (leaf groups) holding ``leaves``; ConfigError naming ``where`` for a leaf the topology
        does not have.  A group is owned whole: naming one of its leaves names the group."""
        unit_of = {leaf: u for u, group in self.leaf_groups().items() for leaf in group}
        out: list[int] = []
        for i, leaf in enumerate(leaves):
            if leaf not in unit_of:
                near = ", ".join(list(unit_of)[:4])
                raise ConfigError(f"{where}[{i}]: leaf {leaf!r} is not in the topology (it has {near}...)")
            if unit_of[leaf] not in out:
                out.append(unit_of[leaf])
        return tuple(sorted(out))

    def spines_of(self, leaf: str) -> tuple[str, ...]:
        """Imported spine names of ``leaf`` (generated topologies: every ``spine-<i>``)."""
        if self.topology.version >= 2:
            return self.topology.leaf_spines.get(leaf, ())
        return tuple(spine_id(i) for i in range(self.topology.spines))

    def nodes_on_leaf(self, leaf: str) -> list[str]:
        out = []
        for n in self.topology.nodes.values():
            if any((nic.leaf if nic.leaf is not None else
                    (leaf_id(n.unit, nic.rail) if nic.rail is not None else None)) == leaf
                   for nic in (*n.nics, *n.unbound)):
                out.append(n.name)
        return out
