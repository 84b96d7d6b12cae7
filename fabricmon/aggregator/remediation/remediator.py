"""The remediation stage: called by the detection tick with what changed, it decides about each new
incident (policy.py), hands actions to the executor, applies their results, and undoes fabricmon's own
actions once a node stayed clean for ``undo_after``.

Every decision is one log line (``remediation``), a count in ``fabricmon_remediation_actions_total{action,
result}`` and an entry on the incident (``remediation`` in /api/incidents and in its Alertmanager
annotations): the incidents it wrote on are returned with the tick's changes, so they are sent and saved.
The breaker is counted cluster-wide: ``remote`` gives the other shards' actions (read back from the
Alertmanager annotations every shard writes), and only the shard that owns a node decides about it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import structlog

from ...components import Kind
from ..incident_store import component_of
from ..incidents import Incident, IncidentManager
from .breaker import RemediationState
from .config import RemediationSettings
from .executor import Executor, Job, Outcome
from .marker import reset_marker
from .policy import RESULTS, Candidate, Decision, decide, undo_due

log = structlog.get_logger("fabricmon.aggregator.remediation")

MAX_ENTRIES = 20  # per incident: the decisions and results shown with it
UNDO_RESULTS = ("done", "dry_run", "foreign_drain", "failed")


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def candidate_of(inc: Incident) -> Candidate | None:
    try:
        c = component_of(inc.component_type, inc.component, inc.labels)
    except ValueError:
        return None
    node = c.node if c.kind in (Kind.LINK, Kind.NIC, Kind.GPU, Kind.NVLINK, Kind.NODE) else ""
    return Candidate(inc.id, inc.alertname, c.kind, inc.component, node)


class Remediator:
    def __init__(self, settings: RemediationSettings, state: RemediationState, executor: Executor, *,
                 owns: Callable[[str], bool], shard: str = "", state_file: str = "",
                 remote: Callable[[], tuple[tuple[float, str], ...]] | None = None) -> None:
        self.s = settings
        self.state = state
        self.executor = executor
        self.owns = owns
        self.shard = shard
        self.state_file = state_file
        self._remote_source = remote
        self._remote: dict[str, float] = {}  # node -> latest action time another shard reported
        self._decided: set[str] = set()  # incident ids decided about (once each, when first seen open)
        self._incidents: dict[str, Incident] = {}  # id -> incident, for results that arrive later
        self._dirty: dict[str, Incident] = {}
        self._undo_retry_at: dict[str, float] = {}
        self.persist: Callable[[], None] | None = None  # saves the state file (service.py): undo and reset
        self._state_changed = False
        self.actions_total: dict[tuple[str, str], int] = {}
        self.undos_total: dict[tuple[str, str], int] = {}
        # every series exists from the start (and /metrics never sees these dicts grow under it)
        for a in sorted({*settings.actions, *(x for acts in settings.alert_actions().values() for x in acts)}):
            for r in RESULTS:
                self.actions_total[(a, r)] = 0
            for r in UNDO_RESULTS:
                self.undos_total[(a, r)] = 0
        self.resets_total = 0
        self.nodes_out = 0  # recounted at each tick (read by /metrics from another thread)
        self._dry_undo_logged: set[str] = set()

    # ------------------------------------------------------------------ the tick
    def tick(self, now: float, manager: IncidentManager, changed: list[Incident]) -> list[Incident]:
        """Decide, apply finished actions, undo; returns ``changed`` plus the incidents written on."""
        self._check_reset(now)
        self._merge_remote(now)
        for out in self.executor.finished():
            self._apply(out, now)
        open_incs = manager.open_incidents()
        in_flight = self.executor.in_flight()
        open_nodes: set[str] = set()
        table = self.s.alert_actions()
        for inc in open_incs:
            c = candidate_of(inc)
            if c is not None and c.node and inc.alertname in table:
                open_nodes.add(c.node)
            if inc.id in self._decided or c is None:
                continue
            self._decided.add(inc.id)
            d = decide(c, self.s, self.state, now, in_flight=in_flight, owns=self.owns, remote=self._remote_items())
            if d is not None:
                self._record(d, inc, now)
                in_flight = self.executor.in_flight()
        for node in undo_due(self.state, frozenset(open_nodes), now, self.s.undo_after):
            self._undo(node, now, in_flight)
        self.state.breaker.prune(now)
        self.nodes_out = sum(1 for rec in self.state.nodes.values() if rec.undone_at is None and not rec.dry_run)
        if self._state_changed and self.persist is not None:
            self._state_changed = False
            self.persist()
        self._decided &= {i.id for i in open_incs}
        for iid in [i for i in self._incidents if i not in self._decided
                    and not any(r.incident_id == i for r in self.state.nodes.values())]:
            del self._incidents[iid]
        if not self._dirty:
            return changed
        ids = {i.id for i in changed}
        extra = [i for i in self._dirty.values() if i.open and i.id not in ids]
        self._dirty.clear()
        return [*changed, *extra]

    def _remote_items(self) -> tuple[tuple[float, str], ...]:
        return tuple((t, n) for n, t in self._remote.items())

    def _merge_remote(self, now: float) -> None:
        if self._remote_source is None:
            return
        for t, n in self._remote_source():
            if t > self._remote.get(n, -1.0):
                self._remote[n] = t
        for n in [n for n, t in self._remote.items() if t <= now - self.s.window]:
            del self._remote[n]

    # ------------------------------------------------------------------ decisions
    def _record(self, d: Decision, inc: Incident, now: float) -> None:
        self._state_changed = True
        c = d.candidate
        if d.result == "act":
            job = Job(c.node, False, d.actions, d.reason, inc.to_dict(), now)
            from .breaker import NodeRecord

            self.state.nodes[c.node] = NodeRecord(c.node, now, c.incident_id, c.alertname, c.component, d.reason)
            self._incidents[inc.id] = inc
            self.executor.submit(job)
            self._log(d.result, d.actions, c, d.detail, d.reason, inc, now, count=False)
            return
        if d.result == "dry_run":
            from .breaker import NodeRecord

            self.state.nodes[c.node] = NodeRecord(c.node, now, c.incident_id, c.alertname, c.component, d.reason,
                                                  list(d.actions), dry_run=True)
        self._log(d.result, d.actions or self.s.actions, c, d.detail, d.reason, inc, now)

    def _log(self, result: str, actions: tuple[str, ...], c: Candidate, detail: str, reason: str,
             inc: Incident | None, now: float, *, count: bool = True, undo: bool = False,
             error: str = "") -> None:
        if count:
            table = self.undos_total if undo else self.actions_total
            for a in actions:
                table[(a, result)] = table.get((a, result), 0) + 1
        shown = "act" if result == "act" else result
        log.info("remediation", decision=shown, undo=undo or None, actions=list(actions),
                 node=c.node or None,
                 alertname=c.alertname, component=c.component, incident=c.incident_id, mode=self.s.mode,
                 reason=reason or None, detail=detail, error=error or None)
        if inc is None:
            return
        entry: dict[str, Any] = {
            "at": _iso(now), "decision": ("undo_" if undo else "") + shown, "actions": list(actions),
            "node": c.node, "detail": detail + (f": {error}" if error else ""), "mode": self.s.mode}
        if reason:
            entry["reason"] = reason
        if result == "done" and not undo:
            entry["shard"] = self.shard
            entry["at_unix"] = now  # the other shards count it toward the breaker (remote_actions_of)
        inc.remediation.append(entry)
        del inc.remediation[:-MAX_ENTRIES]
        inc.version += 1
        self._dirty[inc.id] = inc

    # ------------------------------------------------------------------ results of the executor
    def _apply(self, out: Outcome, now: float) -> None:
        self._state_changed = True
        job = out.job
        rec = self.state.nodes.get(job.node)
        inc = self._incidents.get(str(job.incident.get("id", "")))
        c = Candidate(str(job.incident.get("id", "")), str(job.incident.get("alertname", "")), Kind.NODE,
                      str(job.incident.get("component", job.node)), job.node)
        for name in job.actions:
            result = out.results.get(name, "failed")
            err = out.errors.get(name, "") if result == "failed" else ""
            verb = "undo" if job.undo else "apply"
            tries = out.attempts.get(name, 1)
            detail = {"done": f"{name} {verb} done on {job.node}",
                      "foreign_drain": f"{job.node} is out of service by another tool or an operator: left alone",
                      "failed": f"{name} {verb} failed after {tries} attempt(s)"}.get(result, result)
            self._log(result, (name,), c, detail, job.reason, inc, now, undo=job.undo, error=err)
            if rec is not None and result == "done" and not job.undo and name not in rec.actions:
                rec.actions.append(name)
        if rec is None:
            return
        if job.undo:
            if all(out.results.get(a) in ("done", "foreign_drain") for a in job.actions):
                rec.undone_at = now
            else:  # tried again later, not at every tick
                self._undo_retry_at[job.node] = now + max(60.0, self.s.retry_backoff_s * 2 ** self.s.retries)
        elif not rec.actions and all(out.results.get(a) == "foreign_drain" for a in job.actions):
            # nothing changed: another's drain; fabricmon forgets the node (never undone) and it counts for nothing
            self.state.breaker.release(job.node, rec.at)
            del self.state.nodes[job.node]

    def _undo(self, node: str, now: float, in_flight: frozenset[str]) -> None:
        self._state_changed = True
        rec = self.state.nodes[node]
        c = Candidate(rec.incident_id, rec.alertname, Kind.NODE, rec.component, node)
        inc = self._incidents.get(rec.incident_id)
        if rec.dry_run:
            rec.undone_at = now
            self._log("dry_run", tuple(rec.actions), c, f"would undo {', '.join(rec.actions)} on {node}: clean "
                      f"for {self.s.undo_after:g} s", rec.reason, inc, now, undo=True)
            return
        if self.s.mode == "dry_run":  # a real drain from an earlier act: a dry run changes nothing, says it once
            if node not in self._dry_undo_logged:
                self._dry_undo_logged.add(node)
                self._log("dry_run", tuple(rec.actions), c, f"would undo {', '.join(rec.actions)} on {node} "
                          "(done while acting; left as it is in a dry run)", rec.reason, inc, now, undo=True)
            return
        if not self.s.undo or node in in_flight or now < self._undo_retry_at.get(node, 0.0):
            return
        acts = tuple(rec.actions)
        if not acts:
            rec.undone_at = now  # nothing fabricmon did there (every action failed): nothing to undo
            return
        self.executor.submit(Job(node, True, acts, rec.reason, {"id": rec.incident_id, "alertname": rec.alertname,
                                                                   "component": rec.component}, now))

    # ------------------------------------------------------------------ reset
    def _check_reset(self, now: float) -> None:
        if not self.state_file:
            return
        marker = reset_marker(self.state_file)
        try:
            if not marker.exists():
                return
            marker.unlink()
        except OSError as exc:
            log.error("remediation_reset_unreadable", file=str(marker), error=str(exc))
            return
        self.reset(now)

    def reset(self, now: float) -> None:
        was = self.state.breaker.tripped_reason
        self.state.breaker.reset(now)
        self._remote.clear()
        self.resets_total += 1
        self._state_changed = True
        log.warning("remediation_breaker_reset", was_tripped=bool(was) or None, reason=was or None,
                    detail="actions counted before now no longer count toward the breaker")

    # ------------------------------------------------------------------ views
    def to_json(self) -> dict[str, Any]:
        return self.state.to_json()

    def snapshot(self) -> dict[str, Any]:
        return {"actions_total": dict(self.actions_total), "undos_total": dict(self.undos_total),
                "tripped": self.state.breaker.tripped, "mode": self.s.mode, "limit": self.state.breaker.limit,
                "in_flight": len(self.executor.in_flight()), "retries_total": self.executor.retries_total,
                "nodes_out": self.nodes_out,
                "resets_total": self.resets_total}


def remote_actions_of(alerts: object, own_shard: str) -> list[tuple[float, str]]:
    """(time, node) of the actions the other shards did, from their alerts' ``remediation_acted`` annotation
    in Alertmanager's ``GET /api/v2/alerts`` answer (pure)."""
    out: list[tuple[float, str]] = []
    if not isinstance(alerts, list):
        return out
    for a in alerts:
        ann = a.get("annotations") if isinstance(a, dict) else None
        if not isinstance(ann, dict):
            continue
        raw = ann.get("remediation_acted")
        if not isinstance(raw, str) or (own_shard and ann.get("shard") == own_shard):
            continue
        try:
            v = json.loads(raw)
        except ValueError:
            continue
        if isinstance(v, dict) and isinstance(v.get("node"), str) and isinstance(v.get("at"), (int, float)) \
                and not isinstance(v.get("at"), bool):
            out.append((float(v["at"]), v["node"]))
    return out
