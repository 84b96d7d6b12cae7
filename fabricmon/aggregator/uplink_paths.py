"""Which uplinks and spines a job's slow ring crosses (DESIGN.md "The switch side of the fabric").

Without forwarding tables the rule is the topology's: a job's traffic on one rail (or plane) crosses
every uplink of a leaf where it has ranks when it also has ranks under another leaf of that rail, and
so every spine those leaves' uplinks reach.  A comm-late group of stragglers on several leaves whose
uplink or spine carries evidence is that uplink's (or spine's) impact: its ranks and jobs ride on the
uplink's own alert (correlator.ride_on_own_alerts), never a StragglerRank page of their own, whichever
of the ring's ranks happen to be persistent first (a few under one leaf, say).  A job under one leaf of
a rail crosses none of that rail's uplinks: its ring stays inside the leaf."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..components import Component, Kind
from ..topology import Topology

if TYPE_CHECKING:  # the types only: stragglers needs numpy, which commands without the extra never load
    from .stragglers import Straggler, StragglerReport


def job_leaves(topo: Topology, report: StragglerReport, job: str, job_id: str) -> dict[int | None, set[str]]:
    """Rail (None on a fabric without rails) -> the leaves where the job has ranks on it (cached on the
    report, which lives until the next scored step)."""
    key = (job, job_id)
    got = report.leaves_by_job.get(key)
    if got is None:
        got = {}
        for node, gpu in report.placement.get(key, ()):
            nic = topo.nic_for_gpu(node, gpu) if node in topo.nodes else None
            if nic is not None:
                got.setdefault(nic.rail, set()).add(topo.leaf_for(node, nic).id)
        report.leaves_by_job[key] = got
    return got


def crossed(topo: Topology, report: StragglerReport, job: str, job_id: str, members: Iterable[Straggler],
            evidence: Mapping[Component, float]) -> list[Component]:
    """The uplinks and spines with evidence that the members' rings cross: an uplink of a leaf where the
    job has ranks on the members' rail while it also has ranks under another leaf of that rail; a spine
    one of those leaves' uplinks reaches."""
    ups = [c for c in evidence if c.kind in (Kind.UPLINK, Kind.SPINE)]
    if not ups:
        return []
    by_rail = job_leaves(topo, report, job, job_id)
    rails = set()
    for m in members:
        nic = topo.nic_for_gpu(m.node, m.gpu) if m.node in topo.nodes else None
        if nic is not None:
            rails.add(nic.rail)
    leaves = set().union(*(by_rail.get(r, set()) for r in rails if len(by_rail.get(r, ())) >= 2))
    if not leaves:
        return []
    out = []
    for c in ups:
        if c.kind is Kind.UPLINK and c.leaf in leaves:
            out.append(c)
        elif c.kind is Kind.SPINE and any(c.id in topo.shape.spines_of(leaf) for leaf in leaves):
            out.append(c)
    return out


def crossing_jobs(topo: Topology, placements: Mapping[str, Iterable[tuple[str, int]]]) -> dict[str, set[str]]:
    """Leaf -> the jobs (keys of ``placements``: job -> its ranks' (node, gpu)) whose traffic crosses that
    leaf's uplinks: jobs with ranks under it and under another leaf of the same rail."""
    out: dict[str, set[str]] = {}
    for jk, ranks in placements.items():
        by_rail: dict[int | None, set[str]] = {}
        for node, gpu in ranks:
            nic = topo.nic_for_gpu(node, gpu) if node in topo.nodes else None
            if nic is not None:
                by_rail.setdefault(nic.rail, set()).add(topo.leaf_for(node, nic).id)
        for leaves in by_rail.values():
            if len(leaves) >= 2:
                for leaf in leaves:
                    out.setdefault(leaf, set()).add(jk)
    return out


def jobs_crossing(topo: Topology, crossing: Mapping[str, set[str]], component: Component) -> set[str]:
    """The jobs whose traffic crosses an uplink (its leaf's uplinks) or a spine (any uplink reaching it)."""
    if component.kind is Kind.UPLINK:
        return set(crossing.get(component.leaf, ()))
    if component.kind is Kind.SPINE:
        return {jk for leaf, jobs in crossing.items() if component.id in topo.shape.spines_of(leaf) for jk in jobs}
    return set()
