"""Config drift: rail NICs failing the lossless profile checks, per NIC or per node."""

from __future__ import annotations

from .. import components as comp
from .config import DetectionSettings
from .incidents import Finding
from .state import NodeState


def config_drift(nodes: dict[str, NodeState], config_nodes: set[str], s: DetectionSettings, cluster: str,
                 now: float) -> list[Finding]:
    """Findings for the nodes in ``config_nodes``; a node with no failing check leaves that set."""
    out: list[Finding] = []
    for name in list(config_nodes):
        ns = nodes[name]
        bad: dict[str, list[str]] = {}
        pending = False
        for dev, fails in ns.config_fail.items():
            if not fails:
                continue
            pending = True
            ready = sorted(c for c, since in fails.items() if now - since >= s.config_persist_s)
            if ready:
                bad[dev] = ready
        if not pending:
            config_nodes.discard(name)
            continue
        if not bad:
            continue
        # the node's rail NICs (a frontend NIC has no rail and no lossless profile to drift from)
        rail_devs = [d for (d, _p), link in ns.links.items() if link is not None and link.rail is not None]
        if len(rail_devs) >= 2 and all(d in bad for d in rail_devs):
            checks = sorted({c for v in bad.values() for c in v})
            on_node = comp.config(name)
            out.append(Finding("FabricConfigDrift", on_node, on_node.labels(cluster),
                               [f"all {len(rail_devs)} rail NICs fail: {', '.join(checks)}"],
                               hold_s=s.state_hold_s))
            continue
        for dev, checks in sorted(bad.items()):
            link = ns.by_device.get(dev)
            on_nic = comp.config(name, dev)
            lab = on_nic.labels(cluster)
            if link is not None:  # the alert routes by the NIC's rail and leaf
                lab.update(link.labels)
            out.append(Finding("FabricConfigDrift", on_nic, lab,
                               [f"{dev} fails lossless profile checks: {', '.join(checks)}"],
                               hold_s=s.state_hold_s))
    return out
