"""Leaf folding returns findings and relations; it decides which link findings are the leaf's evidence."""

from __future__ import annotations

from fabricmon import components
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.folding import LeafFolder
from fabricmon.aggregator.incidents import Finding, IncidentManager, Relation
from fabricmon.aggregator.state import LinkState

LEAF = components.leaf("leaf-u0-r2", 2)
S = DetectionSettings()


def _links(n: int = 8) -> list[LinkState]:
    return [LinkState(f"node-{i:03d}", "mlx5_2", "1", "", 2, 0, LEAF.id, 2, 400.0, 4, "c") for i in range(n)]


def _errors(link: LinkState, fire: bool = True) -> list[Finding]:
    return [Finding("FabricLinkErrors", link.id, dict(link.labels), ["errors"], fire=fire, keep=True)]


def _fold(folder: LeafFolder, bad: list[LinkState], now: float, fire: bool = True):
    return folder.fold_links({LEAF: [(x, _errors(x, fire)) for x in bad]} if bad else {}, now)


def test_link_failing_before_the_leaf_is_its_own_fault_the_rest_are_the_leafs_evidence():
    links = _links()
    folder = LeafFolder(S, "c", {LEAF: links})
    cable = links[3]
    for t in range(20, 60):
        f, rel = _fold(folder, [cable], float(t))
        assert rel == [] and [x.alertname for x in f] == ["FabricLinkErrors"] and f[0].fire
    f, rel = _fold(folder, links, 60.0)
    assert [x.component for x in f if x.alertname == "FabricLeafDegraded"] == [LEAF]
    related = {r.child[1] for r in rel}
    assert cable.id not in related and related == {x.id for x in links if x is not cable}
    assert all(r.parent == ("FabricLeafDegraded", LEAF) for r in rel)


def test_leaf_links_between_two_leaf_ticks_wait_for_the_leaf():
    """The leaf is found at t=43 (not firing yet), only two of its links at t=44: those must not
    open alerts of their own before the leaf fires."""
    links = _links()
    folder = LeafFolder(S, "c", {LEAF: links})
    m = IncidentManager()
    f, rel = _fold(folder, links[:5], 43.0, fire=False)
    assert m.update(f, 43.0, rel) == []
    f, rel = _fold(folder, links[:2], 44.0)
    assert m.update(f, 44.0, rel) == []
    f, rel = _fold(folder, links[:5], 45.0)
    assert [(i.alertname, i.component) for i in m.update(f, 45.0, rel)] == [("FabricLeafDegraded", LEAF.id)]


def test_episode_lasts_the_leaf_hold_then_a_lingering_link_is_unrelated():
    links = _links()
    folder = LeafFolder(S, "c", {LEAF: links})
    _fold(folder, links, 10.0)
    f, rel = _fold(folder, links[:1], 10.0 + S.hold_s)
    assert rel == [Relation(("FabricLinkErrors", links[0].id), ("FabricLeafDegraded", LEAF))]
    f, rel = _fold(folder, links[:1], 11.0 + S.hold_s)
    assert rel == [] and LEAF not in folder.episodes
