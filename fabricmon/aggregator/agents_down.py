"""Agents that stopped reporting: no batch for ``agent_down_s`` (or 5 intervals) of the cluster clock,
measured from when the aggregator last heard from the node (``NodeState.last_heard``), not from the
node's own sample times: a node whose clock ran 250 s fast (inside ``clock.max_skew_s``) was named
down 250 s late (issue 35).

After the aggregator (or a shard) starts, every node gets a grace of ``max(60 s, 5 intervals)``:
its agents reconnect over seconds and first replay their spools, whose batches are older than the
cluster clock, so "no fresh batch" says nothing yet.  Without it a restarted shard paged
FabricmonAgentDown for hundreds of nodes that were only reconnecting.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import components as comp
from ..components import Component, Kind
from .config import DetectionSettings
from .incidents import Finding
from .state import NodeState
from .wording import at, secs

RESTART_GRACE_INTERVALS = 5


def restart_grace(s: DetectionSettings, interval: float) -> float:
    """Seconds (sample time) after the aggregator's start before a node can be called down
    (``detection.restart_grace_s``, default 60 s, or 5 of its intervals when longer)."""
    return max(s.restart_grace_s, RESTART_GRACE_INTERVALS * interval)


def agents_down(nodes: Iterable[NodeState], s: DetectionSettings, cluster: str, now: float,
                started_at: float | None = None) -> list[Finding]:
    """``started_at``: sample time of the aggregator's first tick (None: no grace)."""
    out = []
    for ns in nodes:
        if started_at is not None and now - started_at < restart_grace(s, ns.interval):
            continue
        if ns.ever_seen and now - ns.last_heard >= max(s.agent_down_s, 5 * ns.interval):
            node = comp.node(ns.name)
            out.append(Finding("FabricmonAgentDown", node, node.labels(cluster),
                               [f"no batch since {at(ns.last_heard)} ({secs(now - ns.last_heard)})"
                                + ("" if ns.connected else ", stream disconnected")],
                               hold_s=0.0))
    return out


UNKNOWN_LISTED = 20  # names in the description; the rest as "+K more" (an alert is read on a phone)


def unknown_nodes_finding(names: list[str], cluster: str) -> list[Finding]:
    """One ``FabricmonUnknownNodes`` per cluster while nodes stream that the topology does not know
    (not one page per node: they usually come from one stale topology file or one naming change)."""
    if not names:
        return []
    lab = {"cluster": cluster} if cluster else {}
    shown = ", ".join(names[:UNKNOWN_LISTED])
    more = f" (+{len(names) - UNKNOWN_LISTED} more)" if len(names) > UNKNOWN_LISTED else ""
    return [Finding("FabricmonUnknownNodes", Component(Kind.CONFIG, "topology"), lab,
                    [f"{len(names)} streaming node(s) not in the topology"],
                    description=f"{len(names)} node(s) stream to the aggregator but are not in its topology: "
                                f"{shown}{more}. They are monitored at node, NIC, link and GPU level, without "
                                f"rail or leaf; add them to the topology (fabricmon topology import) or fix the "
                                f"agents' --node-name.")]
