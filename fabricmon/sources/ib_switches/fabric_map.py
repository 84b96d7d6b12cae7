"""The switch map from ``ibnetdiscover`` output: every switch with its port-0 LID and, for each cabled
port, the far end of the cable.  Names by the topology import's rules (``topology_import.build.name_switches``,
``naming.ca_name``) and its node-name-map, so a switch here is called what the imported topology calls it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...topology_import.build import name_switches
from ...topology_import.ibnetdiscover import IbFabric
from ...topology_import.naming import CaKind, ca_name


@dataclass(frozen=True)
class Cable:
    """The far end of one switch port's cable."""

    peer: str  # switch name, or host name for a host's CA (``ca-<guid>`` when the CA names no host)
    peer_port: int
    peer_type: str  # switch | host
    peer_guid: int


@dataclass
class Switch:
    name: str
    guid: int
    lid: int
    nports: int
    cables: dict[int, Cable] = field(default_factory=dict)  # cabled ports only

    @property
    def guid_text(self) -> str:
        return f"0x{self.guid:016x}"


def switch_map(fabric: IbFabric, node_names: dict[int, str] | None = None) -> list[Switch]:
    """Switches in name order.  A switch without a LID (no subnet manager yet) is listed with lid 0: the
    sweeper cannot address it and counts it unreachable."""
    node_names = node_names or {}
    descriptions = {g: n.description for g, n in fabric.nodes.items()}
    descriptions.update({g: d for g, d in fabric.link_descriptions.items() if g not in descriptions})
    descriptions.update({g: n for g, n in node_names.items() if g in descriptions})
    kinds = dict(fabric.link_kinds)
    kinds.update({g: n.kind for g, n in fabric.nodes.items()})
    names = name_switches((g for g, k in kinds.items() if k == "switch"), descriptions, [])
    out: list[Switch] = []
    for guid, node in fabric.nodes.items():
        if node.kind != "switch":
            continue
        sw = Switch(names[guid], guid, node.lid or 0, node.nports)
        for port, p in sorted(node.ports.items()):
            kind = kinds.get(p.peer_guid, "ca")
            if kind == "switch":
                sw.cables[port] = Cable(names[p.peer_guid], p.peer_port, "switch", p.peer_guid)
                continue
            cn = ca_name(descriptions.get(p.peer_guid, ""))
            host = cn.host if cn.kind is CaKind.HOST and cn.host else f"ca-{p.peer_guid:016x}"
            sw.cables[port] = Cable(host, p.peer_port, "host", p.peer_guid)
        out.append(sw)
    return sorted(out, key=lambda s: s.name)


def merge_cables(new: list[Switch], old: list[Switch]) -> list[Switch]:
    """A cabled port that went down drops out of a fresh ibnetdiscover (it sees no link there), but its
    ``fabricmon_switch_port_up`` must stay, at 0: keep the cables the previous map knew."""
    before = {s.guid: s for s in old}
    for sw in new:
        prev = before.get(sw.guid)
        if prev is None:
            continue
        for port, cable in prev.cables.items():
            sw.cables.setdefault(port, cable)
    return new
