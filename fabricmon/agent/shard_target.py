"""Which aggregator replica this agent streams to, from its unit (config ``shard:``).

The unit comes from, first that answers: ``shard.unit`` (--unit, $FABRICMON_UNIT), the
node's entry in ``shard.topology``, the node's Kubernetes label (``shard.node_label``).
The first two are known at start: a node without a unit, a unit no replica owns, or a
bad file is a config error (exit 2, and ``check-config`` says the same).  The label is
read at run time: while the API server does not answer, ``ShardTarget`` logs, retries
with backoff and reports why on /readyz; the agent keeps polling and exporting.

Once the unit is known the stream starts towards its owner, once: a changed ``shard:``
section needs a restart (``Agent.reload`` refuses it as it refuses a changed aggregator).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..config import ShardConfig, parse_unit
from ..configload import ConfigError
from ..shardmap import STATEFULSET, ShardMap, kubernetes_aggregator, load_shard_map, resolve_leaves, uses_leaves
from .kube_node import NodeLabelError, in_cluster_api_server, read_node_label

log = structlog.get_logger("fabricmon.agent")


@dataclass(frozen=True)
class Target:
    unit: int | None  # None: the node is not in shard.topology (streams to shard.unknown_owner)
    replica: str
    address: str
    via: str  # how the unit was found: unit, topology, node_label


@dataclass(frozen=True)
class Replicas:
    """Unit -> replica, from a shard map or the StatefulSet's naming rule."""

    sel: ShardConfig
    shard_map: ShardMap | None

    def target(self, unit: int, via: str) -> Target:
        """Raises LookupError when no replica owns ``unit``."""
        if self.shard_map is not None:
            r = self.shard_map.owner_of(unit)
            if r is None:
                raise LookupError(f"unit {unit} is owned by no replica of {self.sel.map}")
            return Target(unit, r.name, r.address, via)
        k = self.sel.kubernetes
        assert k is not None  # ShardConfig.validate: map or kubernetes
        return Target(unit, f"{STATEFULSET}-{unit // k.units_per_shard}",
                      kubernetes_aggregator(unit, k.units_per_shard, k.namespace, k.port), via)

    def unknown_owner(self) -> Target:
        """Where a node missing from the topology streams: replica ``shard.unknown_owner``."""
        k_owner = self.sel.unknown_owner
        if self.shard_map is not None:
            if k_owner >= len(self.shard_map.replicas):
                raise LookupError(f"unknown_owner {k_owner} is past the {len(self.shard_map.replicas)} replicas of "
                                  f"{self.sel.map}")
            r = self.shard_map.replicas[k_owner]
            return Target(None, r.name, r.address, "unknown_owner")
        k = self.sel.kubernetes
        assert k is not None
        return Target(None, f"{STATEFULSET}-{k_owner}",
                      kubernetes_aggregator(k_owner * k.units_per_shard, k.units_per_shard, k.namespace, k.port),
                      "unknown_owner")


def load_replicas(sel: ShardConfig, source: str) -> Replicas:
    if sel.map is None:
        return Replicas(sel, None)
    try:
        shards = load_shard_map(sel.map)
        if uses_leaves(shards):
            # replicas named by leaf (an imported topology): the same topology places the leaves in units,
            # as it does on the aggregator, so both sides agree which replica owns this node
            path = sel.topology or shards.topology
            if not path:
                raise ConfigError(f"{sel.map}: replicas: name leaves, so shard.topology (or the map's "
                                  f"topology:) must give the topology that places them")
            from ..topology import load_topology

            shards = resolve_leaves(shards, load_topology(path), sel.map)
        return Replicas(sel, shards)
    except ConfigError as exc:
        raise ConfigError(f"{source}: shard.map: {exc}") from None


def static_unit(sel: ShardConfig, node: str, source: str) -> tuple[int | None, str] | None:
    """(unit, via) when the config alone gives the unit, (None, "unknown_owner") for a node missing from
    ``shard.topology`` with no label to read; None when the node label must be read."""
    if sel.unit is not None:
        return sel.unit, "unit"
    if sel.topology:
        from ..topology import load_topology

        try:
            topo = load_topology(sel.topology)
        except ConfigError as exc:
            raise ConfigError(f"{source}: shard.topology: {exc}") from None
        if node in topo.nodes:
            return topo.unit_of(node), "topology"
        if sel.node_label is None:
            # not a start-up error: the node is still monitored, by the replica that takes unknown nodes
            log.warning("shard_node_not_in_topology", node=node, topology=sel.topology,
                        unknown_owner=sel.unknown_owner,
                        hint="check --node-name, give shard.unit, or re-import the topology")
            return None, "unknown_owner"
    return None


def resolve_static(sel: ShardConfig, node: str, source: str) -> tuple[Replicas, Target | None]:
    """Everything the config decides: the replicas, and the target when the unit is known without
    the API server.  Raises ConfigError (start-up and ``check-config --kind agent``)."""
    replicas = load_replicas(sel, source)
    found = static_unit(sel, node, source)
    if found is None:
        return replicas, None
    try:
        unit, via = found
        return replicas, (replicas.unknown_owner() if unit is None else replicas.target(unit, via))
    except LookupError as exc:
        key = {"unit": "shard.unit", "topology": "shard.topology", "unknown_owner": "shard.unknown_owner"}[found[1]]
        raise ConfigError(f"{source}: {key}: {exc}") from None


def label_lookup(sel: ShardConfig, node: str) -> Callable[[], int]:
    """Reads the node's unit from its label; raises NodeLabelError (with what to fix)."""
    nl = sel.node_label
    assert nl is not None

    def lookup() -> int:
        api = nl.api_server or in_cluster_api_server()
        value = read_node_label(api, node, nl.key, nl.token_file, nl.ca_file, nl.timeout)
        try:
            return parse_unit(value, f"Node {node!r} label {nl.key}")
        except ConfigError as exc:
            raise NodeLabelError(str(exc)) from None

    return lookup


class Stoppable(Protocol):
    """What ``start_stream`` returns (the stream client)."""

    def stop(self) -> object: ...


class ShardTarget:
    """Finds the target (at once, or by retrying the label lookup in a thread) and hands it to
    ``start_stream`` once.  Stops the stream it started, so a stop racing a late lookup leaves
    nothing running."""

    def __init__(self, node: str, replicas: Replicas, start_stream: Callable[[str], Stoppable], *,
                 target: Target | None = None, lookup: Callable[[], int] | None = None,
                 backoff: tuple[float, float] = (0.5, 30.0)) -> None:
        if target is None and lookup is None:
            raise ValueError("a target or a lookup")
        self.node = node
        self._replicas = replicas
        self._start_stream = start_stream
        self._lookup = lookup
        self._backoff = backoff
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.target: Target | None = None
        self.stream: Stoppable | None = None
        self.problem = "" if target is not None else "unit not looked up yet"
        self.failures_total = 0
        self._pending = target

    def start(self) -> ShardTarget:
        if self._pending is not None:
            self._use(self._pending)
        else:
            self._spawn()
        return self

    def _spawn(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shard-lookup", daemon=True)
        self._thread.start()

    def _use(self, target: Target) -> None:
        with self._lock:
            if self._stop.is_set() or self.target is not None:
                return
            self.stream = self._start_stream(target.address)
            self.target, self.problem = target, ""
        log.info("shard_target", node=self.node, unit=target.unit, replica=target.replica,
                 aggregator=target.address, via=target.via)

    def _run(self) -> None:
        assert self._lookup is not None
        lo, hi = self._backoff
        attempt = 0
        while not self._stop.is_set():
            try:
                target = self._replicas.target(self._lookup(), "node_label")
            except (NodeLabelError, LookupError) as exc:
                attempt += 1
                self.failures_total += 1
                self.problem = f"shard not resolved: {exc}"
                wait = min(hi, lo * 2 ** min(attempt - 1, 16))
                log.warning("shard_lookup_failed", node=self.node, error=str(exc), attempt=attempt,
                            retry_in_seconds=wait)
                self._stop.wait(wait)
                continue
            except Exception as exc:  # a bug here must not end the retries
                attempt += 1
                self.failures_total += 1
                self.problem = f"shard not resolved: {type(exc).__name__}: {exc}"
                log.error("shard_lookup_error", node=self.node, error=self.problem)
                self._stop.wait(hi)
                continue
            self._use(target)
            return

    def alive(self) -> bool:
        return self.target is not None or (self._thread is not None and self._thread.is_alive())

    def restart(self) -> None:
        if self.target is None and not self._stop.is_set():
            self._spawn()

    def not_ready(self) -> list[str]:
        return [self.problem] if self.target is None and self.problem else []

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            stream = self.stream
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if stream is not None:
            stream.stop()


class ShardCollector:
    """fabricmon_agent_shard_info{unit, replica, aggregator, via}: where this agent streams."""

    def __init__(self, shard: ShardTarget) -> None:
        self._shard = shard

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        s, node = self._shard, self._shard.node
        info = GaugeMetricFamily("fabricmon_agent_shard_info",
                                 "1 for the aggregator replica this agent streams to (its unit's owner).",
                                 labels=["node", "unit", "replica", "aggregator", "via"])
        t = s.target
        if t is not None:
            info.add_metric([node, "" if t.unit is None else str(t.unit), t.replica, t.address, t.via], 1.0)
        yield info
        resolved = GaugeMetricFamily("fabricmon_agent_shard_resolved",
                                     "1 once the agent knows its unit and replica; 0 while it looks it up.",
                                     labels=["node"])
        resolved.add_metric([node], 1.0 if t is not None else 0.0)
        yield resolved
        fails = CounterMetricFamily("fabricmon_agent_shard_lookup_failures",
                                    "Failed lookups of the node's unit (Kubernetes node label).", labels=["node"])
        fails.add_metric([node], float(s.failures_total))
        yield fails


def shard_exposition(shard: ShardTarget) -> Callable[[], bytes]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ShardCollector(shard))
    return lambda: generate_latest(registry)
