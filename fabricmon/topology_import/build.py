"""From parsed fabrics to the explicit topology: hosts and their NICs, leaves, spines, rails.

Pure: records in, an ``Imported`` out (the YAML writer is ``render``).  The rules are DESIGN.md's
"Topology from the fabric"; what they cannot decide is reported in ``Imported.notes`` (one line
each) rather than guessed silently.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..components import SWITCH_PORT_NAME
from ..textcheck import node_name_problem
from .ibnetdiscover import IbFabric
from .lldp import LldpNeighbor
from .naming import CaKind, CaName, ca_name, component_safe, short_host, switch_name

# Rail-optimized when at least this share of the multi-NIC nodes has every NIC on its own leaf and
# its own rail: one miscabled node does not turn a rail-optimized cluster into a fat tree (it is
# listed among the notes instead).
RAIL_CONSISTENT_SHARE = 0.9
NOTE_EXAMPLES = 5


@dataclass
class Nic:
    host: str
    leaf: str
    port: int = 1
    device: str | None = None
    label: str | None = None  # second word of the description (mlx5_3, HCA-1) or the netdev
    node_guid: int | None = None
    interface: str | None = None
    rail: int | None = None
    source: str = ""  # file the link came from, for notes
    leaf_port: int | str | None = None  # the leaf's port this NIC's cable ends on: a number (IB) or a name (LLDP)


@dataclass
class Imported:
    layout: str  # ib | roce
    nodes: dict[str, list[Nic]] = field(default_factory=dict)
    leaves: dict[str, list[str]] = field(default_factory=dict)  # leaf -> spines
    rail_optimized: bool = False
    skipped_firmware_default: list[tuple[int, str]] = field(default_factory=list)  # (guid, description)
    switches: dict[str, int] = field(default_factory=dict)  # every switch's name -> GUID (InfiniBand)
    notes: list[str] = field(default_factory=list)


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """mlx5_2 before mlx5_10, HCA-2 before HCA-10."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(text))


def nic_order(nic: Nic) -> tuple:
    return (natural_key(nic.device or nic.label or nic.interface or ""), nic.port, nic.node_guid or 0)


def _examples(items: Iterable[str]) -> str:
    items = list(items)
    more = f" and {len(items) - NOTE_EXAMPLES} more" if len(items) > NOTE_EXAMPLES else ""
    return ", ".join(items[:NOTE_EXAMPLES]) + more


# ------------------------------------------------------------------ InfiniBand


def name_switches(guids: Iterable[int], descriptions: dict[int, str], notes: list[str]) -> dict[int, str]:
    """Switch names by the naming rules, unique: a second switch with the same description gets its GUID
    appended (in GUID order, so every reader of the same fabric names it alike: the import and the
    agent's switch sweep).  ``descriptions`` already carry the node-name-map's names."""
    switch_names: dict[int, str] = {}
    used: dict[str, int] = {}
    for guid in sorted(guids):
        name, _ = switch_name(descriptions.get(guid, ""), guid)
        if (why := node_name_problem(name)) is not None:  # the loader's rule: a control or bidi character
            notes.append(f"switch 0x{guid:016x}: its description {descriptions.get(guid, '')[:80]!a} gives "
                         f"the name {name[:80]!a}, which {why}; named switch-{guid:016x}")
            name = f"switch-{guid:016x}"
        if name in used:
            notes.append(f"switches 0x{used[name]:016x} and 0x{guid:016x} share the name {name!r}; "
                         f"the second is {name}-{guid:016x}")
            name = f"{name}-{guid:016x}"
        used[name] = guid
        switch_names[guid] = name
    return switch_names


def import_ibnetdiscover(fabrics: list[tuple[str, IbFabric]], *, node_names: dict[int, str] | None = None,
                         keep_domain: bool = False) -> Imported:
    """Merge one or more ibnetdiscover outputs (one per subnet or plane) by GUID and by host."""
    node_names = node_names or {}
    out = Imported(layout="ib")
    kinds: dict[int, str] = {}
    descriptions: dict[int, str] = {}
    edges: dict[tuple[int, int], tuple[int, int, str]] = {}  # (guid, port) -> (peer guid, peer port, file)
    for source, fabric in fabrics:
        for guid, kind in fabric.link_kinds.items():
            kinds.setdefault(guid, kind)
        for guid, desc in fabric.link_descriptions.items():
            descriptions.setdefault(guid, desc)
        for node in fabric.nodes.values():
            kinds[node.guid] = node.kind
            descriptions[node.guid] = node.description  # the node's own record wins over link lines
            for p in node.ports.values():
                for a, b in (((node.guid, p.port), (p.peer_guid, p.peer_port)),
                             ((p.peer_guid, p.peer_port), (node.guid, p.port))):
                    seen = edges.get(a)
                    if seen is not None and seen[:2] != b:
                        out.notes.append(f"{source}: port {a[1]} of 0x{a[0]:016x} links to 0x{b[0]:016x}[{b[1]}] "
                                         f"but {seen[2]} says 0x{seen[0]:016x}[{seen[1]}]; kept the first")
                        continue
                    edges.setdefault(a, (*b, source))
    for guid, name in node_names.items():
        if guid in descriptions:
            descriptions[guid] = name

    switch_names = name_switches((g for g, k in kinds.items() if k == "switch"), descriptions, out.notes)
    out.switches = {name: guid for guid, name in sorted(switch_names.items(), key=lambda kv: natural_key(kv[1]))}

    # Host CA ports: NICs on the switch they link to.
    cas: dict[int, CaName] = {}
    for guid, node_kind in kinds.items():
        if node_kind != "ca":
            continue
        cn = ca_name(descriptions.get(guid, ""), keep_domain=keep_domain)
        if cn.kind is CaKind.HOST and (why := node_name_problem(cn.host)) is not None:
            # the node name rule every topology file is held to (textcheck): a U+202E here named a node
            # that renders as another in a page; skipped and said, as the operator can name it
            out.notes.append(f"CA 0x{guid:016x}: its description {descriptions.get(guid, '')[:80]!a} gives the "
                             f"node name {str(cn.host)[:80]!a}, which {why}; skipped (name it in --node-name-map)")
            cn = CaName(CaKind.BAD_NAME)
        cas[guid] = cn
        if cn.kind is CaKind.FIRMWARE_DEFAULT:
            out.skipped_firmware_default.append((guid, descriptions.get(guid, "")))
    nics_by_key: dict[tuple[int, int], Nic] = {}
    switch_links: dict[int, set[int]] = defaultdict(set)
    for (guid, port), (peer, peer_port, source) in edges.items():
        own_kind, peer_kind = kinds.get(guid), kinds.get(peer)
        if own_kind == "switch" and peer_kind == "switch":
            switch_links[guid].add(peer)
        if own_kind != "ca" or peer_kind != "switch":
            continue
        cn = cas[guid]
        if cn.kind is not CaKind.HOST or cn.host is None:
            continue
        nics_by_key[(guid, port)] = Nic(host=cn.host, leaf=switch_names[peer], port=port, device=cn.device,
                                        label=cn.label, node_guid=guid, source=source, leaf_port=peer_port)
    for nic in nics_by_key.values():
        out.nodes.setdefault(nic.host, []).append(nic)
    _check_duplicate_devices(out)

    leaf_guids = {g for g, n in switch_names.items() if n in {nic.leaf for nic in nics_by_key.values()}}
    for guid in sorted(leaf_guids, key=lambda g: natural_key(switch_names[g])):
        spines = sorted({switch_names[p] for p in switch_links.get(guid, ()) if p not in leaf_guids}, key=natural_key)
        out.leaves[switch_names[guid]] = spines
    leaf_to_leaf = sorted({switch_names[g] for g in leaf_guids if switch_links.get(g, set()) & leaf_guids},
                          key=natural_key)
    if leaf_to_leaf:
        out.notes.append(f"{len(leaf_to_leaf)} leaves link to other leaves directly: {_examples(leaf_to_leaf)}")
    if out.skipped_firmware_default:
        by_desc = Counter(" ".join(d.split()) or "(empty)" for _, d in out.skipped_firmware_default)
        common = ", ".join(f"{d!r} x{n}" for d, n in by_desc.most_common(3))
        out.notes.insert(0, f"skipped {len(out.skipped_firmware_default)} CAs whose description is a firmware "
                            f"default (no host name: run rdma-ndd on them or give --node-name-map): {common}")
    _finish(out)
    return out


def _check_duplicate_devices(out: Imported) -> None:
    for host, nics in out.nodes.items():
        seen: dict[tuple[str, int], Nic] = {}
        for nic in nics:
            if nic.device is None:
                continue
            key = (nic.device, nic.port)
            if key in seen and seen[key].node_guid != nic.node_guid:
                out.notes.append(f"{host}: two CAs (0x{seen[key].node_guid or 0:016x}, 0x{nic.node_guid or 0:016x}) "
                                 f"both call themselves {nic.device}; the second is matched by GUID only")
                nic.device = None
            else:
                seen[key] = nic


# ------------------------------------------------------------------ LLDP (RoCE)
_MAC = re.compile(r"[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}")


def switch_port_of(n: LldpNeighbor) -> str | None:
    """The switch's port name at the cable's far end: the port ID when the switch sends its interface name
    there (SONiC, Cumulus, EOS: ``Ethernet0``, ``swp12``, ``Ethernet1/1``), else the port description when
    that is one; None when neither is a name (a MAC address port ID and a free-text description)."""
    for text in (n.port_id, n.port_descr):
        if text and SWITCH_PORT_NAME.fullmatch(text) and not _MAC.fullmatch(text) and not text.isdigit():
            return text
    return None



def import_lldp(per_node: dict[str, list[LldpNeighbor]], *, keep_domain: bool = False) -> Imported:
    """One node's neighbors per file.  A neighbor that advertises the Bridge or Router capability (or none
    at all) is a switch; a file named after a switch is that switch's own capture and gives its spines."""
    out = Imported(layout="roce")

    def name(text: str) -> str:
        return component_safe(text if keep_domain else short_host(text))

    def leaf_name(n: LldpNeighbor) -> str:
        if n.chassis_name and node_name_problem(name(n.chassis_name)) is None:
            return name(n.chassis_name)
        ident = "".join(c for c in (n.chassis_id or "").lower() if c in "0123456789abcdefghijklmnopqrstuvwxyz")
        return f"switch-{ident[:64] or 'unknown'}"

    files: dict[str, list[LldpNeighbor]] = {}
    for node, neighbors in per_node.items():
        if (why := node_name_problem(name(node))) is not None:
            out.notes.append(f"{node[:80]!a}: the node name {name(node)[:80]!a} {why}; skipped")
            continue
        files.setdefault(name(node), []).extend(neighbors)
    switches = {leaf_name(n) for ns in files.values() for n in ns if n.is_switch is not False}
    hosts = {leaf_name(n) for ns in files.values() for n in ns if n.is_switch is False}
    host_files = {f for f in files if f not in switches}
    for host in sorted(host_files, key=natural_key):
        for n in files[host]:
            leaf = leaf_name(n)
            if leaf not in switches:
                out.notes.append(f"{host}: {n.interface} sees {leaf}, which advertises no switch capability; skipped")
                continue
            out.nodes.setdefault(host, []).append(Nic(host=host, leaf=leaf, interface=n.interface, label=n.interface,
                                                      leaf_port=switch_port_of(n)))
    used_leaves = {nic.leaf for nics in out.nodes.values() for nic in nics}
    for leaf in sorted(used_leaves, key=natural_key):
        spines = {leaf_name(n) for n in files.get(leaf, []) if n.is_switch is not False}
        out.leaves[leaf] = sorted(spines - used_leaves - hosts - host_files, key=natural_key)
    for h in sorted(host_files - set(out.nodes), key=natural_key):
        out.notes.append(f"{h}: no LLDP neighbor on any interface (lldpd not running, or no switch sends LLDP)")
    _finish(out)
    return out


# ------------------------------------------------------------------ rails


def _finish(out: Imported) -> None:
    for host in out.nodes:
        out.nodes[host].sort(key=nic_order)
    out.nodes = dict(sorted(out.nodes.items(), key=lambda kv: natural_key(kv[0])))
    out.rail_optimized = assign_rails(out)


def off_rail(nodes: dict[str, list[Nic]]) -> set[int]:
    """``id()`` of the NICs on a leaf no other multi-NIC node reaches (a storage or frontend switch of the
    node's own) while the same node has NICs on shared leaves: not rail NICs.  A node whose NICs are all
    on leaves of its own (the last, partly filled unit; a fat-tree leaf it has alone) keeps them."""
    reach: dict[str, set[str]] = defaultdict(set)
    multi = [h for h, nics in nodes.items() if len(nics) >= 2]
    for h in multi:
        for nic in nodes[h]:
            reach[nic.leaf].add(h)
    out: set[int] = set()
    for h in multi:
        lone = [n for n in nodes[h] if len(reach[n.leaf]) == 1]
        if lone and len(lone) < len(nodes[h]):
            out.update(id(n) for n in lone)
    return out


def assign_rails(out: Imported) -> bool:
    """Rail-optimized: the nodes' NIC i sit on leaves that only carry NIC i (the leaf's rail).  Each leaf's
    rail is the NIC index most of its complete nodes (those with the usual NIC count) put there; every
    NIC then takes its leaf's rail.  Otherwise (a fat tree: several NICs of a node on one leaf, or one
    NIC per node) every rail stays None.  A NIC on a leaf no other node's NICs share (storage, frontend:
    ``off_rail``) is on no rail and takes no index: the GPU NICs' indexes are counted without it."""
    off = off_rail(out.nodes)
    if off:
        lone = sorted((f"{n.host}/{n.device or n.label or n.interface}" for nics in out.nodes.values() for n in nics
                       if id(n) in off), key=natural_key)
        out.notes.append(f"{len(lone)} NICs are on a leaf no other node reaches (storage, frontend?): on no rail: "
                         f"{_examples(lone)}")
    nodes = {h: [n for n in nics if id(n) not in off] for h, nics in out.nodes.items()}
    counts = Counter(len(nics) for nics in nodes.values())
    if not counts:
        return False
    usual = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    if usual < 2:
        return False
    complete: dict[str, Counter] = defaultdict(Counter)
    anyone: dict[str, Counter] = defaultdict(Counter)
    for nics in nodes.values():
        for i, nic in enumerate(nics):
            anyone[nic.leaf][i] += 1
            if len(nics) == usual:
                complete[nic.leaf][i] += 1
    # A leaf only incomplete nodes reach (a NIC skipped as a firmware default shifts their indexes) takes
    # the rail its NICs' labels (HCA-6, mlx5_5) have on the complete nodes, else their own indexes.
    label_votes: dict[str, Counter] = defaultdict(Counter)
    for nics in nodes.values():
        if len(nics) == usual:
            for i, nic in enumerate(nics):
                if nic.label:
                    label_votes[nic.label][i] += 1
    leaf_rail: dict[str, int] = {}
    for leaf, c in anyone.items():
        if leaf in complete:
            leaf_rail[leaf] = complete[leaf].most_common(1)[0][0]
            continue
        by_label = Counter(label_votes[n.label].most_common(1)[0][0] for nics in nodes.values() for n in nics
                           if n.leaf == leaf and n.label in label_votes)
        leaf_rail[leaf] = (by_label or c).most_common(1)[0][0]
    multi = {h: nics for h, nics in nodes.items() if len(nics) >= 2}
    shared = [h for h, nics in multi.items() if len({n.leaf for n in nics}) < len(nics)]
    clash = [h for h, nics in multi.items() if h not in shared and len({leaf_rail[n.leaf] for n in nics}) < len(nics)]
    consistent = len(multi) - len(shared) - len(clash)
    if consistent < RAIL_CONSISTENT_SHARE * len(multi):
        if shared:
            out.notes.append(f"not rail-optimized: {len(shared)} of {len(multi)} multi-NIC nodes have several NICs on "
                             f"one leaf (a fat tree), e.g. {_examples(shared)}")
        else:
            out.notes.append(f"not rail-optimized: {len(clash)} of {len(multi)} multi-NIC nodes have two NICs on "
                             f"leaves of one rail, e.g. {_examples(clash)}")
        return False
    for nics in nodes.values():
        for nic in nics:
            nic.rail = leaf_rail[nic.leaf]
    if shared:
        out.notes.append(f"{len(shared)} nodes have several NICs on one leaf: {_examples(shared)}")
    if clash:
        out.notes.append(f"{len(clash)} nodes have two NICs on leaves of one rail (miscabled?): {_examples(clash)}")
    odd = sorted({f"{n.host}/{n.device or n.label or n.interface}" for nics in nodes.values() if len(nics) == usual
                  for i, n in enumerate(nics) if n.rail != i}, key=natural_key)
    if odd:
        out.notes.append(f"{len(odd)} NICs sit on a leaf of another rail than their index: {_examples(odd)}")
    return True
