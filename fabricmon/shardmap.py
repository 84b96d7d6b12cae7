"""Shards: which aggregator replica owns which scalable units, and where an agent streams.

A scalable unit is the shard's grain: its leaves (one per rail) and every node under
them go to one replica, so no leaf spans shards and the leaf/rail correlation stays
local.  The shard map (YAML) lists the replicas:

    topology: topology.yaml          # optional; relative to this file
    replicas:
      - {name: agg-0, address: "10.0.0.11:9721", units: [0, 1]}
      - {name: agg-1, address: "10.0.0.12:9721", units: [2, 3]}

Each replica runs with ``shard.units`` set to its own list.  ``check_ownership``
(``fabricmon check-config --kind shardmap``) refuses a map where a unit of the
topology has no owner or two.  Bare metal: an agent reads its target from the map
by its unit (``aggregator_for_unit``).  Kubernetes: the replicas are a StatefulSet
behind a headless Service, replica k owns units ``[k * units_per_shard, (k+1) *
units_per_shard)``, and an agent dials ``kubernetes_aggregator(unit, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .configload import ConfigError, check_hostport, load_yaml_file

STATEFULSET = "fabricmon-aggregator"
GRPC_PORT = 9721


@dataclass(frozen=True)
class Replica:
    name: str
    address: str
    units: tuple[int, ...]


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
        name, address, units = r.get("name"), r.get("address"), r.get("units")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: required, a non-empty string")
        if name in names:
            raise ConfigError(f"{where}.name: {name!r} appears twice")
        names.add(name)
        if not isinstance(address, str):
            raise ConfigError(f"{where}.address: required, HOST:PORT")
        check_hostport(address, f"replicas[{i}].address", src)
        if not isinstance(units, list) or not all(isinstance(u, int) and not isinstance(u, bool) and u >= 0
                                                  for u in units):
            raise ConfigError(f"{where}.units: expected a list of unit numbers (integers >= 0)")
        out.append(Replica(name, address, tuple(units)))
    topo = data.get("topology") or ""
    if topo and not Path(topo).is_absolute():
        topo = str(Path(path).parent / topo)
    return ShardMap(tuple(out), topo)


def ownership_problems(shards: ShardMap, units: list[int]) -> list[str]:
    """Every unit of the topology owned by exactly one replica; none owned that does not exist."""
    owners: dict[int, list[str]] = {}
    for r in shards.replicas:
        for u in r.units:
            owners.setdefault(u, []).append(r.name)
    known = set(units)
    problems = [f"unit {u}: owned by no replica" for u in sorted(known - owners.keys())]
    problems += [f"unit {u}: owned by {len(names)} replicas ({', '.join(names)}); a unit's leaves must stay "
                 f"in one shard" for u, names in sorted(owners.items()) if len(names) > 1]
    problems += [f"unit {u}: owned by {', '.join(owners[u])} but not in the topology"
                 for u in sorted(owners.keys() - known)]
    return problems


def check_ownership(shards: ShardMap, source: str, topology_path: str | None = None) -> None:
    """Raise ConfigError naming the first problem (and how many more)."""
    from .topology import load_topology

    path = topology_path or shards.topology
    if not path:
        raise ConfigError(f"{source}: topology: required to check unit ownership (key or --topology)")
    problems = ownership_problems(shards, load_topology(path).units())
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{source}: replicas: {problems[0]}{more}")


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
