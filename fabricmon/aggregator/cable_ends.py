"""Both ends of the cable in a link or uplink incident's text.

A technician sent to "node-017/mlx5_3/1" still has to find the switch port at the other end; the
topology import keeps it (``leaf_port``, from ibnetdiscover), and an uplink's component carries its
spine end.  Findings that come without a description of their own get one line naming both ends
(``Cable: node-017 mlx5_3 port 1 <-> leaf-a3 port 17``); where the far port is not known (a generated
topology, an LLDP import without it) the line says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..components import Component, Kind
from ..topology import Topology
from .incidents import Finding


def cable_line(c: Component, topology: Topology) -> str:
    """``Cable: <host end> <-> <switch end>`` for a link or uplink; "" for anything else."""
    if c.kind is Kind.UPLINK:
        far = f"{c.spine} port {c.spine_port}" if c.spine and c.spine_port else (c.spine or "its spine (not known)")
        return f"Cable: {c.leaf} port {c.port} <-> {far}"
    if c.kind is not Kind.LINK:
        return ""
    spec = topology.nodes.get(c.node)
    nic = next((n for n in spec.nics if n.device == c.device), None) if spec is not None else None
    leaf = (nic.leaf if nic is not None else None) or c.leaf
    if not leaf:
        return ""
    port = f" port {nic.leaf_port}" if nic is not None and nic.leaf_port is not None else \
        " (port not known: import the topology from the fabric to name it)"
    return f"Cable: {c.node} {c.device} port {c.port} <-> {leaf}{port}"


def annotate(findings: Iterable[Finding], topology: Topology) -> None:
    """Give every link and uplink finding without a description its cable line."""
    for f in findings:
        if not f.description and f.component.kind in (Kind.LINK, Kind.UPLINK):
            f.description = cable_line(f.component, topology)
