"""Incidents: one per (alertname, component), opened, updated and resolved on sample time.

Detectors and the correlator hand the manager ``Finding``s every tick.  A
finding carries two verdicts: ``fire`` (the raise condition, persistence
already applied by the detector) and ``keep`` (evidence still present, a weaker
condition).  An incident opens on ``fire``, is refreshed by either, and
resolves once neither was seen for the alert's hold time: the hysteresis that
keeps a fault at the threshold from flapping.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

SEVERITY = {
    "FabricLinkDown": "critical",
    "FabricLinkFlapping": "warning",
    "FabricLinkErrors": "warning",
    "FabricLinkDegraded": "warning",
    "FabricLeafDegraded": "critical",
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
    "FabricmonAgentDown": "warning",
    "FabricCableDegrading": "warning",
}

SUMMARY = {
    "FabricLinkDown": "RDMA link {component} is down",
    "FabricLinkFlapping": "RDMA link {component} is flapping",
    "FabricLinkErrors": "RDMA link {component} shows physical-layer errors",
    "FabricLinkDegraded": "RDMA link {component} runs below its expected rate or width",
    "FabricLeafDegraded": "Many links of leaf {component} are failing at once",
    "FabricPFCStorm": "{component} emits PFC pauses (slow receiver)",
    "FabricCongestion": "Congestion (ECN/CNP, transmit wait) on {component}",
    "RDMARetransmits": "RDMA transport retries rising on {component}",
    "FabricConfigDrift": "Lossless fabric config drifted on {component}",
    "NVLinkDown": "NVLink {component} is down",
    "NVLinkErrors": "NVLink {component} shows CRC/replay errors",
    "GPUXidFatal": "Fatal XID on {component}",
    "StragglerRank": "Persistent straggler on {component}",
    "SlowRanksSharedComponent": "Slow ranks share {component}",
    "StageImbalance": "Pipeline stage imbalance in {component}",
    "FabricmonAgentDown": "fabricmon agent on {component} stopped reporting",
    "FabricCableDegrading": "Cable or optics of {component} predicted to fail (BER trend, lane errors, RX power)",
}


def incident_id(alertname: str, component: str) -> str:
    return hashlib.sha256(f"{alertname}\x00{component}".encode()).hexdigest()[:16]


@dataclass(slots=True)
class Finding:
    """What a detector or the correlator saw at one tick."""

    alertname: str
    component_type: str
    component: str
    labels: dict[str, str]
    evidence: list[str]
    fire: bool = True
    keep: bool = True
    hold_s: float | None = None  # None: the manager's default
    ranks: tuple[int, ...] = ()
    jobs: tuple[str, ...] = ()
    description: str = ""
    severity: str = ""


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
    folded_into: str = ""  # set when a leaf incident absorbed this one
    version: int = 0  # bumped on every visible change (the Alertmanager sender watches it)
    hold_s: float = 15.0

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
        return ". ".join(parts)

    def to_dict(self) -> dict:
        return {
            "id": self.id, "alertname": self.alertname, "severity": self.severity,
            "component_type": self.component_type, "component": self.component,
            "labels": dict(self.labels), "evidence": list(self.evidence), "description": self.full_description(),
            "ranks": list(self.ranks), "jobs": list(self.jobs),
            "first_seen": self.first_seen, "last_seen": self.last_seen, "resolved_at": self.resolved_at,
        }


class IncidentManager:
    """Open/update/resolve lifecycle with dedup on (alertname, component)."""

    def __init__(self, default_hold_s: float = 15.0, keep_resolved: int = 5000) -> None:
        self.default_hold_s = default_hold_s
        self._open: dict[tuple[str, str], Incident] = {}
        self._last_evidence: dict[tuple[str, str], float] = {}
        self._resolved: list[Incident] = []
        self._recurrence: dict[str, int] = {}
        self._keep_resolved = keep_resolved
        self.changed: list[Incident] = []  # incidents whose version changed in the last update

    def open_incidents(self) -> list[Incident]:
        return list(self._open.values())

    def all_incidents(self, include_folded: bool = False) -> list[Incident]:
        out = [i for i in self._resolved if include_folded or not i.folded_into]
        out.extend(self._open.values())
        out.sort(key=lambda i: (i.first_seen, i.id))
        return out

    def get_open(self, alertname: str, component: str) -> Incident | None:
        return self._open.get((alertname, component))

    def update(self, findings: list[Finding], now: float) -> list[Incident]:
        """Apply one tick's findings; returns the incidents that changed."""
        changed: dict[str, Incident] = {}
        seen: set[tuple[str, str]] = set()
        for f in findings:
            key = (f.alertname, f.component)
            if key in seen:
                continue
            seen.add(key)
            inc = self._open.get(key)
            if inc is None:
                if not f.fire:
                    continue
                base = incident_id(f.alertname, f.component)
                n = self._recurrence.get(base, 0) + 1
                self._recurrence[base] = n
                inc = Incident(
                    id=base if n == 1 else f"{base}-{n}", alertname=f.alertname,
                    severity=f.severity or SEVERITY.get(f.alertname, "warning"),
                    component_type=f.component_type, component=f.component, labels=dict(f.labels),
                    evidence=list(f.evidence), first_seen=now, last_seen=now,
                    ranks=sorted(set(f.ranks)), jobs=sorted(set(f.jobs)), description=f.description,
                    hold_s=f.hold_s if f.hold_s is not None else self.default_hold_s, version=1,
                )
                self._open[key] = inc
                self._last_evidence[key] = now
                changed[inc.id] = inc
                continue
            if not (f.fire or f.keep):
                continue
            self._last_evidence[key] = now
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
            for k, v in f.labels.items():
                if v and inc.labels.get(k) != v:
                    inc.labels[k] = v
                    visible = True
            if visible:
                inc.version += 1
                changed[inc.id] = inc
        for key, inc in list(self._open.items()):
            last = self._last_evidence.get(key, now)
            if last < now and now - last >= inc.hold_s:
                self._resolve(key, now)
                changed[inc.id] = inc
        self.changed = list(changed.values())
        return self.changed

    def fold(self, alertname: str, component: str, into: str, now: float) -> Incident | None:
        """Resolve an open incident because a leaf incident absorbed it."""
        key = (alertname, component)
        inc = self._open.get(key)
        if inc is None:
            return None
        inc.folded_into = into
        self._resolve(key, now)
        self.changed.append(inc)
        return inc

    def attach(self, alertname: str, component: str, ranks: list[int], jobs: list[str]) -> None:
        inc = self._open.get((alertname, component))
        if inc is None:
            return
        r = sorted(set(inc.ranks) | set(ranks))
        j = sorted(set(inc.jobs) | set(jobs))
        if r != inc.ranks or j != inc.jobs:
            inc.ranks, inc.jobs = r, j
            inc.version += 1
            if inc not in self.changed:
                self.changed.append(inc)

    def _resolve(self, key: tuple[str, str], now: float) -> None:
        inc = self._open.pop(key)
        self._last_evidence.pop(key, None)
        inc.resolved_at = now
        inc.version += 1
        self._resolved.append(inc)
        if len(self._resolved) > self._keep_resolved:
            del self._resolved[: len(self._resolved) - self._keep_resolved]
