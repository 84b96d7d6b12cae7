"""What to do about one incident: a pure decision, no I/O (the executor acts on it).

Checked in this order, each refusal one result of ``fabricmon_remediation_actions_total``:
an alert that is not acted on (no decision at all: a straggler or a config finding is no candidate),
a fabric-wide fault or a component that is not on one node (``not_node_local``: a leaf, spine, rail or
uplink fault is for a human), a node another shard owns (no decision: the owner decides), an excluded node
(``excluded``), a node with an action in flight or already out of service by fabricmon (no decision), the
per-node cooldown since the last action (``cooldown``), the breaker (``breaker``), then ``dry_run`` or the
action.  Reasons carry the prefix every undo checks: fabricmon resumes only what says it is fabricmon's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...components import Kind
from .breaker import RemediationState
from .config import WIDE_ALERTS, RemediationSettings

REASON_PREFIX = "fabricmon: "
# components that live on one node: a link or NIC of its HCA, a GPU, an NVLink, the node itself
NODE_LOCAL = frozenset({Kind.LINK, Kind.NIC, Kind.GPU, Kind.NVLINK, Kind.NODE})
RESULTS = ("done", "dry_run", "breaker", "cooldown", "excluded", "not_node_local", "foreign_drain", "failed")


@dataclass(frozen=True, slots=True)
class Candidate:
    """The part of an open incident a decision reads."""

    incident_id: str
    alertname: str
    kind: Kind
    component: str
    node: str  # "" when the component is on no single node


@dataclass(frozen=True, slots=True)
class Decision:
    candidate: Candidate
    result: str  # one of RESULTS, or "act" (handed to the executor)
    actions: tuple[str, ...]
    reason: str  # what the scheduler is told (act, dry_run)
    detail: str  # what an operator reads: why this result

    @property
    def node(self) -> str:
        return self.candidate.node


def reason_for(c: Candidate) -> str:
    """``fabricmon: FabricLinkDown node-017/mlx5_3/1 3f2a...`` (DESIGN "Acting on faults")."""
    return f"{REASON_PREFIX}{c.alertname} {c.component} {c.incident_id}"


def decide(c: Candidate, s: RemediationSettings, state: RemediationState, now: float, *, in_flight: frozenset[str],
           owns: Callable[[str], bool], remote: tuple[tuple[float, str], ...] = ()) -> Decision | None:
    """The decision about candidate ``c`` at sample time ``now``, or None when there is none to make.
    Admitting an action counts it in ``state.breaker`` (the only change this makes)."""
    table = s.alert_actions()
    if c.alertname not in table and c.alertname not in WIDE_ALERTS:
        return None
    acts = table.get(c.alertname, ())
    if c.alertname in WIDE_ALERTS or c.kind not in NODE_LOCAL or not c.node:
        return Decision(c, "not_node_local", acts, "", f"{c.kind.value} {c.component} is not on one node: "
                        "a fault there is for a human")
    if not owns(c.node):
        return None
    if s.excluded(c.node):
        return Decision(c, "excluded", acts, "", f"{c.node} matches remediation.exclude")
    rec = state.nodes.get(c.node)
    if c.node in in_flight or (rec is not None and rec.undone_at is None and rec.incident_id == c.incident_id):
        return None
    if rec is not None and rec.undone_at is None:
        return None  # fabricmon already has the node out of service for another incident: its undo waits on both
    if rec is not None and now - rec.at < s.cooldown:
        return Decision(c, "cooldown", acts, "", f"{c.node} was acted on {now - rec.at:.0f} s ago "
                        f"(cooldown {s.cooldown:g} s)")
    if not state.breaker.admit(now, c.node, remote):
        return Decision(c, "breaker", acts, "", f"circuit breaker tripped: {state.breaker.tripped_reason}; "
                        "reset with `fabricmon remediation reset`")
    result = "dry_run" if s.mode == "dry_run" else "act"
    verb = "would run" if result == "dry_run" else "runs"
    return Decision(c, result, acts, reason_for(c), f"{verb} {', '.join(acts)} on {c.node}")


def undo_due(state: RemediationState, open_nodes: frozenset[str], now: float, undo_after: float) -> list[str]:
    """Nodes fabricmon took out of service whose incidents resolved and that stayed clean for ``undo_after``.
    Updates each record's ``clean_since`` (a node with an open acted-on incident is not clean)."""
    due = []
    for node, rec in state.nodes.items():
        if rec.undone_at is not None or rec.dry_run:
            continue
        if node in open_nodes:
            rec.clean_since = None
            continue
        if rec.clean_since is None:
            rec.clean_since = now
        if now - rec.clean_since >= undo_after:
            due.append(node)
    return due
