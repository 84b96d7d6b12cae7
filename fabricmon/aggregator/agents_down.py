"""Agents that stopped reporting: no batch for ``agent_down_s`` (or 5 intervals) of sample time."""

from __future__ import annotations

from collections.abc import Iterable

from .. import components as comp
from .config import DetectionSettings
from .state import NodeState
from .incidents import Finding


def agents_down(nodes: Iterable[NodeState], s: DetectionSettings, cluster: str, now: float) -> list[Finding]:
    out = []
    for ns in nodes:
        if ns.ever_seen and now - ns.last_ts >= max(s.agent_down_s, 5 * ns.interval):
            node = comp.node(ns.name)
            out.append(Finding("FabricmonAgentDown", node, node.labels(cluster),
                               [f"no batch since t={ns.last_ts:.0f} ({now - ns.last_ts:.0f}s)"
                                + ("" if ns.connected else ", stream disconnected")],
                               hold_s=0.0))
    return out
