"""A topology re-read at SIGHUP, planned off the detection thread and applied between two ticks.

What a reload may change without a restart: nodes added (their links are tracked from now on)
and nodes removed (their state is dropped and their open incidents, and those of leaves no
node uses any more, resolve with reason ``topology_removed``).  What it may not: a node moved
to another unit (in a sharded deployment that moves it to another replica: every replica must
restart on the same file), a node whose GPUs or NICs changed, or another cluster name, layout
or unit size; each is refused with one line naming the file and saying a restart is needed.

``plan`` is pure (old topology, new topology -> what to do, or ConfigError); ``apply`` holds the
engine's lock for the few dictionary updates it makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..components import Component, Kind
from ..configload import ConfigError
from ..topology import Topology
from .incidents import Incident

if TYPE_CHECKING:
    from .engine import Engine

REASON = "topology_removed"


@dataclass(frozen=True)
class TopologyChange:
    new: Topology
    added: tuple[str, ...]
    removed: tuple[str, ...]
    removed_leaves: frozenset[Component]

    @property
    def empty(self) -> bool:
        return not self.added and not self.removed

    def summary(self) -> str:
        def few(names: tuple[str, ...]) -> str:
            return ", ".join(names[:5]) + (f" (+{len(names) - 5})" if len(names) > 5 else "")

        parts = []
        if self.added:
            parts.append(f"+{len(self.added)} nodes: {few(self.added)}")
        if self.removed:
            parts.append(f"-{len(self.removed)} nodes: {few(self.removed)}")
        return "topology (" + "; ".join(parts) + ")"


def _leaves(topo: Topology) -> set[Component]:
    return {topo.leaf(name, nic.rail) for name, spec in topo.nodes.items() for nic in spec.nics}


def plan(old: Topology, new: Topology, source: str) -> TopologyChange:
    new.rebind(old)  # NICs the agents' hellos bound (by GUID or netdev) stay bound: not a change
    for field, was, now in (("cluster", old.cluster, new.cluster), ("layout", old.layout, new.layout),
                            ("nodes_per_unit", old.nodes_per_unit, new.nodes_per_unit)):
        if was != now:
            raise ConfigError(f"{source}: {field}: changed from {was!r} to {now!r}: needs a restart")
    for name in old.nodes.keys() & new.nodes.keys():
        a, b = old.nodes[name], new.nodes[name]
        if a.unit != b.unit:
            raise ConfigError(f"{source}: nodes: {name} moved from unit {a.unit} to unit {b.unit}: ownership "
                              f"changes need a restart (reload applies added and removed nodes)")
        if a != b:
            raise ConfigError(f"{source}: nodes: {name}: its GPUs or NICs changed: needs a restart (reload applies "
                              f"added and removed nodes)")
    added = tuple(sorted(new.nodes.keys() - old.nodes.keys()))
    removed = tuple(sorted(old.nodes.keys() - new.nodes.keys()))
    return TopologyChange(new, added, removed, frozenset(_leaves(old) - _leaves(new)))


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
        for name in change.added:
            if not reg.owned(name):
                continue
            ns = reg.node(name)
            for nic in change.new.nodes[name].nics:
                reg.link(ns, nic.device, str(nic.port), None)
        return engine.manager.update([], now, retire=lambda c: _gone(c, removed, change.removed_leaves),
                                     reason=REASON)
