"""One-screen summary of a loaded topology (``check-config --kind topology``) and what changed between two
(``fabricmon topology diff OLD NEW``).  Pure: Topology values in, lines out."""

from __future__ import annotations

from collections import Counter

from ..topology import NicSpec, Topology

EXAMPLES = 5


def _some(items: list[str]) -> str:
    more = f" and {len(items) - EXAMPLES} more" if len(items) > EXAMPLES else ""
    return ", ".join(items[:EXAMPLES]) + more


def _all_nics(topo: Topology, node: str) -> tuple[NicSpec, ...]:
    n = topo.nodes[node]
    return (*n.nics, *n.unbound)


def _leaf(topo: Topology, node: str, nic: NicSpec) -> str | None:
    if nic.leaf is not None:
        return nic.leaf
    return topo.leaf_of(node, nic.rail) if nic.rail is not None else None


def summarize(topo: Topology) -> list[str]:
    nodes = list(topo.nodes)
    nics = sum(len(_all_nics(topo, n)) for n in nodes)
    unbound = sum(len(topo.nodes[n].unbound) for n in nodes)
    leaves = topo.shape.leaves()
    per_leaf: Counter = Counter()
    nics_per_leaf: Counter = Counter()
    for n in nodes:
        on = set()
        for nic in _all_nics(topo, n):
            leaf = _leaf(topo, n, nic)
            if leaf is not None:
                on.add(leaf)
                nics_per_leaf[leaf] += 1
        for leaf in on:
            per_leaf[leaf] += 1
    form = {1: "generated/version 1", 2: "version 2 (imported)"}.get(topo.version, str(topo.version))
    lines = [f"cluster {topo.cluster}, layout {topo.layout}, {form}"]
    lines.append(f"nodes: {len(nodes)}, NICs: {nics}" + (f" ({unbound} known by GUID or netdev until the agents "
                                                          f"name their devices)" if unbound else ""))
    spine_names = sorted({s for leaf in leaves for s in topo.shape.spines_of(leaf)})
    lines.append(f"leaves: {len(leaves)}, spines: {len(spine_names) if topo.version >= 2 else topo.spines}, "
                 f"units (leaf groups): {len(topo.shape.units())}")
    rails = topo.shape.rails()
    if topo.rail_optimized and rails:
        lines.append(f"rails: {len(rails)} ({', '.join(str(r) for r in rails)})")
    else:
        lines.append("rails: not rail-optimized")
    if per_leaf:
        counts = sorted(per_leaf.values())
        dist = Counter(counts)
        shape = ", ".join(f"{k} nodes x{v}" for k, v in sorted(dist.items(), reverse=True)[:6])
        lines.append(f"nodes per leaf: min {counts[0]}, max {counts[-1]} ({shape})")
    odd: list[str] = []
    no_leaf = [n for n in nodes if not any(_leaf(topo, n, nic) for nic in _all_nics(topo, n))]
    if no_leaf:
        odd.append(f"{len(no_leaf)} nodes on no leaf: {_some(no_leaf)}")
    no_spine = [leaf for leaf in leaves if topo.version >= 2 and not topo.shape.spines_of(leaf)]
    if no_spine and topo.layout == "ib":
        odd.append(f"{len(no_spine)} leaves with no spine: {_some(no_spine)}")
    nic_counts = Counter(len(_all_nics(topo, n)) for n in nodes)
    if len(nic_counts) > 1:
        usual = nic_counts.most_common(1)[0][0]
        fewer = [n for n in nodes if len(_all_nics(topo, n)) != usual]
        odd.append(f"{len(fewer)} nodes without the usual {usual} NICs: {_some(fewer)}")
    if topo.rail_optimized and rails:
        for n in nodes:
            seen = [nic.rail for nic in _all_nics(topo, n) if nic.rail is not None]
            if len(seen) != len(set(seen)):
                odd.append(f"{n} has two NICs on one rail")
    lines.append("odd: " + ("; ".join(odd[:6]) if odd else "nothing"))
    return lines


def _nic_key(nic: NicSpec) -> str:
    return nic.node_guid or nic.device or nic.interface or "?"


def _nic_name(nic: NicSpec) -> str:
    return nic.device or nic.interface or nic.node_guid or "?"


def diff(old: Topology, new: Topology) -> list[str]:
    """What changed from ``old`` to ``new``, one line per change (empty: the same fabric)."""
    out: list[str] = []
    gone = [n for n in old.nodes if n not in new.nodes]
    came = [n for n in new.nodes if n not in old.nodes]
    if gone:
        out.append(f"- {len(gone)} nodes gone: {_some(gone)}")
    if came:
        out.append(f"+ {len(came)} nodes new: {_some(came)}")
    old_leaves, new_leaves = set(old.shape.leaves()), set(new.shape.leaves())
    if old_leaves - new_leaves:
        out.append(f"- leaves gone: {_some(sorted(old_leaves - new_leaves))}")
    if new_leaves - old_leaves:
        out.append(f"+ leaves new: {_some(sorted(new_leaves - old_leaves))}")
    for leaf in sorted(old_leaves & new_leaves):
        was, now = set(old.shape.spines_of(leaf)), set(new.shape.spines_of(leaf))
        if was != now:
            parts = ([f"lost {', '.join(sorted(was - now))}"] if was - now else []) + (
                [f"gained {', '.join(sorted(now - was))}"] if now - was else [])
            out.append(f"~ {leaf}: spines {'; '.join(parts)}")
    for node in (n for n in old.nodes if n in new.nodes):
        before = {_nic_key(c): c for c in _all_nics(old, node)}
        after = {_nic_key(c): c for c in _all_nics(new, node)}
        for key in before.keys() - after.keys():
            out.append(f"- {node}/{_nic_name(before[key])}: NIC gone (was on {_leaf(old, node, before[key])})")
        for key in after.keys() - before.keys():
            out.append(f"+ {node}/{_nic_name(after[key])}: NIC new on {_leaf(new, node, after[key])}")
        for key in before.keys() & after.keys():
            a, b = before[key], after[key]
            la, lb = _leaf(old, node, a), _leaf(new, node, b)
            if la != lb:
                out.append(f"~ {node}/{_nic_name(b)}: leaf {la} -> {lb}")
            if a.rail != b.rail:
                out.append(f"~ {node}/{_nic_name(b)}: rail {a.rail} -> {b.rail}")
            if a.device != b.device and a.device and b.device:
                out.append(f"~ {node}/{_nic_name(b)}: device {a.device} -> {b.device}")
    if old.rail_optimized != new.rail_optimized:
        out.append(f"~ rail_optimized: {old.rail_optimized} -> {new.rail_optimized}")
    return out
