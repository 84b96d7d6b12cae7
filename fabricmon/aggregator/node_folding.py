"""Node folding: a node whose NICs fail together is one fault of the node, not one per link.

DESIGN, localization: "one host slow on all rails is the host".  In a rail-optimized fabric a
node's rail links sit on different leaves, so leaf folding never sees them together; several of
one node's links going bad in the same moment (host power, a PCIe switch, the node rebooting,
its NIC firmware reset) are the node's fault.  The folder emits one finding on the node
(``component_type`` node, the most severe of its links' alert names) and relates each link
finding to it, as the leaf folder does for a leaf: the incident manager then lets those links
open nothing while the node's incident is open.  A link whose evidence began more than
``fold_grace_s`` before the node's episode is its own fault and keeps its own incident.

Runs before the leaf folder on the same candidates; its relations go after the leaf's, so a link
that is both (a leaf and a node failing at once) is the node's evidence.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import components as comp
from ..components import Component
from .config import DetectionSettings
from .detectors import leaf_fold_threshold
from .folding import _note_evidence
from .incidents import Finding, Relation
from .state import LinkState

# The node's alert takes the most severe of its links' alert names (earlier is more severe).
SEVERITY_ORDER = ("FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded")


class NodeFolder:
    def __init__(self, settings: DetectionSettings, cluster: str, rail_links: Callable[[str], int]) -> None:
        self.settings = settings
        self.cluster = cluster
        self.rail_links = rail_links  # node -> how many rail links it has (as its agent announced them)
        self.episodes: dict[str, list[float]] = {}  # node name -> [first tick folded, last tick folded]

    def fold(self, candidates: dict[Component, list[tuple[LinkState, list[Finding]]]],
             now: float, leaf_faults: frozenset[Component] = frozenset()) -> tuple[list[Finding], list[Relation]]:
        """``candidates``: leaf -> links with fold-able findings at ``now`` (the leaf folder's input);
        ``leaf_faults``: leaves the leaf folder takes this tick (links of several nodes at once), whose
        links are not node evidence (a fat tree's leaf carries several NICs of each of its nodes)."""
        s = self.settings
        for node in [n for n, (_, last) in self.episodes.items() if now - last > s.hold_s]:
            del self.episodes[node]
        by_node: dict[str, list[tuple[LinkState, list[Finding]]]] = {}
        for leaf, entries in candidates.items():
            for link, fl in entries:
                _note_evidence(link, now, s.hold_s)
                if leaf not in leaf_faults:
                    by_node.setdefault(link.node, []).append((link, fl))
        findings: list[Finding] = []
        relations: list[Relation] = []
        for node, entries in by_node.items():
            if len(entries) < 2:
                continue
            n_links = max(self.rail_links(node), len(entries))
            ep = self.episodes.get(node)
            if len(entries) >= leaf_fold_threshold(n_links, s):
                if ep is None:
                    ep = self.episodes[node] = [now, now]
                ep[1] = now
            since = ep[0] if ep is not None else None
            mine = [(link, fl) for link, fl in entries
                    if since is None or link.evidence_since is None or link.evidence_since >= since - s.fold_grace_s]
            if since is not None and len(mine) >= 2:
                finding = self._node_finding(node, mine, n_links)
                findings.append(finding)
                parent = (finding.alertname, finding.component)
                relations.extend(Relation((f.alertname, link.id), parent) for link, fl in mine for f in fl)
            for link, fl in entries:
                if link.evidence_since is not None and now - link.evidence_since < s.fold_grace_s:
                    for f in fl:  # several links of the node at once: wait a little for the node to fire
                        if since is None:
                            f.keep, f.fire = f.keep or f.fire, False
        return findings, relations

    def _node_finding(self, node: str, entries: list[tuple[LinkState, list[Finding]]], n_links: int) -> Finding:
        names = {f.alertname for _, fl in entries for f in fl}
        alertname = next(a for a in SEVERITY_ORDER if a in names)
        ids = sorted(link.id.id for link, _ in entries)
        ev = [f"{len(entries)} of {n_links} rail links of {node} with evidence at once: the node, not its cables",
              "links: " + ", ".join(ids[:8]) + (f" (+{len(ids) - 8} more)" if len(ids) > 8 else "")]
        fire = any(f.fire for _, fl in entries for f in fl)
        c = comp.node(node)
        return Finding(alertname, c, c.labels(self.cluster), ev, fire=fire, keep=True, hold_s=self.settings.hold_s)
