"""Shards: which aggregator replica owns which scalable units, and where an agent streams.

A scalable unit (leaf group) is the shard's grain: its leaves (one per rail; a fat tree's
one leaf; an imported fabric's leaves that share nodes) and every node under them go to
one replica, so no leaf spans shards and the leaf/rail correlation stays local.  The
shard map (YAML) lists the replicas, by unit or, for an imported topology whose unit
numbers the import assigns, by leaf name (``leaves:``; naming one leaf of a group takes
the group whole):

    topology: topology.yaml          # optional; relative to this file
    replicas:
      - {name: agg-0, address: "10.0.0.11:9721", units: [0, 1]}
      - {name: agg-1, address: "10.0.0.12:9721", leaves: [leaf-a3, leaf-b0]}

Each replica runs with ``shard.units`` set to its own list.  ``check_ownership``
(``fabricmon check-config --kind shardmap``) refuses a map where a unit of the
topology has no owner or two.  Bare metal: an agent reads its target from the map
by its unit (``aggregator_for_unit``).  Kubernetes: the replicas are a StatefulSet
behind a headless Service, replica k owns units ``[k * units_per_shard, (k+1) *
units_per_shard)``, and an agent dials ``kubernetes_aggregator(unit, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .configload import ConfigError, check_hostport, load_yaml_file

if TYPE_CHECKING:
    from .topology import Topology

STATEFULSET = "fabricmon-aggregator"
GRPC_PORT = 9721


@dataclass(frozen=True)
class Replica:
    name: str
    address: str
    units: tuple[int, ...]
    leaves: tuple[str, ...] = ()  # leaf names, placed in units by ``resolve_leaves``


@dataclass(frozen=True)
class ShardMap:
    replicas: tuple[Replica, ...]
    topology: str = ""

    def owner_of(self, unit: int) -> Replica | None:
        return next((r for r in self.replicas if unit in r.units), None)


def load_shard_map(path: str | Path) -> ShardMap:
    data = load_yaml_file(path)
    src = str(path)
    reps = data.get("replicas")
    if not isinstance(reps, list) or not reps:
        raise ConfigError(f"{src}: replicas: required, a non-empty list")
    out: list[Replica] = []
    names: set[str] = set()
    for i, r in enumerate(reps):
        where = f"{src}: replicas[{i}]"
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: expected a mapping with name, address, units")
        name, address, units, leaves = r.get("name"), r.get("address"), r.get("units"), r.get("leaves")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: required, a non-empty string")
        if name in names:
            raise ConfigError(f"{where}.name: {name!r} appears twice")
        names.add(name)
        if not isinstance(address, str):
            raise ConfigError(f"{where}.address: required, HOST:PORT")
        check_hostport(address, f"replicas[{i}].address", src)
        if leaves is not None:
            if units is not None:
                raise ConfigError(f"{where}.leaves: give units or leaves, not both")
            if not isinstance(leaves, list) or not all(isinstance(x, str) and x.strip() and "/" not in x
                                                       for x in leaves):
                raise ConfigError(f"{where}.leaves: expected a list of leaf names (no '/')")
            out.append(Replica(name, address, (), tuple(leaves)))
            continue
        if not isinstance(units, list) or not all(isinstance(u, int) and not isinstance(u, bool) and u >= 0
                                                  for u in units):
            raise ConfigError(f"{where}.units: expected a list of unit numbers (integers >= 0), or leaves: "
                              f"a list of leaf names")
        out.append(Replica(name, address, tuple(units)))
    topo = data.get("topology") or ""
    if topo and not Path(topo).is_absolute():
        topo = str(Path(path).parent / topo)
    return ShardMap(tuple(out), topo)


def uses_leaves(shards: ShardMap) -> bool:
    return any(r.leaves for r in shards.replicas)


def resolve_leaves(shards: ShardMap, topo: Topology, source: str) -> ShardMap:
    """The map with every replica's ``leaves`` placed in the topology's units (leaf groups): what
    ``owner_of`` reads.  ConfigError naming the replica for a leaf the topology does not have."""
    if not uses_leaves(shards):
        return shards
    reps = tuple(replace(r, units=topo.shape.units_of_leaves(r.leaves, f"{source}: replicas[{i}].leaves"))
                 if r.leaves else r for i, r in enumerate(shards.replicas))
    return replace(shards, replicas=reps)


def _group(u: int, groups: dict[int, list[str]]) -> str:
    leaves = groups.get(u, [])
    few = ", ".join(leaves[:4]) + (f" +{len(leaves) - 4}" if len(leaves) > 4 else "")
    return f"unit {u} ({few})" if leaves else f"unit {u}"


def ownership_problems(shards: ShardMap, units: list[int], groups: dict[int, list[str]] | None = None) -> list[str]:
    """Every unit of the topology owned by exactly one replica; none owned that does not exist.
    ``groups``: unit -> its leaves, to name them."""
    g = groups or {}
    owners: dict[int, list[str]] = {}
    for r in shards.replicas:
        for u in r.units:
            owners.setdefault(u, []).append(r.name)
    known = set(units)
    problems = [f"{_group(u, g)}: owned by no replica" for u in sorted(known - owners.keys())]
    problems += [f"{_group(u, g)}: owned by {len(names)} replicas ({', '.join(names)}); a unit's leaves must stay "
                 f"in one shard" for u, names in sorted(owners.items()) if len(names) > 1]
    problems += [f"unit {u}: owned by {', '.join(owners[u])} but not in the topology"
                 for u in sorted(owners.keys() - known)]
    return problems


def explain_ownership(shards: ShardMap, topo: Topology) -> list[str]:
    """One line per replica: the leaf groups it owns, their leaves and nodes (``check-config``), and
    where a replica named only some leaves of a group, which others it takes with them."""
    groups = topo.shape.leaf_groups()
    nodes: dict[int, int] = {}
    for spec in topo.nodes.values():
        nodes[spec.unit] = nodes.get(spec.unit, 0) + 1
    lines = []
    for r in shards.replicas:
        owned = sorted(set(r.units))
        n = sum(nodes.get(u, 0) for u in owned)
        parts = [_group(u, groups) for u in owned[:6]] + ([f"+{len(owned) - 6} more"] if len(owned) > 6 else [])
        lines.append(f"{r.name} ({r.address}): {len(owned)} leaf group(s), {n} nodes: {'; '.join(parts) or 'none'}")
        if r.leaves:
            named = set(r.leaves)
            extra = [leaf for u in owned for leaf in groups.get(u, []) if leaf not in named]
            if extra:
                lines.append(f"  {r.name} also owns {', '.join(extra[:6])}{' ...' if len(extra) > 6 else ''}: "
                             f"they share nodes with the leaves it names (a leaf group is owned whole)")
    return lines


def check_ownership(shards: ShardMap, source: str, topology_path: str | None = None) -> list[str]:
    """Raise ConfigError naming the first problem (and how many more); else the ownership explained."""
    from .topology import load_topology

    path = topology_path or shards.topology
    if not path:
        raise ConfigError(f"{source}: topology: required to check unit ownership (key or --topology)")
    topo = load_topology(path)
    shards = resolve_leaves(shards, topo, source)
    # an imported topology's unit numbers are the import's: name their leaves (a generated unit is its number)
    problems = ownership_problems(shards, topo.shape.units(), topo.shape.leaf_groups() if topo.version >= 2 else None)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{source}: replicas: {problems[0]}{more}")
    return explain_ownership(shards, topo)


def aggregator_for_unit(shards: ShardMap, unit: int, source: str = "shard map") -> str:
    """Bare metal: the address of the replica that owns ``unit``."""
    r = shards.owner_of(unit)
    if r is None:
        raise ConfigError(f"{source}: replicas: unit {unit} is owned by no replica")
    return r.address


def kubernetes_aggregator(unit: int, units_per_shard: int, namespace: str, port: int = GRPC_PORT) -> str:
    """Kubernetes: the stable name of the StatefulSet replica that owns ``unit``."""
    if units_per_shard < 1:
        raise ValueError(f"units_per_shard must be >= 1, got {units_per_shard}")
    if unit < 0:
        raise ValueError(f"unit must be >= 0, got {unit}")
    shard = unit // units_per_shard
    return f"{STATEFULSET}-{shard}.{STATEFULSET}.{namespace}.svc:{port}"


def units_of_ordinal(ordinal: int, units_per_shard: int) -> tuple[int, ...]:
    """The units StatefulSet replica ``ordinal`` owns (its ``shard.units``)."""
    return tuple(range(ordinal * units_per_shard, (ordinal + 1) * units_per_shard))
