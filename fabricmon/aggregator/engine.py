"""The aggregator's core: ingest agent batches, run detectors and the correlator on sample time.

``Engine(topology, settings)`` is driven by whoever owns the clock: the gRPC
service calls ``hello``/``ingest``/``disconnected`` as streams deliver and
``tick(now)`` at the newest sample time every quarter second; the simulator
and the tests call the same methods in memory.  Nothing here reads the wall
clock for windows, persistence or incident times: those run on the sample
time ``ts`` the agents stamped (``clock`` only times the tick for /metrics).

The stages, each in its own module: admission here (duplicates, time bounds, shard
ownership), then ``ingest.Ingest`` (deltas and gauges become typed events and state on the
components of ``state.Registry``), then on ``tick`` the detectors, the cable-health trend, the leaf
folder, the correlator, and the incident manager that owns what changed.  All methods are
thread-safe (one lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from ..batch import NodeBatch, NodeHello
from ..components import Component, Kind
from ..proto.ras import RasQuery, RasReport
from ..topology import Topology
from .admission import ClusterClock
from .agents_down import agents_down, restart_grace, unknown_nodes_finding
from .cable_health import CableHealth
from .config import DetectionSettings
from .correlator import correlate
from .cost import IncidentCost
from .detectors import FOLDABLE, congestion_of, evaluate_gpu, evaluate_link
from .drift import config_drift
from .folding import LeafFolder
from .hangs import HeartbeatTracker, hung_job_findings
from .incidents import Finding, Incident, IncidentManager, Relation
from .ingest import DELTA_ROUTES, GAUGE_ROUTES, Ingest
from .lateness import node_time, scale_holds
from .node_folding import NodeFolder
from .ras_queries import RasQueries
from .remote_evidence import CrossShard, RemoteIncident
from .state import LinkState, Registry
from .stragglers import StragglerTracker

# what the stream decoder needs to build for this engine; other families are only counted
READ_DELTA_FAMILIES = frozenset(DELTA_ROUTES)
# fabricmon_rank_lateness_score per job: its latest ranks only.  One series per GPU of the cluster
# (32,768 at 4,096 nodes) on every scrape would cost more than the rest of /metrics together, and the
# dashboards read topk(10) of it.
LATENESS_EXPORTED_PER_JOB = 32
_log = structlog.get_logger("fabricmon.aggregator.engine")


class RemoteSource(Protocol):
    """The other shards' open fabric incidents (remote_evidence.AlertmanagerEvidence): a non-blocking read."""

    def incidents(self) -> tuple[RemoteIncident, ...]: ...

    def snapshot(self) -> dict[str, Any]: ...


class Engine:
    # what the detectors read: the stream decoder builds only these deltas (proto/codec.py), and
    # agents are told to send only these (proto/subscription.py)
    read_delta_families = READ_DELTA_FAMILIES
    read_gauge_families = frozenset(GAUGE_ROUTES)

    def __init__(self, topology: Topology, settings: DetectionSettings | None = None,
                 clock: Callable[[], float] | None = None, *, cluster: str | None = None,
                 shard_units: tuple[int, ...] | None = None, cluster_clock: ClusterClock | None = None) -> None:
        self.topology = topology
        self._settings = s = settings or DetectionSettings()
        self.clock = clock or time.perf_counter
        self.cluster = cluster if cluster is not None else topology.cluster
        self.shard_units = frozenset(shard_units) if shard_units else None
        self.lock = threading.RLock()
        self.registry = reg = Registry(topology, self.cluster, self.shard_units)
        # the registry's maps, by their old names (tests and detection read them)
        self.nodes = reg.nodes
        self.links_by_leaf = reg.links_by_leaf
        self.active_links = reg.active_links
        self.active_gpus = reg.active_gpus
        self.config_nodes = reg.config_nodes
        self.stragglers = StragglerTracker(s)
        self.heartbeats = HeartbeatTracker(s.hang_stall_s)
        self.ras = RasQueries()  # NCCL RAS of suspect jobs, asked through one of their agents
        self.cost = IncidentCost(topology, s, self._interval_of, reg.job_gpus)
        self.cable = CableHealth(s)
        self.manager = IncidentManager(default_hold_s=s.hold_s)
        self.folder = LeafFolder(s, self.cluster, self.links_by_leaf)
        self.ingest_stage = Ingest(reg, s, self.cable)
        self.node_folder = NodeFolder(s, self.cluster, self._rail_links)
        # self-instrumentation (read by http_api)
        self.samples_total = 0
        self.batches_total = 0
        self.batches_dropped_total = 0
        self.ticks_total = 0
        self.tick_seconds_last = 0.0
        self.tick_seconds_sum = 0.0
        # what ``tick`` runs at and what every batch's time is judged against (admission.py)
        self.cluster_clock = cluster_clock or ClusterClock("sample")
        self.dropped_by_reason: dict[str, int] = {}
        self.rank_timings_dropped: dict[str, int] = {}
        self._drop_logged: set[tuple[str, str]] = set()
        self._unknown_warned: set[str] = set()
        self.last_tick: float | None = None
        self.started_at: float | None = None  # sample time of the first tick (agents_down's restart grace)
        self.suspicion: dict[Component, float] = {}
        # sharded: comm-late stragglers another shard's fabric incident explains (remote_evidence.py)
        self.cross = CrossShard() if self.shard_units else None
        self.remote: RemoteSource | None = None  # set by the service when it has Alertmanagers to read

    @property
    def settings(self) -> DetectionSettings:
        return self._settings

    @settings.setter
    def settings(self, new: DetectionSettings) -> None:
        """A reload swaps the thresholds between two ticks: the ingest stage derives its sets again."""
        self._settings = new
        self.ingest_stage.configure(new)

    def _note_unknown(self, node: str) -> None:
        if node in self.topology.nodes or node in self._unknown_warned:
            return
        self._unknown_warned.add(node)  # once per node: a reconnecting agent would log every time
        _log.warning("unknown_node", node=node, cluster=self.cluster,
                     hint="not in the topology: monitored at node, NIC, link and GPU level without rail or leaf "
                          "(add it to the topology, or check the agent's --node-name)")

    def nodes_view(self) -> dict[str, Any]:
        """/api/nodes: every node this replica watches (topology nodes it owns, streaming nodes the
        topology lacks) and, once the start-up grace has passed, the topology nodes never heard from."""
        with self.lock:
            now = self.last_tick if self.last_tick is not None else self.cluster_clock.now()
            unknown = set(self.unknown_nodes())
            rows = []
            for name, ns in sorted(self.nodes.items()):
                rows.append({"node": name, "in_topology": name in self.topology.nodes, "unit": ns.unit,
                             "connected": ns.connected, "ever_seen": ns.ever_seen,
                             "last_seen": ns.last_ts if ns.ever_seen else None, "unknown": name in unknown})
            never = self._never_connected(now)
            return {"nodes": rows, "unknown": sorted(unknown), "never_connected": never}

    def _never_connected(self, now: float) -> list[str]:
        """Topology nodes with no batch and no hello after a grace of max(60 s, 5 intervals) from the first
        tick: a restart does not list the whole cluster while agents reconnect."""
        if self.started_at is None:
            return []
        iv = max((ns.interval for ns in self.nodes.values()), default=1.0)
        if now - self.started_at < restart_grace(self.settings, iv):
            return []
        return sorted(n for n, ns in self.nodes.items()
                      if n in self.topology.nodes and not ns.ever_seen and not ns.connected)

    def unknown_nodes(self) -> list[str]:
        """Streaming nodes the topology does not know: connected now, or heard from within the
        agents-down silence (a node that left for good stops counting when it would go down)."""
        with self.lock:
            now = self.cluster_clock.now()
            down_s = self.settings.agent_down_s
            return sorted(ns.name for ns in self.nodes.values()
                          if ns.name not in self.topology.nodes
                          and (ns.connected or (ns.ever_seen and now - ns.last_ts < max(down_s, 5 * ns.interval))))

    # ------------------------------------------------------------------ stream API
    def hello(self, hello: NodeHello) -> None:
        reg = self.registry
        if not reg.owned(hello.node):
            return
        with self.lock:
            self._note_unknown(hello.node)
            ns = reg.node(hello.node)
            if ns.boot_id and hello.boot_id and hello.boot_id != ns.boot_id:
                ns.grace_batches = 1  # counters began again: the first deltas are not evidence
            if hello.boot_id:
                ns.boot_id = hello.boot_id
            if hello.interval_seconds > 0:
                ns.interval = ns.announced_interval = hello.interval_seconds
            ns.connected = True
            self.cluster_clock.connected(hello.node)
            self._bind(hello)
            self.topology.pair_gpus(hello.node, {nic.device: nic.gpu for nic in hello.nics if nic.device})
            for nic in hello.nics:
                reg.announce(ns, nic.device, str(nic.port), nic.rail, nic.netdev)

    def _bind(self, hello: NodeHello) -> None:
        """An imported topology knows some NICs only by node GUID (``gpu-a17-03 HCA-1``) or netdev (LLDP):
        the hello names their RDMA devices, so their links get the leaf the fabric says."""
        spec = self.topology.nodes.get(hello.node)
        if spec is None or not spec.unbound:
            return
        names: dict[str, str] = {}
        for nic in hello.nics:
            for key in (nic.node_guid, nic.netdev):
                if key:
                    names[key] = nic.device
        bound = self.topology.bind_devices(hello.node, names)
        left = self.topology.nodes[hello.node].unbound
        if bound or left:
            _log.info("topology_bound", node=hello.node, bound=bound, unbound=len(left),
                      hint="" if not left else "NICs of the topology this hello names by neither node GUID "
                                               "nor netdev stay unmonitored at leaf level")

    def disconnected(self, node: str) -> None:
        with self.lock:
            ns = self.nodes.get(node)
            if ns is not None:
                ns.connected = False
            self.cluster_clock.disconnected(node)

    @property
    def newest_ts(self) -> float:
        """The cluster clock: the sample time ``tick`` should run at (0.0 before any batch in
        sample mode).  One node cannot move it: see admission.py."""
        with self.lock:
            return self.cluster_clock.now()

    def _drop(self, reason: str, batch: NodeBatch) -> bool:
        self.batches_dropped_total += 1
        n = self.dropped_by_reason.get(reason, 0)
        self.dropped_by_reason[reason] = n + 1
        if reason != "duplicate" and (batch.node, reason) not in self._drop_logged:
            # once per node and reason: a node with a broken clock would otherwise log every second
            self._drop_logged.add((batch.node, reason))
            _log.warning("batch_rejected", node=batch.node, reason=reason, ts=batch.ts,
                         cluster_clock=self.cluster_clock.now(), metric="fabricmon_ingest_batches_dropped_total")
        return False

    def admission_snapshot(self) -> dict[str, int]:
        """Batches dropped before detection, by reason."""
        with self.lock:
            return dict(self.dropped_by_reason)

    def rank_admission_snapshot(self) -> dict[str, int]:
        """Rank timings dropped before straggler scoring (time out of bounds), by reason."""
        with self.lock:
            return dict(self.rank_timings_dropped)

    def ingest(self, batch: NodeBatch) -> bool:
        """Apply one batch; False when it was dropped (duplicate, time out of bounds, or not ours)."""
        with self.lock:
            ns = self.nodes.get(batch.node)
            if ns is None:
                if not self.registry.owned(batch.node):
                    return False
                self._note_unknown(batch.node)
                ns = self.registry.node(batch.node)
            ts = batch.ts
            if batch.seq <= ns.last_seq and ts <= ns.last_ts:
                return self._drop("duplicate", batch)
            reason = self.cluster_clock.admit(batch.node, ts)
            if reason is not None:
                return self._drop(reason, batch)
            ns.last_seq = batch.seq
            if ts > ns.last_ts:
                ns.last_ts = ts
            ns.ever_seen = True
            if batch.interval_seconds > 0:
                # A batch's interval is the time since the node's previous poll.  An off-cadence poll (the
                # agent's link watch) is shorter than the cadence the hello announced, and must not shrink
                # the windows, the lateness bound or the agents-down silence; a poll that fell behind
                # (slow sources) is longer, and does widen them.
                ns.interval = max(batch.interval_seconds, ns.announced_interval)
            self.batches_total += 1
            self.samples_total += len(batch.deltas) + batch.unread_deltas + len(batch.gauges) + len(batch.ranks)
            if batch.deltas:
                self.ingest_stage.deltas(ns, batch)
            if batch.gauges:
                self.ingest_stage.gauges(ns, batch)
            if batch.layouts:
                for lay in batch.layouts:
                    self.stragglers.layout(lay)
            if batch.heartbeats:
                judge_hb = self.cluster_clock.judge
                for hb in batch.heartbeats:
                    if judge_hb(hb.ts) is None:  # bounded like rank timings: a future one would pin a job
                        self.heartbeats.add(hb, batch.node)
            if batch.ranks:
                add = self.stragglers.add
                judge = self.cluster_clock.judge
                for rt in batch.ranks:
                    # a job's own timestamps are bounded like the node's: one from the future would
                    # keep its job alive for good
                    why = judge(rt.ts)
                    if why is None:
                        why = add(rt, batch.node)  # the tracker's own refusals (step range) count here too
                    if why is None:
                        self.cost.record(f"{rt.job}\x00{rt.job_id}" if rt.job_id else rt.job, rt.job, rt.job_id,
                                         rt.step, rt.ts, rt.step_seconds)
                    else:
                        self.rank_timings_dropped[why] = self.rank_timings_dropped.get(why, 0) + 1
            return True

    # ------------------------------------------------------------------ detection
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
            fresh = {n for n, ns in self.nodes.items() if now - ns.last_ts < max(down_s, 5 * ns.interval)}
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
            scale_holds(findings, self._interval_of, self.settings.hold_s)
            changed = self.manager.update(findings, now, relations)
            self.last_tick = now
            self.ticks_total += 1
        dt = self.clock() - t0
        self.tick_seconds_last = dt
        self.tick_seconds_sum += dt
        return changed

    def _interval_of(self, node: str | None) -> float:
        """A node's poll interval; for no node (a leaf, a rail, a job), the slowest node's."""
        ns = self.nodes.get(node) if node else None
        if ns is not None:
            return ns.interval
        return max((n.interval for n in self.nodes.values()), default=1.0)

    def _rail_links(self, node: str) -> int:
        ns = self.nodes.get(node)
        return 0 if ns is None else sum(1 for link in ns.links.values() if link is not None)

    def _window(self, node: str) -> float:
        ns = self.nodes.get(node)
        iv = ns.interval if ns is not None else 1.0
        return max(self.settings.window_s, iv)

    def _detect(self, now: float) -> tuple[list[Finding], list[Relation]]:
        s = self.settings
        findings: list[Finding] = []
        foldable: dict[Component, list[tuple[LinkState, list[Finding]]]] = {}
        congested: dict[Component, list[tuple[LinkState, Finding]]] = {}
        for link in list(self.active_links):
            w = self._window(link.node)
            ns = self.nodes.get(link.node)
            t = now if ns is None else node_time(now, ns.last_ts, ns.interval)  # a late batch still counts
            fs = evaluate_link(link, t, w, s)
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
        findings.extend(self.cable.evaluate(now, loud))
        node_findings, node_relations = self.node_folder.fold(foldable, now, self.folder.folding_leaves(foldable))
        leaf_findings, relations = self.folder.fold_links(foldable, now)
        findings.extend(leaf_findings)
        findings.extend(node_findings)
        relations.extend(node_relations)  # after the leaf's: a link of a failing node is the node's evidence
        cong_findings, cong_relations = self.folder.fold_congestion(congested)
        findings.extend(cong_findings)
        relations.extend(cong_relations)
        for g in list(self.active_gpus):
            findings.extend(evaluate_gpu(g, now, self._window(g.node), s))
            if not g.ev and not g.nvl_down and not g.throttle:
                self.active_gpus.discard(g)
        findings.extend(config_drift(self.nodes, self.config_nodes, s, self.cluster, now))
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

    def _connected(self, node: str) -> bool:
        ns = self.nodes.get(node)
        return ns is not None and ns.connected

    # ------------------------------------------------------------------ NCCL RAS (ras_queries.py)
    def ras_waiting(self) -> list[str]:
        """Nodes with RAS queries queued (the simulator's stand-in for the streams)."""
        with self.lock:
            return list(self.ras.outbox)

    def take_ras_queries(self, node: str) -> list[RasQuery]:
        """The RAS queries to send down ``node``'s stream now (the servicer, after each ack)."""
        with self.lock:
            return self.ras.take(node) if self.ras.outbox else []

    def ras_report(self, node: str, report: RasReport) -> bool:
        """An agent's answer to a RAS query; it joins the job's JobHung evidence at the next tick."""
        with self.lock:
            now = self.last_tick if self.last_tick is not None else self.cluster_clock.now()
            return self.ras.report(node, report, now)

    def _rank_gpu(self, job: str, job_id: str, rank: int) -> int | None:
        """The GPU index of a job's rank, from its rank timings (heartbeats carry none)."""
        js = self.stragglers.jobs.get(f"{job}\x00{job_id}" if job_id else job)
        info = js.ranks.get(rank) if js is not None else None
        return info.gpu if info is not None else None

    # ------------------------------------------------------------------ read access
    def incidents(self, include_resolved: bool = True) -> list[Incident]:
        with self.lock:
            if include_resolved:
                return self.manager.all_incidents()
            return sorted(self.manager.open_incidents(), key=lambda i: (i.first_seen, i.id))

    def open_incidents(self) -> list[Incident]:
        return self.incidents(include_resolved=False)

    def explained_remote(self) -> list[dict[str, Any]]:
        """/api/incidents entries for the other shards' incidents that explain stragglers of this shard (one
        per remote incident, ``"remote": true``): the local ranks and jobs riding on it, and why."""
        with self.lock:
            cross = self.cross
            if cross is None or not cross.explained:
                return []
            by_remote: dict[tuple[str, str], dict[str, Any]] = {}
            for e in cross.explained:
                r = e.remote
                ent = by_remote.get((r.alertname, r.component.id))
                if ent is None:
                    lab = r.component.labels(self.cluster)
                    ent = by_remote[(r.alertname, r.component.id)] = {
                        "id": f"remote/{r.incident_id}", "remote": True, "alertname": r.alertname, "severity": "",
                        "component_type": r.component.kind.value, "component": r.component.id, "labels": lab,
                        "evidence": [], "description": f"explained by {r.name()}: comm-late stragglers of this "
                        "shard on its rail with clean local counters ride on it (no StragglerRank page here)",
                        "ranks": set(), "jobs": set(), "first_seen": cross.first_explained.get(
                            (r.alertname, r.component.id), self.last_tick),
                        "last_seen": self.last_tick, "resolved_at": None, "related_to": "", "absorbed": [],
                        "impact": [], "resolved_reason": ""}
                ent["evidence"].append(f"{len(e.ranks)} comm-late rank(s) of {e.job} on {e.group.id} (rail {e.rail}) "
                                       f"explained by {r.name()}")
                ent["ranks"].update(e.ranks)
                ent["jobs"].add(e.job)
            out = []
            for ent in by_remote.values():
                ent["ranks"], ent["jobs"] = sorted(ent["ranks"]), sorted(ent["jobs"])
                out.append(ent)
            return out

    def agents_connected(self) -> int:
        with self.lock:
            return sum(1 for ns in self.nodes.values() if ns.connected)

    def topology_series(self) -> tuple[list[tuple[str, str, str, str, str]], list[tuple[str, str]]]:
        """The topology this replica owns, as Prometheus reads it: (node, device, port, rail, leaf) per
        NIC port (named leaves; rail "" on a fat tree) and (leaf, spine) per uplink (spine "" for a leaf
        with none known).  The recording rules take rail and leaf from here."""
        with self.lock:
            topo, reg = self.topology, self.registry
            ports: list[tuple[str, str, str, str, str]] = []
            leaves: set[str] = set()
            for name, spec in topo.nodes.items():
                if not reg.owned(name):
                    continue
                for nic in spec.nics:
                    leaf = topo.leaf_of_nic(name, nic.device) or ""
                    ports.append((name, nic.device, str(nic.port), "" if nic.rail is None else str(nic.rail), leaf))
                    if leaf:
                        leaves.add(leaf)
            uplinks = [(leaf, spine) for leaf in sorted(leaves) for spine in (topo.spines_of(leaf) or ("",))]
            return ports, uplinks

    def metrics_snapshot(self) -> dict[str, Any]:
        with self.lock:
            open_counts: dict[tuple[str, str], int] = {}
            for inc in self.manager.open_incidents():
                key = (inc.alertname, inc.component_type)
                open_counts[key] = open_counts.get(key, 0) + 1
            return {
                "agents_connected": sum(1 for ns in self.nodes.values() if ns.connected),
                "agents_unknown": len(self.unknown_nodes()),
                "agents_never_connected": len(self._never_connected(
                    self.last_tick if self.last_tick is not None else self.cluster_clock.now())),
                "samples_total": self.samples_total,
                "batches_total": self.batches_total,
                "batches_dropped_total": self.batches_dropped_total,
                "suspicion": {(c.type, c.id): p for c, p in self.suspicion.items()},
                "lateness": self.stragglers.lateness_by_job(top=LATENESS_EXPORTED_PER_JOB),
                "incidents_open": open_counts,
                # one series per open incident and hurt job (bounded by the open incidents)
                "incident_cost": [(inc.alertname, inc.component, i.job, i.job_id, i.gpu_hours_per_hour)
                                  for inc in self.manager.open_incidents() for i in inc.impact],
                "cross_shard": self.cross.stats() if self.cross is not None else None,
                "ticks_total": self.ticks_total,
                "nccl_ras_sent_total": self.ras.sent_total,
                "nccl_ras_outcomes": dict(self.ras.outcomes),
                "tick_seconds_last": self.tick_seconds_last,
                "tick_seconds_sum": self.tick_seconds_sum,
                "newest_ts": self.newest_ts,
            }
