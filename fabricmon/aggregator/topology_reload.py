"""A topology re-read at SIGHUP, planned off the detection thread and applied between two ticks.

What a reload may change without a restart: nodes added (their links are tracked from now on),
nodes removed (their state is dropped and their open incidents, and those of leaves no node uses
any more, resolve with reason ``topology_removed``) and the leaf a NIC is cabled to (a switch
replaced under a new name, RMA: its links, NICs and GPUs carry the new leaf from now on, and the
old leaf's open incidents resolve with reason ``leaf_renamed``).  What it may not: a node moved to
another unit (in a sharded deployment that moves it to another replica: every replica must restart
on the same file), a NIC added, removed or changed in anything but its leaf, another GPU count, or
another cluster name, layout or unit size; each is refused with one line naming the file, the field
and saying a restart is needed.

``plan`` is pure (old topology, new topology -> what to do, or ConfigError); ``apply`` holds the
engine's lock for the few dictionary updates it makes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from .. import components as comp
from ..components import Component, Kind
from ..configload import ConfigError
from ..topology import Topology
from .incidents import Incident

if TYPE_CHECKING:
    from .engine import Engine

REASON = "topology_removed"
RENAMED = "leaf_renamed"


@dataclass(frozen=True)
class TopologyChange:
    new: Topology
    added: tuple[str, ...]
    removed: tuple[str, ...]
    removed_leaves: frozenset[Component]
    recabled: tuple[str, ...] = ()  # nodes whose NICs' leaf changed (applied in place)
    renamed: tuple[tuple[str, str], ...] = ()  # (old leaf, new leaf)

    @property
    def empty(self) -> bool:
        return not self.added and not self.removed and not self.recabled

    def summary(self) -> str:
        def few(names: tuple[str, ...]) -> str:
            return ", ".join(names[:5]) + (f" (+{len(names) - 5})" if len(names) > 5 else "")

        parts = []
        if self.added:
            parts.append(f"+{len(self.added)} nodes: {few(self.added)}")
        if self.removed:
            parts.append(f"-{len(self.removed)} nodes: {few(self.removed)}")
        if self.renamed:
            parts.append("leaves renamed: " + ", ".join(f"{a} -> {b}" for a, b in self.renamed[:5])
                         + (f" (+{len(self.renamed) - 5})" if len(self.renamed) > 5 else ""))
        return "topology (" + "; ".join(parts) + ")"


def _leaves(topo: Topology) -> set[Component]:
    return {topo.leaf(name, nic.rail) for name, spec in topo.nodes.items() for nic in spec.nics}


def plan(old: Topology, new: Topology, source: str) -> TopologyChange:
    new.binding.rebind(old.binding)  # NICs the agents' hellos bound (by GUID or netdev) stay bound: not a change
    for field, was, now in (("cluster", old.cluster, new.cluster), ("layout", old.layout, new.layout),
                            ("nodes_per_unit", old.nodes_per_unit, new.nodes_per_unit)):
        if was != now:
            raise ConfigError(f"{source}: {field}: changed from {was!r} to {now!r}: needs a restart")
    recabled: list[str] = []
    renamed: dict[str, str] = {}
    for name in sorted(old.nodes.keys() & new.nodes.keys()):
        a, b = old.nodes[name], new.nodes[name]
        if a.unit != b.unit:
            raise ConfigError(f"{source}: nodes: {name}: unit: moved from {a.unit} to {b.unit}: ownership "
                              f"changes need a restart (reload applies added and removed nodes and leaf renames)")
        if a == b:
            continue
        moves = _leaf_moves(old, new, name, source)
        if moves:
            recabled.append(name)
            renamed.update(moves)
    added = tuple(sorted(new.nodes.keys() - old.nodes.keys()))
    removed = tuple(sorted(old.nodes.keys() - new.nodes.keys()))
    return TopologyChange(new, added, removed, frozenset(_leaves(old) - _leaves(new)), tuple(recabled),
                          tuple(sorted(renamed.items())))


_RESTART = "needs a restart (reload applies added and removed nodes and leaf renames)"


def _leaf_moves(old: Topology, new: Topology, name: str, source: str) -> dict[str, str]:
    """{old leaf: new leaf} of a node whose only change is the leaf its NICs are cabled to; ConfigError
    naming the first other field that changed."""
    a, b = old.nodes[name], new.nodes[name]
    where = f"{source}: nodes: {name}"
    if a.gpus != b.gpus:
        raise ConfigError(f"{where}: gpus: changed from {a.gpus} to {b.gpus}: {_RESTART}")
    was = {n.device: n for n in a.nics}
    now = {n.device: n for n in b.nics}
    for dev in sorted(was.keys() ^ now.keys()):
        raise ConfigError(f"{where}: nics: {dev} {'added' if dev in now else 'removed'}: {_RESTART}")
    moves: dict[str, str] = {}
    for i, nic in enumerate(b.nics):
        prev = was[nic.device]
        for f in fields(nic):
            if f.name == "leaf":
                continue
            x, y = getattr(prev, f.name), getattr(nic, f.name)
            if x != y:
                raise ConfigError(f"{where}: nics[{i}] ({nic.device}).{f.name}: changed from {x!r} to {y!r}: "
                                  f"{_RESTART}")
        before, after = old.leaf_of_nic(name, nic.device), new.leaf_of_nic(name, nic.device)
        if before != after and before and after:
            moves[before] = after
    if a.unbound != b.unbound:
        raise ConfigError(f"{where}: unbound NICs (known by node_guid or interface) changed: {_RESTART}")
    return moves


def _gone(c: Component, nodes: frozenset[str], leaves: frozenset[Component]) -> bool:
    """An open incident's component that left with the removed nodes (or a leaf none of the rest use)."""
    if c.node and c.node in nodes:
        return True
    return c.kind is Kind.LEAF and c in leaves


def apply(engine: Engine, change: TopologyChange, now: float) -> list[Incident]:
    """Swap the engine's topology; returns the incidents resolved (hand them to the sender)."""
    removed = frozenset(change.removed)
    with engine.lock:
        engine.topology = change.new
        reg = engine.registry
        reg.topology = change.new
        for name in change.removed:
            reg.drop_node(name)
        for name in change.recabled:
            reg.recable(name)
        if change.renamed:
            renamed = frozenset(comp.leaf(old) for old, _ in change.renamed)
            resolved = engine.manager.update([], now, retire=lambda c: c.kind is Kind.LEAF and c in renamed,
                                             reason=RENAMED)
        else:
            resolved = []
        for name in change.added:
            if not reg.owned(name):
                continue
            ns = reg.node(name)
            for nic in change.new.nodes[name].nics:
                reg.link(ns, nic.device, str(nic.port), None)
        return resolved + engine.manager.update([], now, retire=lambda c: _gone(c, removed, change.removed_leaves),
                                                reason=REASON)
