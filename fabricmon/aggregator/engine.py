"""The aggregator's core: ingest agent batches, run detectors and the correlator on sample time.

``Engine(topology, settings)`` is driven by whoever owns the clock: the gRPC
service calls ``hello``/``ingest``/``disconnected`` as streams deliver and
``tick(now)`` at the newest sample time every quarter second; the simulator
and the tests call the same methods in memory.  Nothing here reads the wall
clock for windows, persistence or incident times: those run on the sample
time ``ts`` the agents stamped (``clock`` only times the tick for /metrics).

``Engine`` is a composition; each stage is its own object in its own module, sharing one
``engine_state.EngineState`` (topology, thresholds, lock, component registry, cluster clock):

- node_registry.NodeRegistry: hellos, NIC binding, disconnects, unknown and never-connected nodes;
- admission_stage.AdmissionStage: a batch judged (duplicate, time bounds, shard ownership), counted and
  handed to ``ingest.Ingest`` (typed events and state on the components), the straggler, hang and cost trackers;
- detection_tick.DetectionTick: on ``tick`` the detectors, cable health, leaf and node folders, the
  correlator, and the incident manager that owns what changed;
- ras_queue.RasQueue: the NCCL RAS queries waiting for a node's stream, and the answers;
- engine_views.EngineViews: read-only views for the HTTP API and /metrics.

Engine keeps as one-line delegations what drives it (``hello``, ``disconnected``, ``ingest``, ``tick``,
``newest_ts``, a settings reload), what the gRPC servicer asks of any engine (the RAS queries, the drop
counters) and the incidents; everything else is read on the stage that owns it: ``engine.views`` (the
HTTP API's and /metrics' snapshots, ``explained_remote``, ``topology_series``), ``engine.node_registry``
(``nodes_view``, ``unknown_nodes``), ``engine.admission`` (admission counters and snapshots) and
``engine.detection`` (tick counters, suspicion, the cross-shard evidence).  All are thread-safe (one lock).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..batch import NodeBatch, NodeHello
from ..proto.ras import RasQuery, RasReport
from ..topology import Topology
from .admission import ClusterClock
from .admission_stage import AdmissionStage
from .cable_health import CableHealth
from .config import DetectionSettings
from .cost import IncidentCost
from .detection_tick import DetectionTick, RemoteSource
from .engine_state import EngineState, Stage
from .engine_views import LATENESS_EXPORTED_PER_JOB, EngineViews
from .folding import LeafFolder
from .hangs import HeartbeatTracker
from .incidents import Incident, IncidentManager
from .ingest import DELTA_ROUTES, GAUGE_ROUTES, Ingest
from .node_folding import NodeFolder
from .node_registry import NodeRegistry
from .ras_queries import RasQueries
from .ras_queue import RasQueue
from .stragglers import StragglerTracker
from .switch_side import DELTA_FAMILIES as SWITCH_DELTA_FAMILIES
from .switch_side import GAUGE_FAMILIES as SWITCH_GAUGE_FAMILIES

# what callers import from here (some names now live in the stage modules)
__all__ = ["LATENESS_EXPORTED_PER_JOB", "READ_DELTA_FAMILIES", "Engine", "RemoteSource"]

# what the stream decoder needs to build for this engine; other families are only counted
READ_DELTA_FAMILIES = frozenset(DELTA_ROUTES)


class Engine(Stage):
    # what the detectors read: the stream decoder builds only these deltas (proto/codec.py), and
    # agents are told to send only these (proto/subscription.py)
    read_delta_families = READ_DELTA_FAMILIES | SWITCH_DELTA_FAMILIES
    read_gauge_families = frozenset(GAUGE_ROUTES) | SWITCH_GAUGE_FAMILIES

    def __init__(self, topology: Topology, settings: DetectionSettings | None = None,
                 clock: Callable[[], float] | None = None, *, cluster: str | None = None,
                 shard_units: tuple[int, ...] | None = None, cluster_clock: ClusterClock | None = None) -> None:
        s = settings or DetectionSettings()
        # what ``tick`` runs at and what every batch's time is judged against (admission.py)
        super().__init__(EngineState(topology, s, cluster if cluster is not None else topology.cluster,
                                     frozenset(shard_units) if shard_units else None,
                                     cluster_clock or ClusterClock("sample")))
        self.clock = clock or time.perf_counter
        self.node_registry = nr = NodeRegistry(self.state)
        self.stragglers = StragglerTracker(s)
        self.heartbeats = HeartbeatTracker(s.hang_stall_s)
        self.ras = RasQueries()  # NCCL RAS of suspect jobs, asked through one of their agents
        self.cost = IncidentCost(topology, s, nr._interval_of, self.registry.job_gpus)
        self.cable = CableHealth(s)
        self.manager = IncidentManager(default_hold_s=s.hold_s)
        self.folder = LeafFolder(s, self.cluster, self.links_by_leaf)
        self.ingest_stage = Ingest(self.registry, s, self.cable)
        self.node_folder = NodeFolder(s, self.cluster, nr._rail_links)
        self.admission = AdmissionStage(self.state, self.ingest_stage, self.stragglers, self.heartbeats, self.cost,
                                        nr._note_unknown)
        self.detection = DetectionTick(self.state, self.clock, nr, stragglers=self.stragglers,
                                       heartbeats=self.heartbeats, ras=self.ras, cost=self.cost, cable=self.cable,
                                       manager=self.manager, folder=self.folder, node_folder=self.node_folder)
        self.ras_queue = RasQueue(self.state, self.ras)
        self.views = EngineViews(self.state, nr, self.admission, self.detection)

    @property
    def settings(self) -> DetectionSettings:
        return self.state.settings

    @settings.setter
    def settings(self, new: DetectionSettings) -> None:
        """A reload swaps the thresholds between two ticks: the ingest stage derives its sets again."""
        self.state.settings = new
        self.ingest_stage.configure(new)

    # ------------------------------------------------------------------ node registry (node_registry.py)
    def hello(self, hello: NodeHello) -> None:
        self.node_registry.hello(hello)

    def disconnected(self, node: str) -> None:
        self.node_registry.disconnected(node)

    # ------------------------------------------------------------------ ingest and admission (admission_stage.py)
    @property
    def newest_ts(self) -> float:
        """The cluster clock: the sample time ``tick`` should run at (0.0 before any batch in
        sample mode).  One node cannot move it: see admission.py."""
        return self.admission.newest_ts

    def ingest(self, batch: NodeBatch) -> bool:
        """Apply one batch; False when it was dropped (duplicate, time out of bounds, or not ours)."""
        return self.admission.ingest(batch)

    # the servicer reads which drop counter an ``ingest`` moved (server.py, by getattr)
    @property
    def dropped_by_reason(self) -> dict[str, int]:
        return self.admission.dropped_by_reason

    # ------------------------------------------------------------------ detection (detection_tick.py)
    def tick(self, now: float) -> list[Incident]:
        """Run detectors, folder and correlator at sample time ``now``; the incident manager applies
        what they found and returns the incidents that changed (the only report of changes)."""
        return self.detection.tick(now)

    # the other shards' incidents (service.py sets it, http_api reads it)
    @property
    def remote(self) -> RemoteSource | None:
        return self.detection.remote

    @remote.setter
    def remote(self, source: RemoteSource | None) -> None:
        self.detection.remote = source

    # ------------------------------------------------------------------ NCCL RAS (ras_queue.py)
    def ras_waiting(self) -> list[str]:
        """Nodes with RAS queries queued (the simulator's stand-in for the streams)."""
        return self.ras_queue.ras_waiting()

    def take_ras_queries(self, node: str) -> list[RasQuery]:
        """The RAS queries to send down ``node``'s stream now (the servicer, after each ack)."""
        return self.ras_queue.take_ras_queries(node)

    def ras_report(self, node: str, report: RasReport) -> bool:
        """An agent's answer to a RAS query; it joins the job's JobHung evidence at the next tick."""
        return self.ras_queue.ras_report(node, report)

    # ------------------------------------------------------------------ incidents (engine_views.py)
    def incidents(self, include_resolved: bool = True) -> list[Incident]:
        return self.views.incidents(include_resolved)

    def open_incidents(self) -> list[Incident]:
        return self.views.open_incidents()
