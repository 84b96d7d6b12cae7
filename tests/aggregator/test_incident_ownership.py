"""The incident manager is the one owner of incident state: properties over random finding sequences.

Whatever the detectors and the folder return, tick after tick:
* every change is reported by ``update`` (nothing changes an incident behind its back);
* an incident is never resolved while its own evidence persists, and never stays open once its
  evidence has been gone for its hold time;
* every alert reported firing is later reported resolved, exactly once, once its evidence stops;
* a finding whose parent (or ancestor) is open or found opens nothing of its own.
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricmon import components
from fabricmon.aggregator.incidents import Finding, IncidentManager, Relation

_LEAF = components.leaf("leaf-u0-r2", 2)
_A, _B = (components.link(n, "mlx5_2", 1, 2, _LEAF.id) for n in ("node-001", "node-003"))
LEAF = ("FabricLeafDegraded", _LEAF)
LINK_A = ("FabricLinkErrors", _A)
LINK_B = ("FabricLinkErrors", _B)
LINK_B_DOWN = ("FabricLinkDown", _B)
CONG_LEAF = ("FabricCongestion", _LEAF)
CONG_A = ("FabricCongestion", _A)
KEYS = (LEAF, LINK_A, LINK_B, LINK_B_DOWN, CONG_LEAF, CONG_A)
# every relation the folder can state, chains included (link congestion -> leaf congestion -> leaf)
EDGES = ((LINK_A, LEAF), (LINK_B, LEAF), (LINK_B_DOWN, LEAF), (CONG_A, CONG_LEAF), (CONG_LEAF, LEAF),
         (CONG_A, LEAF))
BY_ID = {c.id: c for c in (_LEAF, _A, _B)}


def _key(inc) -> tuple:
    """An incident's (alertname, component): it renders the component as its id."""
    return inc.alertname, BY_ID[inc.component]


# one finding per key and tick: absent, raised, kept only, or reported with neither verdict
verdict = st.sampled_from([None, (True, True), (True, False), (False, True), (False, False)])
tick = st.tuples(st.tuples(*[verdict] * len(KEYS)), st.frozensets(st.sampled_from(range(len(EDGES)))))


def _finding(key, fire, keep, hold) -> Finding:
    return Finding(key[0], key[1], {"leaf": "leaf-u0-r2"}, [f"{key}"], fire=fire,
                   keep=keep, hold_s=hold, ranks=(1,) if key == LINK_A else ())


@settings(max_examples=300, deadline=None)
@given(ticks=st.lists(tick, min_size=1, max_size=40),
       holds=st.tuples(*[st.sampled_from([0.0, 1.0, 2.0, 5.0])] * len(KEYS)),
       step=st.sampled_from([0.5, 1.0, 2.0]))
def test_one_owner_reports_every_change_and_every_firing_alert_resolves(ticks, holds, step):
    hold = dict(zip(KEYS, holds, strict=True))
    m = IncidentManager(default_hold_s=15.0)
    reported: dict[str, list[str]] = {}  # incident id -> what the sender heard, in order
    last_evidence: dict[tuple[str, str], float] = {}
    tail = [((None,) * len(KEYS), frozenset())] * (int(max(holds) / step) + 3)  # evidence stops
    now = 1000.0
    for verdicts, edges in list(ticks) + tail:
        now += step
        findings = [_finding(k, *v, hold[k]) for k, v in zip(KEYS, verdicts, strict=True) if v is not None]
        relations = [Relation(*EDGES[i]) for i in sorted(edges)]
        parent_of = {r.child: r.parent for r in relations}
        present = {(f.alertname, f.component) for f in findings if f.fire or f.keep}
        open_before = {_key(i): i for i in m.open_incidents()}
        before = {i.id: (i.open, i.version) for i in m.all_incidents()}

        changed = m.update(findings, now, relations)

        # exactly what changed is reported, each once
        after = {i.id: (i.open, i.version) for i in m.all_incidents()}
        really = {iid for iid, st_ in after.items() if before.get(iid) != st_}
        assert sorted(i.id for i in changed) == sorted(really)
        for inc in changed:
            seq = reported.setdefault(inc.id, [])
            assert not seq or seq[-1] != "resolved", f"{inc.id} changed after it was reported resolved"
            seq.append("firing" if inc.open else "resolved")
        for key in present:
            if key in open_before:
                last_evidence[key] = now
        for inc in m.open_incidents():
            key = _key(inc)
            if key not in open_before:  # opened now: it fired, and no open or found ancestor absorbed it
                last_evidence[key] = now
                assert any(f.fire for f in findings if (f.alertname, f.component) == key)
                p = parent_of.get(key)
                while p is not None:
                    assert p not in open_before and p not in present, (key, p)
                    p = parent_of.get(p)
            # never kept once its evidence is gone for its hold time
            assert now - last_evidence[key] < hold[key] or last_evidence[key] == now, (key, now)
        for key, inc in open_before.items():
            if not inc.open:  # resolved now: never while its evidence persists
                assert key not in present
                assert now - last_evidence[key] >= hold[key]
    # the evidence stopped: everything reported firing was reported resolved, exactly once, last
    assert m.open_incidents() == []
    for iid, seq in reported.items():
        assert seq[0] == "firing" and seq[-1] == "resolved" and seq.count("resolved") == 1, (iid, seq)


def test_update_is_the_only_mutator():
    """The manager's public surface: one call that changes state, the rest read it; ``restore`` (the open
    incidents persisted before a restart) is refused once ``update`` has run."""
    public = {n for n, v in inspect.getmembers(IncidentManager, inspect.isfunction) if not n.startswith("_")}
    assert public == {"update", "open_incidents", "open_keys", "all_incidents", "all_by_component", "get_open",
                      "restore"}
    m = IncidentManager()
    m.update([], 1.0)
    with pytest.raises(RuntimeError, match="only before the first update"):
        m.restore(m.update([_finding(LINK_A, True, True, 5.0)], 2.0)[0], LINK_A[1], 2.0)


def test_link_open_before_its_leaf_keeps_its_own_incident_until_its_evidence_stops():
    """The defect: a flaky cable that alerted before its leaf degraded was resolved silently."""
    m = IncidentManager()
    rel = [Relation(LINK_A, LEAF)]
    opened = m.update([_finding(LINK_B, True, True, 5.0)], 21.0)
    assert [(*_key(i), i.open) for i in opened] == [(*LINK_B, True)]
    # the leaf degrades; the cable (no relation: its evidence predates the leaf) and a new link (related)
    for t in range(60, 70):
        ch = m.update([_finding(LEAF, True, True, 5.0), _finding(LINK_A, True, True, 5.0),
                       _finding(LINK_B, True, True, 5.0)], float(t), rel)
        assert all(i.open for i in ch), ch
    assert sorted(_key(i) for i in m.open_incidents()) == sorted([LEAF, LINK_B])
    leaf = m.get_open(*LEAF)
    assert leaf.absorbed == [LINK_A[1].id] and leaf.ranks == [1]  # the related link's hurt ranks ride on the leaf
    # the cable clears first, the leaf later: each resolve is reported
    resolved = []
    for t in range(70, 90):
        f = [_finding(LEAF, True, True, 5.0)] if t < 75 else []
        resolved += [_key(i) for i in m.update(f, float(t), rel) if not i.open]
    assert resolved == [LINK_B, LEAF]
    assert m.open_incidents() == []


@pytest.mark.parametrize("order", [(LINK_A, LINK_B), (LINK_B, LINK_A)])
def test_absorbed_components_read_the_same_whatever_order_the_findings_came_in(order):
    """Findings arrive in set order, which varies with the process's hash seed: the leaf's absorbed list
    (persisted and shown) must not, or two runs of one scenario differ."""
    m = IncidentManager()
    rel = [Relation(LINK_A, LEAF), Relation(LINK_B, LEAF)]
    for t in range(60, 70):
        m.update([_finding(LEAF, True, True, 5.0), *(_finding(k, True, True, 5.0) for k in order)], float(t), rel)
    assert m.get_open(*LEAF).absorbed == sorted([_A.id, _B.id])
