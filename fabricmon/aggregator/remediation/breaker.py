"""The circuit breaker and what fabricmon did to each node: the remediation state persisted in the state file.

Counted in nodes acted on over ``window`` (sample time), cluster-wide: this shard's own actions and the other
shards' (read back from Alertmanager, where each shard's alert carries what it did: ``remote_actions``).  The
action that would exceed the limit trips the breaker; tripped, it refuses every action until ``reset`` (the
``fabricmon remediation reset`` command), which also forgets what was counted before it.  Undo never counts.

Persisted beside the open incidents (incident_store.save's ``remediation`` key) and loaded tolerantly: a
record that does not check out is skipped and logged; a ``remediation`` object that is not this format at all
starts the breaker TRIPPED (fail safe: an unreadable count must not let a burst through), with a log line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

log = structlog.get_logger("fabricmon.aggregator.remediation")

SCHEMA = 1


@dataclass
class NodeRecord:
    """What fabricmon did to one node (or, in a dry run, would have done)."""

    node: str
    at: float  # sample time of the action: the cooldown runs from here
    incident_id: str
    alertname: str
    component: str
    reason: str  # the text written to the scheduler ("fabricmon: ...")
    actions: list[str] = field(default_factory=list)  # those done (undo only these)
    dry_run: bool = False
    clean_since: float | None = None  # the node has had no open acted-on incident since then
    undone_at: float | None = None


@dataclass
class Breaker:
    limit: int
    window: float
    actions: list[tuple[float, str]] = field(default_factory=list)  # (sample time, node) of this shard's actions
    tripped_at: float | None = None
    tripped_reason: str = ""
    reset_at: float = 0.0

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None

    def count(self, now: float, remote: tuple[tuple[float, str], ...] = ()) -> int:
        """Distinct nodes acted on in the window since the last reset, here and in the other shards."""
        return len({n for t, n in (*self.actions, *remote) if t > now - self.window and t >= self.reset_at})

    def admit(self, now: float, node: str, remote: tuple[tuple[float, str], ...] = ()) -> bool:
        """Count an action on ``node`` at ``now``; False (and tripped) when it would exceed the limit."""
        if self.tripped:
            return False
        n = self.count(now, remote)
        if n + 1 > self.limit:
            self.tripped_at = now
            self.tripped_reason = (f"an action on {node} would be node {n + 1} in {self.window:g} s "
                                   f"(limit {self.limit})")
            return False
        self.actions.append((now, node))
        self.prune(now)
        return True

    def release(self, node: str, at: float) -> None:
        """An action that changed nothing (the node was already another's drain) counts for nothing."""
        self.actions = [(t, n) for t, n in self.actions if not (n == node and t == at)]

    def prune(self, now: float) -> None:
        self.actions = [(t, n) for t, n in self.actions if t > now - self.window]

    def reset(self, now: float) -> None:
        self.tripped_at, self.tripped_reason, self.reset_at = None, "", now
        self.actions = []


@dataclass
class RemediationState:
    breaker: Breaker
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    mode: str = "dry_run"  # the mode that wrote it: a dry run's counts are not an act's (load)

    def to_json(self) -> dict[str, Any]:
        b = self.breaker
        return {"schema": SCHEMA, "mode": self.mode,
                "breaker": {"actions": [[t, n] for t, n in b.actions], "tripped_at": b.tripped_at,
                            "tripped_reason": b.tripped_reason, "reset_at": b.reset_at},
                "nodes": [asdict(r) for r in self.nodes.values()]}


def _time(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_RECORD_TYPES: dict[str, tuple[Any, str]] = {
    "node": (lambda v: isinstance(v, str) and bool(v), "a node name"), "at": (_time, "a time"),
    "incident_id": (lambda v: isinstance(v, str), "a string"), "alertname": (lambda v: isinstance(v, str), "a string"),
    "component": (lambda v: isinstance(v, str), "a string"), "reason": (lambda v: isinstance(v, str), "a string"),
    "actions": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "dry_run": (lambda v: isinstance(v, bool), "true or false"),
    "clean_since": (lambda v: v is None or _time(v), "a time or null"),
    "undone_at": (lambda v: v is None or _time(v), "a time or null"),
}


def load(body: object, limit: int, window: float, source: str, mode: str = "dry_run") -> RemediationState:
    """The state persisted under the state file's ``remediation`` key (None: a first start).  Written by a
    dry run and read by ``mode: act`` (or the other way), the dry run's would-be actions are dropped and its
    breaker starts closed: they changed nothing; what an act did stays (its undo and cooldown still hold)."""
    state = RemediationState(Breaker(limit, window), mode=mode)
    if body is None:
        return state
    b = body.get("breaker") if isinstance(body, dict) else None
    acts = b.get("actions") if isinstance(b, dict) else None
    if not isinstance(body, dict) or body.get("schema") != SCHEMA or not isinstance(b, dict) \
            or not isinstance(acts, list) or not isinstance(body.get("nodes"), list) \
            or not (b.get("tripped_at") is None or _time(b.get("tripped_at"))) or not _time(b.get("reset_at", 0.0)):
        state.breaker.tripped_at = 0.0
        state.breaker.tripped_reason = "the persisted breaker state was unreadable"
        log.error("remediation_state_unusable", file=source, detail="the breaker starts tripped: reset it "
                  "(fabricmon remediation reset) once the nodes' state is checked")
        return state
    br = state.breaker
    br.tripped_at = b.get("tripped_at")
    br.tripped_reason = str(b.get("tripped_reason", ""))
    br.reset_at = float(b.get("reset_at", 0.0))
    br.actions = [(float(a[0]), a[1]) for a in acts
                  if isinstance(a, list) and len(a) == 2 and _time(a[0]) and isinstance(a[1], str)]
    for i, rec in enumerate(body["nodes"]):
        problem = None
        if not isinstance(rec, dict):
            problem = "expected an object"
        else:
            for k, (ok, what) in _RECORD_TYPES.items():
                if k not in rec or not ok(rec[k]):
                    problem = f"{k}: expected {what}"
                    break
        if problem is not None:
            log.error("remediation_state_record_skipped", file=source, error=f"remediation.nodes[{i}].{problem}")
            continue
        assert isinstance(rec, dict)
        r = NodeRecord(**{k: rec[k] for k in _RECORD_TYPES})
        state.nodes[r.node] = r
    if body.get("mode", mode) != mode:
        acted = {n for n, r in state.nodes.items() if not r.dry_run}
        state.nodes = {n: r for n, r in state.nodes.items() if not r.dry_run}
        if body.get("mode") == "dry_run":  # the dry run's count and trip were never real
            br.tripped_at, br.tripped_reason = None, ""
            br.actions = [(t, n) for t, n in br.actions if n in acted]
        log.info("remediation_mode_changed", file=source, was=body.get("mode"), now=mode,
                 kept_nodes=sorted(acted)[:32] or None)
    return state
