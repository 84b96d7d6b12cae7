"""The detection tick: at sample time ``now``, the detectors, the cable-health trend, the leaf and node
folders, the correlator and the cost, then the incident manager applies what they found.

Per link and GPU the detectors of detectors.py; links that fail together under one leaf fold into the
leaf's incident (folding.py), a node's failing links into the node's (node_folding.py); config drift,
agents down, unknown nodes and hung jobs (with NCCL RAS's evidence, ras_queries.py) join them; the
correlator (correlator.py) adds stragglers and rail/leaf suspicion, across shards when sharded
(remote_evidence.py).  ``tick`` returns the incidents that changed: the only report of changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..components import Component, Kind
from . import cable_ends
from .agents_down import agents_down, unknown_nodes_finding
from .cable_health import CableHealth
from .correlator import correlate
from .cost import IncidentCost
from .detectors import FOLDABLE, congestion_of, evaluate_gpu, evaluate_link
from .drift import config_drift
from .engine_state import EngineState, Stage
from .folding import LeafFolder
from .hangs import HeartbeatTracker, hung_job_findings
from .incidents import Finding, Incident, IncidentManager, Relation
from .lateness import node_time, scale_holds
from .node_folding import NodeFolder
from .node_registry import NodeRegistry
from .ras_queries import RasQueries
from .remediation.remediator import Remediator
from .remote_evidence import CrossShard, RemoteIncident
from .state import LinkState
from .stragglers import StragglerTracker


class RemoteSource(Protocol):
    """The other shards' open fabric incidents (remote_evidence.AlertmanagerEvidence): a non-blocking read."""

    def incidents(self) -> tuple[RemoteIncident, ...]: ...

    def snapshot(self) -> dict[str, Any]: ...


class DetectionTick(Stage):
    def __init__(self, state: EngineState, clock: Callable[[], float], nodes: NodeRegistry, *,
                 stragglers: StragglerTracker, heartbeats: HeartbeatTracker, ras: RasQueries, cost: IncidentCost,
                 cable: CableHealth, manager: IncidentManager, folder: LeafFolder, node_folder: NodeFolder) -> None:
        super().__init__(state)
        self.clock = clock
        self.stragglers = stragglers
        self.heartbeats = heartbeats
        self.ras = ras
        self.cost = cost
        self.cable = cable
        self.manager = manager
        self.folder = folder
        self.node_folder = node_folder
        # the node registry's lookups, by the names detection calls them
        self._interval_of = nodes._interval_of
        self._window = nodes._window
        self._connected = nodes._connected
        self.unknown_nodes = nodes.unknown_nodes
        # self-instrumentation (read by http_api)
        self.ticks_total = 0
        self.tick_seconds_last = 0.0
        self.tick_seconds_sum = 0.0
        self.suspicion: dict[Component, float] = {}
        # sharded: comm-late stragglers another shard's fabric incident explains (remote_evidence.py)
        self.cross = CrossShard() if self.shard_units else None
        self.remote: RemoteSource | None = None  # set by the service when it has Alertmanagers to read
        # acting on faults (remediation/remediator.py), set by the service when the config has the section
        self.remediation: Remediator | None = None

    def tick(self, now: float) -> list[Incident]:
        """Run detectors, folder and correlator at sample time ``now``; the incident manager applies
        what they found and returns the incidents that changed (the only report of changes)."""
        t0 = self.clock()
        with self.lock:
            findings, relations = self._detect(now)
            report = self.stragglers.evaluate(now)
            throttled = {g.id: set(g.throttle) for g in self.active_gpus if g.throttle}
            # the agents-down rule's silence (agents_down.py): a node polled every 10 s is not stale at 15 s
            down_s = self.settings.agent_down_s
            fresh = {n for n, ns in self.nodes.items() if now - ns.last_heard < max(down_s, 5 * ns.interval)}
            cross = self.cross
            if cross is not None:
                remote = self.remote.incidents() if self.remote is not None else ()
                cross.begin(now, remote, self.settings.cross_shard_grace_intervals * self._interval_of(None))
            corr = correlate(self.topology, self.settings, findings, report, throttled, fresh, self.cluster,
                             self.manager.open_keys(), cross)
            if cross is not None:
                cross.end()
            findings.extend(corr.findings)
            self.suspicion = corr.suspicion
            self.cost.annotate(findings, self.manager, now, self.stragglers)
            cable_ends.annotate(findings, self.topology)  # both ends of the cable in the page's text
            scale_holds(findings, self._interval_of, self.settings.hold_s)
            findings.extend(self.resume.hold(findings, now, self.nodes, self.started_at or now, self.settings))
            changed = self.resume.settle(self.manager.update(findings, now, relations))
            if self.remediation is not None:  # decisions and results ride on the incidents that changed
                changed = self.remediation.tick(now, self.manager, changed)
            self.last_tick = now
            self.ticks_total += 1
        dt = self.clock() - t0
        self.tick_seconds_last = dt
        self.tick_seconds_sum += dt
        return changed

    def _detect(self, now: float) -> tuple[list[Finding], list[Relation]]:
        s = self.settings
        findings: list[Finding] = []
        foldable: dict[Component, list[tuple[LinkState, list[Finding]]]] = {}
        congested: dict[Component, list[tuple[LinkState, Finding]]] = {}
        for link in list(self.active_links):
            w = self._window(link.node)
            ns = self.nodes.get(link.node)
            t = now if ns is None else node_time(now, ns.last_ts, ns.interval)  # a late batch still counts
            fs = self.startup.apply(link, evaluate_link(link, t, w, s), t, self._interval_of(link.node), s,
                                    self._is_open)
            cong = congestion_of(link, t, w, s)
            fold = [f for f in fs if f.alertname in FOLDABLE and (f.fire or f.keep)]
            if fold and link.leaf is not None:
                foldable.setdefault(link.leaf, []).append((link, fold))
                findings.extend(f for f in fs if f.alertname not in FOLDABLE)
            else:
                findings.extend(fs)
            if cong is not None:
                congested.setdefault(link.leaf or link.id, []).append((link, cong))
            if not link.ev and not link.trans and link.down_since is None and link.degraded_since is None:
                self.active_links.discard(link)
        # --- cable health: warn before a link flaps; not on top of a link that already alerts ---
        loud = {f.component for f in findings if f.component.kind is Kind.LINK and f.fire
                and f.alertname in ("FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors")}
        node_findings, node_relations = self.node_folder.fold(foldable, now, self.folder.folding_leaves(foldable))
        leaf_findings, relations = self.folder.fold_links(foldable, now)
        # after the folder: a degraded leaf's links trend together, its evidence, never a warning each
        findings.extend(self.cable.evaluate(now, loud, self.folder.degraded_leaves()))
        findings.extend(leaf_findings)
        findings.extend(node_findings)
        # uplinks of one spine; sharded, with the other shards' open uplink alerts (remote_evidence.py)
        spine_findings, spine_relations = self.switch_side.fold_spines(
            findings, self.remote.incidents() if self.remote is not None and self.cross is not None else ())
        findings.extend(spine_findings)
        relations.extend(spine_relations)
        relations.extend(node_relations)  # after the leaf's: a link of a failing node is the node's evidence
        self.switch_side.name_waiting([f for _l, f in (e for es in congested.values() for e in es)], now)
        cong_findings, cong_relations = self.folder.fold_congestion(congested)
        findings.extend(cong_findings)
        relations.extend(cong_relations)
        for g in list(self.active_gpus):
            findings.extend(evaluate_gpu(g, now, self._window(g.node), s))
            if not g.ev and not g.nvl_down and not g.throttle:
                self.active_gpus.discard(g)
        findings.extend(config_drift(self.nodes, self.config_nodes, s, self.cluster, now))
        findings.extend(self.switch_side.lossless_findings(now))  # the host's RoCE priority on its switch port
        if self.started_at is None:
            self.started_at = now  # the first tick: the restart grace of agents_down runs from here
        findings.extend(agents_down(self.nodes.values(), s, self.cluster, now, self.started_at))
        findings.extend(unknown_nodes_finding(self.unknown_nodes(), self.cluster))
        # one pass over the heartbeats: the suspects (RAS is asked) at 10 s, the hung among them at 20 s
        suspects = self.ras.plan(self.heartbeats, now, self._connected)
        hung = [h for h in suspects if now - h.since >= self.heartbeats.stall_s]
        findings.extend(hung_job_findings(hung, self._rank_gpu, self.topology, self.cluster, self.ras.evidence,
                                          self.ras.verdict))
        return findings, relations

    def _is_open(self, f: Finding) -> bool:
        return self.manager.get_open(f.alertname, f.component) is not None

    def _rank_gpu(self, job: str, job_id: str, rank: int) -> int | None:
        """The GPU index of a job's rank, from its rank timings (heartbeats carry none)."""
        js = self.stragglers.jobs.get(f"{job}\x00{job_id}" if job_id else job)
        info = js.ranks.get(rank) if js is not None else None
        return info.gpu if info is not None else None
