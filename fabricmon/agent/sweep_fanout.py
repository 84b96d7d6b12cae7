"""Sharded aggregators and the switch sweep: the sweeper streams to every replica.

A node's own series go to the one replica that owns its unit (shard_target.py).  The switch sweep's series
(sources.ib_switches) are the whole plane's: each replica keeps the switch ports whose component it owns
(an uplink by its leaf, a host cable by its host: aggregator/switch_side.py), so the sweeper sends the same
batches to every replica, each stream with its own spool (``<stream.spool_dir>/<replica>``): one replica
down spools for that replica only.

The replicas: every one in ``shard.map``; with ``shard.kubernetes`` the StatefulSet ordinals that own the
units of ``shard.topology`` (the replica count is not otherwise known to an agent), so there it is
required."""

from __future__ import annotations

from ..config import ShardConfig
from ..configload import ConfigError
from ..shardmap import STATEFULSET, kubernetes_aggregator
from .shard_target import Replicas, Target

VIA = "switch_sweep"


def every_replica(replicas: Replicas, sel: ShardConfig, source: str) -> list[Target]:
    """Every replica's target, in map (or ordinal) order.  Raises ConfigError when they cannot be known."""
    if replicas.shard_map is not None:
        return [Target(None, r.name, r.address, VIA) for r in replicas.shard_map.replicas]
    k = sel.kubernetes
    assert k is not None  # ShardConfig.validate: map or kubernetes
    if not sel.topology:
        raise ConfigError(f"{source}: shard.topology: required with shard.kubernetes when sources.ib_switches is "
                          f"enabled: the switch sweep streams to every replica, and the topology's units say "
                          f"how many there are")
    from ..topology import load_topology

    try:
        topo = load_topology(sel.topology)
    except ConfigError as exc:
        raise ConfigError(f"{source}: shard.topology: {exc}") from None
    ordinals = sorted({spec.unit // k.units_per_shard for spec in topo.nodes.values()})
    return [Target(None, f"{STATEFULSET}-{o}",
                   kubernetes_aggregator(o * k.units_per_shard, k.units_per_shard, k.namespace, k.port), VIA)
            for o in ordinals]
