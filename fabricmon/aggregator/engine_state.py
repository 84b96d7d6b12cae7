"""What the aggregator's stages share: the topology, the thresholds, the lock, the cluster clock, the
component registry, and the sample times of the first and latest tick.

``Engine`` (engine.py) builds one ``EngineState`` and hands it to each stage (node_registry.py,
admission_stage.py, detection_tick.py, ras_queue.py, engine_views.py).  A stage reads and writes the
shared names as its own attributes (``self.topology``, ``self.settings``, ``self.nodes``,
``self.last_tick``...), so the method bodies read as they did when the stages were one class: the
shared objects are the same objects on every stage, and the names that get reassigned are forwarded
to the one ``EngineState`` (``Stage``), so a topology or settings reload seen by one stage is seen by all.
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
        # moved by every call that changes what a tick reads, under the lock (tick_gate.py)
        self.inputs = 0
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
    """A part of the engine: its own state on itself, the shared state of its ``EngineState``.

    The shared objects no one replaces (lock, registry and its maps, cluster clock, start-up hold, resume
    check, switch side) are the same objects on every stage; the four names a reload or the tick assign
    (topology, settings, last_tick, started_at) are forwarded to the one ``EngineState``, so what one
    stage sets every stage reads."""

    topology: Topology = _shared("topology")
    settings: DetectionSettings = _shared("settings")
    last_tick: float | None = _shared("last_tick")
    started_at: float | None = _shared("started_at")

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.cluster = state.cluster
        self.shard_units = state.shard_units
        self.lock = state.lock
        self.registry = state.registry
        self.nodes = state.nodes
        self.links_by_leaf = state.links_by_leaf
        self.active_links = state.active_links
        self.active_gpus = state.active_gpus
        self.config_nodes = state.config_nodes
        self.cluster_clock = state.cluster_clock
        self.startup: StartupHold = state.startup
        self.resume: ResumeCheck = state.resume
        self.switch_side: SwitchSide = state.switch_side
