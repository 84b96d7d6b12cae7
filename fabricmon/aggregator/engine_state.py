"""What the aggregator's stages share: the topology, the thresholds, the lock, the cluster clock, the
component registry, and the sample times of the first and latest tick.

``Engine`` (engine.py) builds one ``EngineState`` and hands it to each stage (node_registry.py,
admission_stage.py, detection_tick.py, ras_queue.py, engine_views.py).  A stage reads and writes the
shared names as its own attributes (``self.topology``, ``self.settings``, ``self.last_tick``...):
``Stage`` forwards each of them, by name, to the one ``EngineState``, so a topology reload or a
settings reload seen by one stage is seen by all, and the method bodies read as they did when they
were all one class.
"""

from __future__ import annotations

import threading
from typing import Any

from ..topology import Topology
from .admission import ClusterClock
from .config import DetectionSettings
from .resume_check import ResumeCheck
from .startup_hold import StartupHold
from .state import GpuState, LinkState, NodeState, Registry
from .switch_side import SwitchSide


class EngineState:
    def __init__(self, topology: Topology, settings: DetectionSettings, cluster: str,
                 shard_units: frozenset[int] | None, cluster_clock: ClusterClock) -> None:
        self.topology = topology
        self.settings = settings
        self.cluster = cluster
        self.shard_units = shard_units
        self.lock = threading.RLock()  # all stages are thread-safe through this one lock
        self.registry = reg = Registry(topology, cluster, shard_units)
        # the registry's maps, by their old names (tests and detection read them)
        self.nodes: dict[str, NodeState] = reg.nodes
        self.links_by_leaf = reg.links_by_leaf
        self.active_links: set[LinkState] = reg.active_links
        self.active_gpus: set[GpuState] = reg.active_gpus
        self.config_nodes: set[str] = reg.config_nodes
        # what ``tick`` runs at and what every batch's time is judged against (admission.py)
        self.cluster_clock = cluster_clock
        self.last_tick: float | None = None
        self.started_at: float | None = None  # sample time of the first tick (agents_down's restart grace)
        self.startup = StartupHold()  # link state of a node that just booted pages nothing (startup_hold.py)
        self.resume = ResumeCheck()  # incidents restored at start wait for their node's batches (resume_check.py)
        self.switch_side = SwitchSide(topology, settings, cluster, reg)  # switch_side.py: uplinks, cable ends


def _shared(name: str) -> Any:
    """A property reading and writing ``name`` of the stage's ``EngineState``."""

    def get(self: Stage) -> Any:
        return getattr(self.state, name)

    def put(self: Stage, value: Any) -> None:
        setattr(self.state, name, value)

    return property(get, put, doc=f"EngineState.{name}")


class Stage:
    """A part of the engine: its own state on itself, the shared state forwarded to ``self.state``."""

    topology: Topology = _shared("topology")
    settings: DetectionSettings = _shared("settings")
    cluster: str = _shared("cluster")
    shard_units: frozenset[int] | None = _shared("shard_units")
    lock: threading.RLock = _shared("lock")
    registry: Registry = _shared("registry")
    nodes: dict[str, NodeState] = _shared("nodes")
    links_by_leaf: dict[Any, list[LinkState]] = _shared("links_by_leaf")
    active_links: set[LinkState] = _shared("active_links")
    active_gpus: set[GpuState] = _shared("active_gpus")
    config_nodes: set[str] = _shared("config_nodes")
    cluster_clock: ClusterClock = _shared("cluster_clock")
    last_tick: float | None = _shared("last_tick")
    started_at: float | None = _shared("started_at")
    startup: StartupHold = _shared("startup")
    resume: ResumeCheck = _shared("resume")
    switch_side: SwitchSide = _shared("switch_side")

    def __init__(self, state: EngineState) -> None:
        self.state = state
