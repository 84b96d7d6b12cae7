"""Incidents: one per (alertname, component), opened, related, updated and resolved on sample time.

The ``IncidentManager`` is the one owner of incident state.  Detectors, the
leaf folder and the correlator only *return* what they saw: ``Finding``s and
``Relation``s ("this link's finding is evidence of that leaf"); ``update`` is
the only call that changes an incident, and its return value is the only
report of what changed (the Alertmanager sender hears nothing else).

A finding carries two verdicts: ``fire`` (the raise condition, persistence
already applied by the detector) and ``keep`` (evidence still present, a weaker
condition).  An incident opens on ``fire``, is refreshed by either, and
resolves once neither was seen for the alert's hold time: the hysteresis that
keeps a fault at the threshold from flapping.

Relations decide only whether a finding may open an incident of its own: a
finding whose parent (or an ancestor) is open, or present this tick, is that
parent's evidence and opens nothing (one fault, one alert; its hurt ranks ride
on the parent).  An incident already open lives by its own evidence alone: it
is never resolved while that persists and never kept once it is gone, whatever
its relations (a cable that failed before its leaf keeps its own alert, which
Alertmanager's leaf inhibition hides while the leaf fires).

Findings and relations name their component by its typed identity (``components.Component``); the
manager keys incidents by ``(alertname, Component)``.  An ``Incident`` is the outward record: it
holds the rendered ``component`` id and ``component_type`` strings that Alertmanager, the HTTP API,
the demo report and the logs read.
"""

from __future__ import annotations

import hashlib
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..components import Component
from .cost import JobImpact, impact_sentence

SEVERITY = {
    "FabricLinkDown": "critical",
    "FabricLinkFlapping": "warning",
    "FabricLinkErrors": "warning",
    "FabricLinkDegraded": "warning",
    "FabricLeafDegraded": "critical",
    "FabricSpineDegraded": "critical",
    "FabricPFCStorm": "critical",
    "FabricCongestion": "warning",
    "RDMARetransmits": "warning",
    "FabricConfigDrift": "warning",
    "NVLinkDown": "critical",
    "NVLinkErrors": "warning",
    "GPUXidFatal": "critical",
    "StragglerRank": "warning",
    "SlowRanksSharedComponent": "critical",
    "StageImbalance": "info",
    "SoftwareStraggler": "info",
    "JobHung": "critical",
    "FabricmonAgentDown": "warning",
    "FabricCableDegrading": "warning",
    "FabricmonUnknownNodes": "warning",
}

# One wording per alert across both senders: an alert the Prometheus rules also send reads the same from
# either (deploy/prometheus/mixin.py; tests/deploy/test_alert_wording.py holds them equal).
SUMMARY = {
    "FabricLinkDown": "Fabric link {component} is not ACTIVE",
    "FabricLinkFlapping": "Fabric link {component} is flapping (down repeatedly)",
    "FabricLinkErrors": "Fabric link {component} is taking physical/link errors",
    "FabricLinkDegraded": "Fabric link {component} runs below its expected rate or width",
    "FabricLeafDegraded": "Many links of leaf {component} are failing at once",
    "FabricSpineDegraded": "Uplinks of spine {component} to several leaves are failing at once",
    "FabricPFCStorm": "PFC pause storm from {component}",
    "FabricCongestion": "Sustained congestion on {component}",
    "RDMARetransmits": "RDMA transport retries on {component} (timeouts, out-of-sequence)",
    "FabricConfigDrift": "Lossless fabric config of {component} differs from the expected profile",
    "NVLinkDown": "NVLink {component} is down",
    "NVLinkErrors": "NVLink {component} is taking replay/recovery/CRC errors",
    "GPUXidFatal": "GPU {component} reported a fatal XID",
    "StragglerRank": "Persistent straggler on {component}",
    "SlowRanksSharedComponent": "Slow ranks share {component}",
    "StageImbalance": "Pipeline stage imbalance in {component}",
    "SoftwareStraggler": "Ranks on {component} are slow while its fabric and GPUs are clean (software straggler)",
    "JobHung": "A job is hung on {component}: its peers wait in a collective it never entered",
    "FabricmonAgentDown": "fabricmon agent on {component} stopped reporting",
    "FabricCableDegrading": "Cable or optics of fabric link {component} predicted to fail",
    "FabricmonUnknownNodes": "Nodes stream to the aggregator that its {component} does not know",
}


# Labels that are part of an alert's identity once it fired: Alertmanager keys an alert on its label set,
# so a value changing later would be a second alert beside the first (never resolved).  A straggler's
# lateness (compute or comm, which decides whether a fabric alert may hide it) and its rank are fixed by
# the finding that opened the incident, like ``hpc_job`` (cost.py); so is a host cable's ``switch_end``
# (a topology reload re-labels the link and resolves its switch end again).
FIXED_LABELS = frozenset({"lateness", "rank", "switch_end"})


def incident_id(alertname: str, component: str) -> str:
    return hashlib.sha256(f"{alertname}\x00{component}".encode()).hexdigest()[:16]


@dataclass(slots=True)
class Finding:
    """What a detector or the correlator saw at one tick."""

    alertname: str
    component: Component
    labels: dict[str, str]
    evidence: list[str]
    fire: bool = True
    keep: bool = True
    hold_s: float | None = None  # None: the manager's default
    ranks: tuple[int, ...] = ()
    jobs: tuple[str, ...] = ()
    description: str = ""
    severity: str = ""
    impact: tuple[JobImpact, ...] = ()  # cost.JobImpact per hurt job, by cost (aggregator/cost.py)
    # the cost stage ran on it this tick: ``impact`` is the jobs on the component now, empty included (a job
    # that left is dropped); a finding it did not see (a restart's hold) leaves the incident's impact alone
    costed: bool = False

    @property
    def component_type(self) -> str:
        return self.component.kind.value


Key = tuple[str, Component]  # (alertname, component): one incident at a time


@dataclass(frozen=True, slots=True)
class Relation:
    """``child`` (alertname, component) is evidence of ``parent`` (alertname, component)."""

    child: Key
    parent: Key


@dataclass
class Incident:
    id: str
    alertname: str
    severity: str
    component_type: str
    component: str
    labels: dict[str, str]
    evidence: list[str]
    first_seen: float
    last_seen: float
    resolved_at: float | None = None
    ranks: list[int] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    description: str = ""
    related_to: str = ""  # id of the incident this one's evidence also supports (a leaf over its link)
    absorbed: list[str] = field(default_factory=list)  # components whose findings were this one's evidence
    version: int = 0  # bumped on every visible change (the Alertmanager sender watches it)
    hold_s: float = 15.0
    impact: list[JobImpact] = field(default_factory=list)  # cost.JobImpact per job whose ranks use the component
    resolved_reason: str = ""  # why it resolved when not for lack of evidence (topology_removed)
    # what remediation decided and did about it, oldest first (aggregator/remediation/remediator.py)
    remediation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    @property
    def summary(self) -> str:
        return SUMMARY.get(self.alertname, "{component}").format(component=self.component)

    def full_description(self) -> str:
        parts = []
        if self.description:
            parts.append(self.description)
        if self.evidence:
            parts.append("Evidence: " + "; ".join(self.evidence))
        if self.jobs:
            parts.append("Hurt jobs: " + ", ".join(self.jobs))
        if self.ranks:
            shown = ", ".join(str(r) for r in self.ranks[:32])
            more = f" (+{len(self.ranks) - 32} more)" if len(self.ranks) > 32 else ""
            parts.append(f"Hurt ranks: {shown}{more}")
        if self.resolved_reason:
            parts.append(f"Resolved: {self.resolved_reason}")
        return ". ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "alertname": self.alertname, "severity": self.severity,
            "component_type": self.component_type, "component": self.component,
            "labels": dict(self.labels), "evidence": list(self.evidence), "description": self.full_description(),
            "ranks": list(self.ranks), "jobs": list(self.jobs),
            "first_seen": self.first_seen, "last_seen": self.last_seen, "resolved_at": self.resolved_at,
            "related_to": self.related_to, "absorbed": list(self.absorbed),
            "impact": [i.to_dict() for i in self.impact],
            "resolved_reason": self.resolved_reason,
            "remediation": [dict(e) for e in self.remediation],
        }


class IncidentManager:
    """Open/relate/update/resolve lifecycle with dedup on (alertname, component)."""

    def __init__(self, default_hold_s: float = 15.0, keep_resolved: int = 5000) -> None:
        self.default_hold_s = default_hold_s
        self._updated = False  # restore() is for the state persisted before a restart, before any tick
        self.updates = 0  # calls of update (tick_gate.py: one outside a tick runs the next tick)
        self._open: dict[Key, Incident] = {}
        self._last_evidence: dict[Key, float] = {}
        self._resolved: list[tuple[Component, Incident]] = []  # oldest first, with the component it was on
        self._recurrence: dict[str, int] = {}
        self._keep_resolved = keep_resolved

    def open_incidents(self) -> list[Incident]:
        return list(self._open.values())

    def open_keys(self) -> frozenset[Key]:
        """(alertname, component) of every open incident: a read-only view for the correlator."""
        return frozenset(self._open)

    def all_incidents(self) -> list[Incident]:
        out = [inc for _, inc in self._resolved]
        out.extend(self._open.values())
        out.sort(key=lambda i: (i.first_seen, i.id))
        return out

    def all_by_component(self) -> list[tuple[Component, Incident]]:
        """Every incident kept (resolved, then open) with its component: a read-only view for cost.py."""
        return [*self._resolved, *((c, inc) for (_, c), inc in self._open.items())]

    def restore(self, inc: Incident, component: Component, last_evidence: float) -> None:
        """An incident open before a restart (incident_store.py), open again under its own id, keyed by
        ``component`` (parsed from the stored id at that input edge).  Only before the first ``update``:
        afterwards ``update`` stays the one call that changes incident state."""
        if self._updated:
            raise RuntimeError("IncidentManager.restore: only before the first update")
        key = (inc.alertname, component)
        inc.resolved_at = None
        self._open[key] = inc
        self._last_evidence[key] = last_evidence
        base = incident_id(inc.alertname, inc.component)
        n = int(inc.id.rsplit("-", 1)[1]) if inc.id != base and inc.id.rsplit("-", 1)[-1].isdigit() else 1
        self._recurrence[base] = max(self._recurrence.get(base, 0), n)

    def get_open(self, alertname: str, component: Component | str) -> Incident | None:
        """The open incident of ``alertname`` on ``component`` (or on the component rendered as that id)."""
        if isinstance(component, Component):
            return self._open.get((alertname, component))
        return next((i for (a, c), i in self._open.items() if a == alertname and c.id == component), None)

    def update(self, findings: list[Finding], now: float, relations: list[Relation] | tuple[Relation, ...] = (),
               retire: Callable[[Component], bool] | None = None, reason: str = "") -> list[Incident]:
        """Apply one tick's findings and relations; returns every incident that changed, and only those.
        ``retire(component)``: open incidents on the components it selects resolve now with ``reason``
        (a component that left the topology has no evidence left to wait for)."""
        self._updated = True
        self.updates += 1
        changed: dict[str, Incident] = {}
        if retire is not None:
            for key, inc in list(self._open.items()):
                if retire(key[1]):
                    inc.resolved_reason = reason
                    self._resolve(key, now)
                    changed[inc.id] = inc
        parent_of = {r.child: r.parent for r in relations}
        by_key: dict[Key, Finding] = {}
        for f in findings:
            by_key.setdefault((f.alertname, f.component), f)
        present = {k for k, f in by_key.items() if f.fire or f.keep}
        # parents before their children: a parent opening in this tick already absorbs them
        for key in sorted(by_key, key=lambda k: _depth(k, parent_of)):
            f = by_key[key]
            open_inc = self._open.get(key)
            if open_inc is None:
                owner = self._absorber(key, parent_of, present)
                if owner is not None:
                    if f.fire or f.keep:
                        self._absorb(owner, f, changed)
                    continue
                if f.fire:
                    new = self._open_incident(f, now)
                    self._relate(new, key, parent_of)
                    changed[new.id] = new
                continue
            self._relate(open_inc, key, parent_of)
            if (f.fire or f.keep) and self._refresh(open_inc, f, now):
                changed[open_inc.id] = open_inc
        for key, inc in list(self._open.items()):
            last = self._last_evidence.get(key, now)
            if last < now and now - last >= inc.hold_s:
                self._resolve(key, now)
                changed[inc.id] = inc
        return list(changed.values())

    # ------------------------------------------------------------------ internals of update
    def _absorber(self, key: Key, parent_of: dict[Key, Key], present: set[Key]) -> Key | None:
        """The nearest ancestor open or found this tick: the finding is its evidence."""
        p = parent_of.get(key)
        for _ in range(8):  # relations are shallow (link -> leaf congestion -> leaf); bound a cycle
            if p is None:
                return None
            if p in self._open or p in present:
                return p
            p = parent_of.get(p)
        return None

    def _absorb(self, owner_key: Key, f: Finding, changed: dict[str, Incident]) -> None:
        owner = self._open.get(owner_key)
        if owner is None:  # the parent is found this tick but does not fire yet: nothing to attach to
            return
        if f.component.id not in owner.absorbed:
            # kept sorted: findings reach here in set order, which varies with the process's hash seed
            insort(owner.absorbed, f.component.id)
        if f.ranks or f.jobs:
            ranks = sorted(set(owner.ranks) | set(f.ranks))
            jobs = sorted(set(owner.jobs) | set(f.jobs))
            if ranks != owner.ranks or jobs != owner.jobs:
                owner.ranks, owner.jobs = ranks, jobs
                owner.version += 1
                changed[owner.id] = owner

    def _relate(self, inc: Incident, key: Key, parent_of: dict[Key, Key]) -> None:
        p = parent_of.get(key)
        parent = self._open.get(p) if p is not None else None
        if parent is not None and inc.related_to != parent.id:
            inc.related_to = parent.id

    def _open_incident(self, f: Finding, now: float) -> Incident:
        key = (f.alertname, f.component)
        base = incident_id(f.alertname, f.component.id)
        n = self._recurrence.get(base, 0) + 1
        self._recurrence[base] = n
        inc = Incident(
            id=base if n == 1 else f"{base}-{n}", alertname=f.alertname,
            severity=f.severity or SEVERITY.get(f.alertname, "warning"),
            component_type=f.component.kind.value, component=f.component.id, labels=dict(f.labels),
            evidence=list(f.evidence), first_seen=now, last_seen=now,
            ranks=sorted(set(f.ranks)), jobs=sorted(set(f.jobs)), description=f.description,
            hold_s=f.hold_s if f.hold_s is not None else self.default_hold_s, version=1, impact=list(f.impact),
        )
        self._open[key] = inc
        self._last_evidence[key] = now
        return inc

    def _refresh(self, inc: Incident, f: Finding, now: float) -> bool:
        """Evidence seen again; True when something an alert shows changed."""
        self._last_evidence[(f.alertname, f.component)] = now
        inc.last_seen = now
        if f.hold_s is not None:
            inc.hold_s = f.hold_s
        visible = False
        if f.evidence and f.evidence != inc.evidence:
            inc.evidence = list(f.evidence)
        ranks = sorted(set(inc.ranks) | set(f.ranks))
        jobs = sorted(set(inc.jobs) | set(f.jobs))
        if ranks != inc.ranks or jobs != inc.jobs:
            inc.ranks, inc.jobs = ranks, jobs
            visible = True
        if f.description and f.description != inc.description:
            inc.description = f.description
            visible = True
        if f.costed and list(f.impact) != inc.impact:
            # shown as integers (impact_sentence): a resend only when what an operator reads changes
            visible = visible or impact_sentence(list(f.impact)) != impact_sentence(inc.impact)
            inc.impact = list(f.impact)
        for k, v in f.labels.items():
            if k in FIXED_LABELS and inc.labels.get(k):
                continue
            if v and inc.labels.get(k) != v:
                inc.labels[k] = v
                visible = True
        if visible:
            inc.version += 1
        return visible

    def _resolve(self, key: Key, now: float) -> None:
        inc = self._open.pop(key)
        self._last_evidence.pop(key, None)
        inc.resolved_at = now
        inc.version += 1
        self._resolved.append((key[1], inc))
        if len(self._resolved) > self._keep_resolved:
            del self._resolved[: len(self._resolved) - self._keep_resolved]


def _depth(key: Key, parent_of: dict[Key, Key]) -> int:
    d, p = 0, parent_of.get(key)
    while p is not None and d < 8:
        d += 1
        p = parent_of.get(p)
    return d
