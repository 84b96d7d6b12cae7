"""After a restart: a restored incident is sent again only once its node's first batches still show it.

incident_store.py restores the open incidents of the previous life under their ids.  Before this, the
ones Alertmanager no longer held were sent firing again at start (``incidents_resumed sent_again``),
faults that had cleared while the aggregator was down included: they paged healthy links.  Now every
restored incident waits, sending nothing, for its node's first fresh batches (sample time at or after
the aggregator's first tick; a replayed spool is older):

- the detectors find its evidence again: confirmed.  Alertmanager still holds it: its resends resume
  (``adopt``), nothing new goes out; Alertmanager lost it: it is sent firing (the fault is there and the
  on-call was told it resolved);
- ``VERIFY_INTERVALS`` of the node's fresh batches (at least the detectors' persistence) show nothing:
  it is no longer held and resolves after its own hold, sent resolved once;
- its node never comes back (or the incident is on no node: a leaf, a rail, a job): held until the
  restart grace is over, then resolved the same way (FabricmonAgentDown speaks for a silent node).

``resuming`` is what ``fabricmon_aggregator_resuming`` exports: 1 from start until every restored
incident is settled and every node heard from in this life has had its fresh batches evaluated (at
most the restart grace).  The Prometheus fallback rules keep firing while it is 1, so at hand-back the
aggregator's own alert for a fault still present is already in Alertmanager when the fallback's
resolves (deploy/prometheus/mixin.py, "hand-back").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..components import Component
from .agents_down import restart_grace
from .config import DetectionSettings
from .incidents import Finding, Incident
from .state import NodeState

VERIFY_INTERVALS = 5


def verify_s(s: DetectionSettings, interval: float) -> float:
    """How long a node's fresh batches must show nothing before a restored incident of it is let go:
    5 intervals, and never less than the detectors' own persistence plus one interval."""
    persist = max(s.window_s * s.of_windows, s.degraded_persist_s, s.config_persist_s, s.link_down_persist_s,
                  s.nvlink_down_persist_s)
    return max(VERIFY_INTERVALS * interval, persist + interval)


@dataclass
class _Pending:
    inc: Incident
    component: Component
    fresh_since: float | None = None  # sample time of its node's first fresh batch


class ResumeCheck:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, Component], _Pending] = {}
        self._adopt: Callable[[list[Incident]], None] = lambda incs: None
        self._at_am: set[str] = set()  # ids of the restored incidents Alertmanager held active at start
        self._confirmed: list[Incident] = []  # confirmed at the last hold(): settle() sends or adopts them
        self._done = False  # resuming is over (latched: it never comes back within a life)
        self.confirmed_total = 0
        self.released_total = 0

    def restored(self, incidents: list[tuple[Incident, Component, bool]],
                 adopt: Callable[[list[Incident]], None]) -> None:
        """(incident, its component, Alertmanager holds it active) for each incident restored at start;
        ``adopt``: resume the periodic resends of confirmed incidents Alertmanager still holds."""
        self._adopt = adopt
        for inc, c, at_am in incidents:
            self._pending[(inc.alertname, c)] = _Pending(inc, c)
            if at_am:
                self._at_am.add(inc.id)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def hold(self, findings: list[Finding], now: float, nodes: Mapping[str, NodeState], started_at: float,
             s: DetectionSettings) -> list[Finding]:
        """Evidence-keeping findings (fire False) for the restored incidents still waiting for their node."""
        if not self._pending:
            return []
        present = {(f.alertname, f.component) for f in findings if f.fire or f.keep}
        out: list[Finding] = []
        for key, p in list(self._pending.items()):
            if key in present:
                del self._pending[key]
                self.confirmed_total += 1
                self._confirmed.append(p.inc)
                continue
            ns = nodes.get(p.component.node) if p.component.node else None
            if ns is not None and ns.ever_seen and ns.last_ts >= started_at:
                if p.fresh_since is None:
                    p.fresh_since = ns.last_ts
                done = now - p.fresh_since >= verify_s(s, ns.interval)
            else:
                iv = ns.interval if ns is not None else max((n.interval for n in nodes.values()), default=1.0)
                done = now - started_at >= restart_grace(s, iv)
            if done:
                del self._pending[key]
                self.released_total += 1
                continue
            inc = p.inc
            out.append(Finding(inc.alertname, p.component, dict(inc.labels), list(inc.evidence), fire=False,
                               keep=True))
        return out

    def settle(self, changed: list[Incident]) -> list[Incident]:
        """What of ``changed`` goes to Alertmanager: nothing for a restored incident not confirmed yet
        (a resolve goes, once); a confirmed one Alertmanager lost is sent firing, one it holds is adopted."""
        waiting = {id(p.inc) for p in self._pending.values()}
        out = [inc for inc in changed if not (inc.open and id(inc) in waiting)]
        if self._confirmed:
            lost = [inc for inc in self._confirmed if inc.open and inc.id not in self._at_am]
            held = [inc for inc in self._confirmed if inc.open and inc.id in self._at_am]
            if held:
                self._adopt(held)
            seen = {id(i) for i in out}
            out.extend(inc for inc in lost if id(inc) not in seen)
            self._confirmed = []
        return out

    def resuming(self, now: float | None, nodes: Mapping[str, NodeState], started_at: float | None,
                 s: DetectionSettings) -> bool:
        if self._done:
            return False
        if started_at is None or now is None:
            return True
        iv = max((n.interval for n in nodes.values()), default=1.0)
        if now - started_at >= restart_grace(s, iv):
            self._done = True
            return False
        if self._pending:
            return True
        # every node heard from in this life has had its fresh batches evaluated
        for ns in nodes.values():
            if ns.connected and not (ns.ever_seen and ns.last_ts >= started_at + verify_s(s, ns.interval)):
                return True
        if now - started_at < verify_s(s, iv):
            return True
        self._done = True
        return False
