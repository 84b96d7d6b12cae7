"""Leaf folding: which link findings are one leaf's evidence, returned as findings and relations.

Many links of one leaf going bad at once are one fault of the leaf, not one
per cable: the folder emits a ``FabricLeafDegraded`` finding and relates each
link finding to it (``Relation``); the incident manager then lets those links
open nothing while the leaf is found or open.  A link whose evidence began
before the leaf's episode (more than ``fold_grace_s`` before it) is its own
fault (a flaky cable under a leaf that degrades later): it gets no relation
and keeps its own incident.  A link that outlives the leaf is related, but the
relation only matters while the leaf's incident is open: after that it opens
its own.  Congestion on a leaf's ports is folded the same way, and is the
degraded leaf's evidence when that leaf is found.

The folder never reads incident state: its memory is detection state only
(when each leaf's episode began and last had its links failing together, when
each link's evidence began).  An episode outlives its last fold-able tick by the
hold time of the leaf's incident, so links failing again in that gap stay the
leaf's evidence.
"""

from __future__ import annotations

from ..components import Component, Kind
from .config import DetectionSettings
from .detectors import leaf_fold_threshold
from .incidents import Finding, Relation
from .state import LinkState

LEAF = "FabricLeafDegraded"
CONGESTION = "FabricCongestion"


class LeafFolder:
    def __init__(self, settings: DetectionSettings, cluster: str,
                 links_by_leaf: dict[Component, list[LinkState]]) -> None:
        self.settings = settings
        self.cluster = cluster
        self.links_by_leaf = links_by_leaf  # the engine's live map (links appear as agents announce them)
        # leaf -> [first tick its links reached the fold threshold, last such tick]
        self.episodes: dict[Component, list[float]] = {}

    def fold_links(self, candidates: dict[Component, list[tuple[LinkState, list[Finding]]]],
                   now: float) -> tuple[list[Finding], list[Relation]]:
        """``candidates``: leaf -> links with fold-able findings (raised or kept) at ``now``."""
        s = self.settings
        findings: list[Finding] = []
        relations: list[Relation] = []
        for leaf in [x for x, (_, last) in self.episodes.items() if now - last > s.hold_s]:
            # the leaf's own evidence is gone for longer than its incident's hold: the episode is over
            del self.episodes[leaf]
        for leaf, entries in candidates.items():
            for link, _ in entries:
                _note_evidence(link, now, s.hold_s)
            n_links = len(self.links_by_leaf.get(leaf, ())) or len(entries)
            ep = self.episodes.get(leaf)
            if self._folds(leaf, entries):
                if ep is None:
                    ep = self.episodes[leaf] = [now, now]
                ep[1] = now
                findings.append(self._leaf_finding(leaf, entries, n_links))
            since = ep[0] if ep is not None else None
            for link, fl in entries:
                began = link.evidence_since if link.evidence_since is not None else now  # set just above
                if since is not None and began < since - s.fold_grace_s:
                    findings.extend(fl)  # failing before the leaf's episode began: its own fault
                    continue
                if since is not None:
                    relations.extend(Relation((f.alertname, link.id), (LEAF, leaf)) for f in fl)
                if (since is not None or len(entries) >= 2) and now - began < s.fold_grace_s:
                    for f in fl:  # neighbours also show evidence: wait a little for the leaf to fire
                        f.keep, f.fire = f.keep or f.fire, False
                findings.extend(fl)
        return findings, relations

    def _folds(self, leaf: Component, entries: list[tuple[LinkState, list[Finding]]]) -> bool:
        """Enough of the leaf's links with evidence at once, on at least two nodes: the links of one node
        failing together are that node's fault (node_folding.py), even where a fat tree cables them all
        to one leaf."""
        n_links = len(self.links_by_leaf.get(leaf, ())) or len(entries)
        return (len(entries) >= leaf_fold_threshold(n_links, self.settings)
                and len({link.node for link, _ in entries}) >= 2)

    def degraded_leaves(self) -> frozenset[Component]:
        """The leaves in an episode now (folded within the hold of their incident): the cable predictor
        leaves their links alone (cable_health.py)."""
        return frozenset(self.episodes)

    def folding_leaves(self, candidates: dict[Component, list[tuple[LinkState, list[Finding]]]]
                       ) -> frozenset[Component]:
        """The leaves whose links fold into the leaf this tick: the node folder leaves their links alone
        (a fat tree carries several NICs of each node on one leaf; rail-optimized, one per node)."""
        return frozenset(leaf for leaf, entries in candidates.items() if self._folds(leaf, entries))

    def fold_congestion(self, congested: dict[Component, list[tuple[LinkState, Finding]]]
                        ) -> tuple[list[Finding], list[Relation]]:
        """Several congested ports of one leaf are the leaf's congestion; all of it is a degraded leaf's.
        ``congested``: leaf (or, for a port on no leaf, the link itself) -> its congested ports."""
        s = self.settings
        findings: list[Finding] = []
        relations: list[Relation] = []
        for leaf, entries in congested.items():
            is_leaf = leaf.kind is Kind.LEAF
            if is_leaf and len(entries) >= s.congestion_leaf_min_ports:
                fire = sum(1 for _, f in entries if f.fire) >= s.congestion_leaf_min_ports
                ids = sorted(link.id.id for link, _ in entries)
                findings.append(Finding(CONGESTION, leaf, leaf.labels(self.cluster),
                                        [f"{len(entries)} ports of {leaf} congested", "ports: " + ", ".join(ids[:6])],
                                        fire=fire, keep=True))
                relations.append(Relation((CONGESTION, leaf), (LEAF, leaf)))
                relations.extend(Relation((CONGESTION, link.id), (CONGESTION, leaf)) for link, _ in entries)
            elif is_leaf:
                relations.extend(Relation((CONGESTION, link.id), (LEAF, leaf)) for link, _ in entries)
            findings.extend(f for _, f in entries)
        return findings, relations

    def _leaf_finding(self, leaf: Component, entries: list[tuple[LinkState, list[Finding]]], n_links: int) -> Finding:
        counts: dict[str, int] = {}
        for _, fl in entries:
            for f in fl:
                counts[f.alertname] = counts.get(f.alertname, 0) + 1
        ids = sorted(link.id.id for link, _ in entries)
        ev = [f"{len(entries)} of {n_links} links of {leaf} with evidence at once",
              ", ".join(f"{a.removeprefix('Fabric')} x{c}" for a, c in sorted(counts.items())),
              "links: " + ", ".join(ids[:6]) + (f" (+{len(ids) - 6} more)" if len(ids) > 6 else "")]
        fire = any(f.fire for _, fl in entries for f in fl)
        # the incident's hold is the episode's tail (see fold_links): one number for both
        return Finding(LEAF, leaf, leaf.labels(self.cluster), ev, fire=fire, keep=True,
                       hold_s=self.settings.hold_s)


def _note_evidence(link: LinkState, now: float, gap_s: float) -> None:
    """When this link's current run of evidence began (a gap longer than ``gap_s`` starts a new run)."""
    if link.evidence_since is None or now - link.evidence_last > gap_s:
        link.evidence_since = now
    link.evidence_last = now
