"""The aggregator's HTTP side: /metrics, /api/incidents, /healthz, /readyz.

/metrics is a custom collector on a private registry that serializes what the
engine, the gRPC servicer and the Alertmanager client hold (nothing is computed
at scrape time).  Every label value a counter can take is exported from the
start at 0, so ``rate()`` and ``increase()`` see the first event.
/api/incidents lists incidents with RFC3339 UTC times; ``?state=open`` (the
default is ``all``), ``?id=`` selects one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from ..buildinfo import add_runtime_collectors
from ..httpserve import TEXT, RoutedHTTPServer, landing_page, probe
from .admission import TS_AHEAD, TS_BEHIND, TS_STALE
from .alertmanager import RESULTS, rfc3339
from .conn_gate import EVICTED_UNAUTHENTICATED, REFUSED_BACKEND, REFUSED_LIMIT
from .engine import LATENESS_EXPORTED_PER_JOB, Engine, RemoteSource
from .metrics_text import freeze
from .metrics_text import render as render_metrics
from .name_bounds import KINDS as NAME_KINDS
from .remediation.metrics import remediation_series

if TYPE_CHECKING:
    from ..buildinfo import ReloadStatus
    from ..webconfig import WebConfig
    from .alertmanager import AlertmanagerClient
    from .incidents import Incident
from .hangs import DROP_REASONS as HEARTBEAT_DROPS
from .stragglers import REFUSE_REASONS as STEP_REFUSALS

# Why a batch never reached the detectors: the servicer's seq checks and the engine's time admission.
DROP_REASONS = ("duplicate", "seq_ahead", TS_AHEAD, TS_BEHIND, TS_STALE)
# Streams ended before any batch was believed, by why.
REFUSAL_KEYS = (("unauthenticated", "unauthenticated_total"), ("identity", "identity_refused_total"),
                ("malformed", "rejected_total"), ("revoked", "revoked_total"))


def _gate_metrics(grpc: dict[str, Any]) -> Iterator[Metric]:
    """The connection gate's (aggregator/conn_gate.py): connections held, evicted and refused."""
    if "connections_limit" in grpc:  # absent with grpc_limits.connection_gate: false
        g = GaugeMetricFamily("fabricmon_grpc_connections",
                              "Connections held on the gRPC port, by whether one carried a stream whose credential "
                              "validated (authenticated: never evicted) or not.", labels=["state"])
        for state in ("authenticated", "unauthenticated"):
            g.add_metric([state], grpc.get(f"connections_{state}", 0))
        yield g
        g = GaugeMetricFamily("fabricmon_grpc_connections_limit",
                              "Connections the gRPC port holds at most (grpc_limits.max_connections, or as many "
                              "as the descriptor limit fits).")
        g.add_metric([], grpc["connections_limit"])
        yield g
    c = CounterMetricFamily("fabricmon_grpc_connections_evicted",
                            "Connections closed by the connection gate to admit a new one at the limit: one that "
                            "never carried an authenticated stream (unauthenticated).", labels=["reason"])
    c.add_metric([EVICTED_UNAUTHENTICATED], grpc.get(f"connections_evicted_{EVICTED_UNAUTHENTICATED}_total", 0))
    yield c
    c = CounterMetricFamily("fabricmon_grpc_connections_refused",
                            "New connections the connection gate refused: every held one is authenticated (limit: "
                            "raise grpc_limits.max_connections), or the internal gRPC port did not accept the "
                            "relay (backend).", labels=["reason"])
    for reason in (REFUSED_LIMIT, REFUSED_BACKEND):
        c.add_metric([reason], grpc.get(f"connections_refused_{reason}_total", 0))
    yield c


class AggregatorCollector:
    def __init__(self, engine: Engine, sender: AlertmanagerClient | None = None,
                 grpc_stats: Callable[[], dict[str, Any]] | None = None) -> None:
        self.engine = engine
        self.sender = sender
        self.grpc_stats: Callable[[], dict[str, Any]] = grpc_stats or dict
        self.topology = TopologyFamilies()

    def collect(self) -> Iterator[Metric]:
        snap = self.engine.views.metrics_snapshot()
        g = GaugeMetricFamily("fabricmon_agents_connected", "Agents with an open stream.")
        g.add_metric([], snap["agents_connected"])
        yield g
        g = GaugeMetricFamily("fabricmon_agents_unknown",
                              "Streaming agents whose node is not in the topology (listed at /api/nodes).")
        g.add_metric([], snap["agents_unknown"])
        yield g
        g = GaugeMetricFamily("fabricmon_agents_never_connected",
                              "Topology nodes never heard from since start, after a grace of max(60 s, 5 intervals).")
        g.add_metric([], len(snap["never_connected"]))
        yield g
        g = GaugeMetricFamily("fabricmon_agent_never_connected",
                              "1 per topology node never heard from since start, after the start-up grace (the "
                              "FabricmonNodesNeverConnected alert lists them; bounded by the topology).",
                              labels=["node"])
        for name in snap["never_connected"]:
            g.add_metric([name], 1.0)
        yield g
        g = GaugeMetricFamily("fabricmon_aggregator_resuming",
                              "1 from start until the incidents restored from the state file are settled and every "
                              "node heard from has been evaluated again (at most the restart grace): the Prometheus "
                              "fallback rules keep firing meanwhile (hand-back).")
        g.add_metric([], 1.0 if snap["resuming"] else 0.0)
        yield g
        g = GaugeMetricFamily("fabricmon_topology_nodes", "Nodes in the topology the aggregator runs on (a reload "
                              "may add and remove nodes).")
        g.add_metric([], len(self.engine.topology.nodes))
        yield g
        yield from self.topology.families(self.engine)
        c = CounterMetricFamily("fabricmon_ingest_samples", "Deltas, gauges and rank timings ingested.")
        c.add_metric([], snap["samples_total"])
        yield c
        c = CounterMetricFamily("fabricmon_ingest_batches", "Agent batches ingested.")
        c.add_metric([], snap["batches_total"])
        yield c
        sw = snap["switch_side"]
        c = CounterMetricFamily("fabricmon_switch_series_refused_batches", "Batches with switch-side series from a "
                                "node not in auth.switch_sources (those series ignored).")
        c.add_metric([], sw["refused_batches"])
        yield c
        g = GaugeMetricFamily("fabricmon_switch_uplinks", "Leaf-spine cables the switch side has reported.")
        g.add_metric([], sw["uplinks"])
        yield g
        g = GaugeMetricFamily("fabricmon_switch_ports_elsewhere", "Sharded: swept switch ports whose uplink or "
                              "host cable another shard owns (left to it).")
        g.add_metric([], sw["ports_elsewhere"])
        yield g
        grpc = self.grpc_stats() or {}
        dropped = self.engine.admission.admission_snapshot()
        c = CounterMetricFamily("fabricmon_ingest_batches_dropped",
                                "Agent batches acknowledged but not believed, by reason (replayed seq, seq ahead "
                                "of the aggregator's clock, sample time too far ahead, behind the node's last "
                                "or too old).", labels=["reason"])
        for reason in DROP_REASONS:
            c.add_metric([reason], dropped.get(reason, 0) + grpc.get(f"batches_dropped_{reason}_total", 0))
        yield c
        ranks = self.engine.admission.rank_admission_snapshot()
        c = CounterMetricFamily("fabricmon_ingest_rank_timings_dropped",
                                "Rank timings not scored: their time too far ahead of or behind the cluster clock, "
                                "or their step past 2^53 or more than 1,000 ahead of their job's newest.",
                                labels=["reason"])
        for reason in (TS_AHEAD, TS_STALE, *STEP_REFUSALS):
            c.add_metric([reason], ranks.get(reason, 0))
        yield c
        c = CounterMetricFamily("fabricmon_grpc_streams", "Agent streams opened.")
        c.add_metric([], grpc.get("streams_total", 0))
        yield c
        c = CounterMetricFamily("fabricmon_grpc_streams_refused",
                                "Agent streams refused: no or wrong credential (unauthenticated), a credential "
                                "naming another node (identity), a malformed message (malformed), or cut "
                                "because a reload removed the token it had presented (revoked).",
                                labels=["reason"])
        for label, key in REFUSAL_KEYS:
            c.add_metric([label], grpc.get(key, 0))
        yield c
        yield from _gate_metrics(grpc)
        c = CounterMetricFamily("fabricmon_ingest_names_refused",
                                "Series refused because they would give their node more distinct names of a kind "
                                "than its bound (aggregator/name_bounds.py: device 128, port 512, gpu 64, link 2048, "
                                "interface 1024); their values are not ingested.", labels=["kind"])
        for kind in NAME_KINDS:
            c.add_metric([kind], grpc.get(f"names_refused_{kind}_total", 0))
        yield c
        c = CounterMetricFamily("fabricmon_engine_errors", "Engine calls that raised, by stage (stream intake "
                                "or detection tick).", labels=["stage"])
        c.add_metric(["intake"], grpc.get("engine_errors_total", 0))
        c.add_metric(["tick"], grpc.get("tick_errors_total", 0))
        yield c
        c = CounterMetricFamily("fabricmon_state_save_failures",
                                "Saves of the open incidents to state_file that failed (disk full, a directory or a "
                                "read-only path there): they are lost at the next restart until a save succeeds.")
        c.add_metric([], grpc.get("state_save_failures_total", 0))
        yield c
        c = CounterMetricFamily("fabricmon_state_records_skipped",
                                "Records of state_file skipped at start: a field missing or of the wrong type, or an "
                                "id that does not parse (that incident was not resumed).")
        c.add_metric([], grpc.get("state_records_skipped_total", 0))
        yield c
        g = GaugeMetricFamily("fabricmon_component_suspicion",
                              "Fault probability per component from fused counter and slow-rank evidence.",
                              labels=["component_type", "component"])
        for (ctype, comp), p in sorted(snap["suspicion"].items()):
            g.add_metric([ctype, comp], p)
        yield g
        g = GaugeMetricFamily("fabricmon_rank_lateness_score", "Robust lateness z-score of the rank's last step; the "
                              f"{LATENESS_EXPORTED_PER_JOB} latest ranks of each job.",
                              labels=["hpc_job", "job_id", "rank"])
        for job, job_id, rank, score in snap["lateness"]:
            g.add_metric([job, job_id, str(rank)], score)
        yield g
        g = GaugeMetricFamily("fabricmon_incidents_open", "Open incidents.", labels=["alertname", "component_type"])
        for (a, t), n in sorted(snap["incidents_open"].items()):
            g.add_metric([a, t], n)
        yield g
        g = GaugeMetricFamily("fabricmon_incident_gpu_hours_per_hour",
                              "GPU-hours per hour each open incident costs each job whose ranks use its component "
                              "(GPUs x (1 - 1/(1 + step slowdown)); all its GPUs when the job stopped).",
                              labels=["alertname", "component", "hpc_job", "job_id"])
        for a, comp, job, job_id, cost in snap["incident_cost"]:
            g.add_metric([a, comp, job, job_id or ""], cost)
        yield g
        yield from _incident_series(self.engine.open_incidents())
        c = CounterMetricFamily("fabricmon_nccl_ras_queries_sent",
                                "NCCL RAS queries sent to an agent of a job suspected of hanging (one per "
                                "suspicion, repeated after a back-off while it lasts).")
        c.add_metric([], snap.get("nccl_ras_sent_total", 0))
        yield c
        c = CounterMetricFamily("fabricmon_nccl_ras_queries",
                                "NCCL RAS queries answered, by outcome (ok; refused, unreachable, timeout, "
                                "old_protocol, bad_reply, bad_json, too_large, not_local, bad_address, busy as the "
                                "agent reported; unanswered: no report within 30 s).", labels=["outcome"])
        for outcome, n in sorted(snap.get("nccl_ras_outcomes", {}).items()):
            c.add_metric([outcome], n)
        yield c
        c = CounterMetricFamily("fabricmon_heartbeats_dropped",
                                "Rank heartbeats dropped by the hang tracker, by reason: table_full, node_budget "
                                "(ranks one node may bring), node_jobs (jobs one node may bring), job_budget (ranks "
                                "per job), conflict (a (job, rank) alive on another node: not taken over).  A dropped "
                                "rank is not watched for hangs.", labels=["reason"])
        dropped = snap.get("heartbeats_dropped", {})
        for reason in HEARTBEAT_DROPS:
            c.add_metric([reason], dropped.get(reason, 0))
        yield c
        c = CounterMetricFamily("fabricmon_nccl_ras_reports_refused",
                                "RAS reports from agents refused as malformed (dropped; the stream goes on).")
        c.add_metric([], grpc.get("ras_reports_refused_total", 0))
        yield c
        c = CounterMetricFamily("fabricmon_alerts_sent", "Alerts posted to Alertmanager, by result.",
                                labels=["result"])
        sent = dict(self.sender.sent_total) if self.sender is not None else {}
        for result in RESULTS:
            c.add_metric([result], sent.get(result, 0))
        yield c
        g = GaugeMetricFamily("fabricmon_alertmanager_peers",
                              "Alertmanager addresses each configured URL delivers to now (a headless Service name "
                              "counts every address it resolves to; 0 would mean nobody gets the alerts).",
                              labels=["url"])
        for url, n in (self.sender.peer_counts() if self.sender is not None else {}).items():
            g.add_metric([url], n)
        yield g
        g = GaugeMetricFamily("fabricmon_alerts_queued", "Alert transitions waiting for delivery.")
        g.add_metric([], self.sender.pending() if self.sender is not None else 0)
        yield g
        yield from _cross_shard_series(snap["cross_shard"], self.engine.remote)
        yield from remediation_series(self.engine.detection.remediation)
        c = CounterMetricFamily("fabricmon_tick_duration_seconds", "Time spent in detection ticks.")
        c.add_metric([], snap["tick_seconds_sum"])
        yield c
        g = GaugeMetricFamily("fabricmon_tick_last_duration_seconds", "Duration of the last detection tick.")
        g.add_metric([], snap["tick_seconds_last"])
        yield g
        c = CounterMetricFamily("fabricmon_ticks", "Detection ticks run.")
        c.add_metric([], snap["ticks_total"])
        yield c
        c = CounterMetricFamily("fabricmon_ticks_skipped", "Periodic detection ticks skipped: at the sample time of "
                                "the last one with no batch, hello, disconnect, RAS report or reload since "
                                "(aggregator/tick_gate.py); they would have found the same.")
        c.add_metric([], grpc.get("ticks_skipped_total", 0))
        yield c
        g = GaugeMetricFamily("fabricmon_cluster_clock_timestamp_seconds",
                              "The cluster clock detection runs at (wall clock, or the nodes' median sample time).")
        g.add_metric([], snap["newest_ts"])
        yield g


class TopologyFamilies:
    """The topology this replica owns as two families, built and rendered (metrics_text.freeze) once per
    version of ``EngineViews.topology_series``: at 32 nodes they are two thirds of the exposition's lines,
    and they change only with a reload or a hello's binding."""

    def __init__(self) -> None:
        self._of: object = None  # the series object they were built from (identity)
        self._families: tuple[GaugeMetricFamily, ...] = ()

    def families(self, engine: Engine) -> tuple[GaugeMetricFamily, ...]:
        series = engine.views.topology_series()
        if series is not self._of:
            self._families = tuple(freeze(f) for f in _topology_series(*series))
            self._of = series
        return self._families


def _topology_series(ports: Iterable[tuple[str, ...]], uplinks: Iterable[tuple[str, ...]]
                     ) -> Iterator[GaugeMetricFamily]:
    """The topology this replica owns: the recording rules join rail and leaf from it (named leaves
    everywhere Prometheus shows a leaf).  One series per NIC port, as many as the agents'
    fabricmon_ib_port_info, and one per leaf uplink; a NIC the topology knows only by GUID or netdev
    appears once an agent's hello binds it."""
    g = GaugeMetricFamily("fabricmon_topology_port_info", "A NIC port of the topology and the leaf it is cabled "
                          "to (rail empty where the fabric is not rail-optimized); value 1.",
                          labels=["node", "device", "port", "rail", "leaf"])
    for port in ports:
        g.add_metric(list(port), 1)
    yield g
    g = GaugeMetricFamily("fabricmon_topology_leaf_info", "A leaf of the topology and a spine it uplinks to "
                          "(spine empty when none is known); value 1.", labels=["leaf", "spine"])
    for uplink in uplinks:
        g.add_metric(list(uplink), 1)
    yield g


# One series per OPEN incident (resolved ones disappear): bounded by the open incidents, and what the
# dashboards' incidents table and annotations read.  Labels are the DESIGN contract's routing labels, with
# the job the incident names (hpc_job, fixed when it first fires; job_id where the finding has one) so
# the job dashboard selects a job's stragglers, hangs and software findings.
INCIDENT_LABELS = ("alertname", "severity", "component_type", "component", "node", "rail", "leaf", "hpc_job", "job_id",
                   "spine")  # spine: an uplink's far end (the Fabric map's leaf x spine grid)


def _incident_series(open_incidents: Iterable[Incident]) -> Iterator[Metric]:
    is_open = GaugeMetricFamily("fabricmon_incident_open", "1 per open incident.", labels=list(INCIDENT_LABELS))
    started = GaugeMetricFamily("fabricmon_incident_started_timestamp_seconds",
                                "When the open incident was first seen (cluster clock).", labels=list(INCIDENT_LABELS))
    for inc in open_incidents:
        values = [inc.alertname, inc.severity, inc.component_type, inc.component,
                  *(str(inc.labels.get(k) or "") for k in INCIDENT_LABELS[4:])]
        is_open.add_metric(values, 1)
        started.add_metric(values, inc.first_seen)
    yield is_open
    yield started


def _cross_shard_series(cross: dict[str, Any] | None, remote: RemoteSource | None) -> Iterator[Metric]:
    """Sharded only: stragglers another shard's incident explains, and whether that source is read."""
    if cross is None:
        return
    g = GaugeMetricFamily("fabricmon_stragglers_explained_remote",
                          "Comm-late straggler ranks of this shard, with clean local counters, that another shard's "
                          "open fabric incident on their rail explains (no StragglerRank page), by its alertname.",
                          labels=["alertname"])
    for a, n in sorted(cross["explained_ranks"].items()):
        g.add_metric([a], n)
    yield g
    c = CounterMetricFamily("fabricmon_straggler_groups_explained_remote",
                            "Times a comm-late straggler group (job, rail) became explained by another shard's "
                            "fabric incident.")
    c.add_metric([], cross["explained_total"])
    yield c
    g = GaugeMetricFamily("fabricmon_stragglers_cross_shard_waiting",
                          "Comm-late straggler groups with no local evidence waiting out the cross-shard grace "
                          "(detection.cross_shard_grace_intervals) before StragglerRank opens.")
    g.add_metric([], cross["waiting"])
    yield g
    snap = remote.snapshot() if remote is not None else None
    c = CounterMetricFamily("fabricmon_remote_evidence_polls",
                            "Reads of the other shards' open fabric alerts from Alertmanager, by result (error: no "
                            "Alertmanager answered; their faults then explain nothing here).", labels=["result"])
    polls: Any = snap["polls"] if snap is not None else {}
    for result in ("ok", "error"):
        c.add_metric([result], polls.get(result, 0))
    yield c
    c = CounterMetricFamily("fabricmon_remote_evidence_malformed_alerts",
                            "Entries of Alertmanager's answers that were not an alert with labels, or named a "
                            "component that does not parse: skipped (they explain nothing here).")
    c.add_metric([], snap["malformed"] if snap is not None else 0)
    yield c
    g = GaugeMetricFamily("fabricmon_remote_evidence_incidents",
                          "Other shards' open fabric incidents in the last fresh read (0 when stale or never read).")
    g.add_metric([], snap["incidents"] if snap is not None else 0)
    yield g
    g = GaugeMetricFamily("fabricmon_remote_evidence_last_success_timestamp_seconds",
                          "Wall time of the last successful read of the other shards' alerts (0: never, or no "
                          "Alertmanager configured).")
    g.add_metric([], snap["last_ok_wall"] if snap is not None else 0.0)
    yield g


def incident_json(inc: Incident) -> dict[str, Any]:
    d = inc.to_dict()
    for k in ("first_seen", "last_seen", "resolved_at"):
        if d[k] is not None:
            d[k] = rfc3339(d[k])
    return d


class HttpApi(RoutedHTTPServer):
    """/metrics, /api/incidents (?state=open|all, ?id=...), /api/nodes, /healthz, /readyz."""

    def __init__(self, engine: Engine, listen: tuple[str, int], sender: AlertmanagerClient | None = None,
                 ready: Callable[[], bool] = lambda: True, grpc_stats: Callable[[], dict[str, Any]] | None = None,
                 web: WebConfig | None = None, reload_status: ReloadStatus | None = None) -> None:
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AggregatorCollector(engine, sender, grpc_stats))
        add_runtime_collectors(self.registry, reload_status)
        self.ready = ready
        super().__init__(listen[0], listen[1], {
            "/": landing_page("fabricmon aggregator",
                              ["/metrics", "/api/incidents", "/api/nodes", "/healthz", "/readyz"]),
            "/metrics": lambda q: (200, render_metrics(self.registry), CONTENT_TYPE_LATEST),
            "/healthz": lambda q: (200, b"ok\n", TEXT),
            "/readyz": probe(lambda: self.ready(), b"ready\n", b"not ready\n"),
            "/api/incidents": self._incidents,
            "/api/nodes": self._nodes,
        }, name="aggregator-http", web=web)

    def _nodes(self, q: dict[str, list[str]]) -> tuple[int, bytes, str]:
        view = self.engine.node_registry.nodes_view()
        for row in view["nodes"]:
            if row["last_seen"] is not None:
                row["last_seen"] = rfc3339(row["last_seen"])
        return 200, json.dumps(view, indent=1).encode(), "application/json"

    def _incidents(self, q: dict[str, list[str]]) -> tuple[int, bytes, str]:
        state = q.get("state", ["all"])[0]
        if state not in ("open", "all"):
            return 400, b"state must be open or all\n", TEXT
        incs = self.engine.incidents(include_resolved=state == "all")
        # sharded: the other shards' incidents that explain stragglers here (``"remote": true``), open by nature
        remote = self.engine.views.explained_remote()
        for r in remote:
            for k in ("first_seen", "last_seen"):
                if r[k] is not None:
                    r[k] = rfc3339(r[k])
        if "id" in q:
            incs = [i for i in incs if i.id in q["id"]]
            remote = [r for r in remote if r["id"] in q["id"]]
        body = [incident_json(i) for i in incs] + remote
        return 200, json.dumps(body, indent=1).encode(), "application/json"
