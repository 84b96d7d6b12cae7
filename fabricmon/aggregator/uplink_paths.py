"""Which uplinks and spines a job's slow ring crosses (DESIGN.md "The switch side of the fabric").

Without forwarding tables the rule is the topology's: a job's traffic on one rail (or plane) crosses
every uplink of a leaf where it has ranks when it also has ranks under another leaf of that rail, and
so every spine those leaves' uplinks reach.  A comm-late group of stragglers on several leaves whose
uplink or spine carries evidence is that uplink's (or spine's) impact: its ranks and jobs ride on the
uplink's own alert (correlator.ride_on_own_alerts), never a StragglerRank page of their own.  A group
under one leaf crosses no uplink: its ring stays inside the leaf."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..components import Component, Kind
from ..topology import Topology
from .stragglers import Straggler


def leaves_of(topo: Topology, members: Iterable[Straggler]) -> set[str]:
    """The leaves the members' NICs are cabled to."""
    out: set[str] = set()
    seen: set[tuple[str, int]] = set()
    for m in members:
        if (m.node, m.gpu) in seen or m.node not in topo.nodes:
            continue
        seen.add((m.node, m.gpu))
        nic = topo.nic_for_gpu(m.node, m.gpu)
        if nic is not None:
            out.add(topo.leaf_for(m.node, nic).id)
    return out


def crossed(topo: Topology, members: Iterable[Straggler], evidence: Mapping[Component, float]) -> list[Component]:
    """The uplinks and spines with evidence that the members' traffic crosses (none when they sit under
    one leaf)."""
    ups = [c for c in evidence if c.kind in (Kind.UPLINK, Kind.SPINE)]
    if not ups:
        return []
    leaves = leaves_of(topo, members)
    if len(leaves) < 2:
        return []
    out = []
    for c in ups:
        if c.kind is Kind.UPLINK and c.leaf in leaves:
            out.append(c)
        elif c.kind is Kind.SPINE and any(c.id in topo.spines_of(leaf) for leaf in leaves):
            out.append(c)
    return out
