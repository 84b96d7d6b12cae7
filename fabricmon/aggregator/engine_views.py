"""Read-only views of the engine for the HTTP API and /metrics (http_api.py): incidents, the other
shards' incidents that explain local stragglers, the topology as Prometheus series, and the
self-instrumentation snapshot.  Nothing here changes the engine's state."""

from __future__ import annotations

from typing import Any

from .admission_stage import AdmissionStage
from .detection_tick import DetectionTick
from .engine_state import EngineState, Stage
from .incidents import Incident
from .node_registry import NodeRegistry

# fabricmon_rank_lateness_score per job: its latest ranks only.  One series per GPU of the cluster
# (32,768 at 4,096 nodes) on every scrape would cost more than the rest of /metrics together, and the
# dashboards read topk(10) of it.
LATENESS_EXPORTED_PER_JOB = 32

# EngineViews.topology_series: NIC ports (node, device, port, rail, leaf) and uplinks (leaf, spine)
TopologySeries = tuple[list[tuple[str, str, str, str, str]], list[tuple[str, str]]]


class EngineViews(Stage):
    def __init__(self, state: EngineState, nodes: NodeRegistry, admission: AdmissionStage,
                 detection: DetectionTick) -> None:
        super().__init__(state)
        self.admission = admission
        self.detection = detection
        self.manager = detection.manager
        self.stragglers = detection.stragglers
        self.heartbeats = detection.heartbeats
        self.ras = detection.ras
        self.cross = detection.cross
        # the node registry's, by the names the views call them
        self.unknown_nodes = nodes.unknown_nodes
        self._never_connected = nodes._never_connected
        # topology_series' answer and what it was derived from (it changes only with a reload or a binding)
        self._series: tuple[tuple[object, ...], TopologySeries] | None = None

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

    def topology_series(self) -> TopologySeries:
        """The topology this replica owns, as Prometheus reads it: (node, device, port, rail, leaf) per
        NIC port (named leaves; rail "" on a fat tree) and (leaf, spine) per uplink (spine "" for a leaf
        with none known).  The recording rules take rail and leaf from here.  The same object (read-only)
        until a reload or a hello's binding changes the topology: /metrics renders it once per version."""
        with self.lock:
            topo, reg = self.topology, self.registry
            # the objects themselves are in the key (compared by identity), so an id is never reused
            key = (topo, topo.index.version, reg, reg.topology, reg.shard_units)
            got = self._series
            if got is not None and all(a is b for a, b in zip(got[0], key, strict=True)):
                return got[1]
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
            uplinks = [(leaf, spine) for leaf in sorted(leaves) for spine in (topo.shape.spines_of(leaf) or ("",))]
            series = (ports, uplinks)
            self._series = (key, series)
            return series

    def metrics_snapshot(self) -> dict[str, Any]:
        with self.lock:
            open_counts: dict[tuple[str, str], int] = {}
            for inc in self.manager.open_incidents():
                key = (inc.alertname, inc.component_type)
                open_counts[key] = open_counts.get(key, 0) + 1
            return {
                "agents_connected": sum(1 for ns in self.nodes.values() if ns.connected),
                "agents_unknown": len(self.unknown_nodes()),
                "never_connected": self._never_connected(
                    self.last_tick if self.last_tick is not None else self.cluster_clock.now()),
                "samples_total": self.admission.samples_total,
                "batches_total": self.admission.batches_total,
                "batches_dropped_total": self.admission.batches_dropped_total,
                "switch_side": self.switch_side.stats(),
                "suspicion": {(c.type, c.id): p for c, p in self.detection.suspicion.items()},
                "lateness": self.stragglers.lateness_by_job(top=LATENESS_EXPORTED_PER_JOB),
                "incidents_open": open_counts,
                # one series per open incident and hurt job (bounded by the open incidents)
                "incident_cost": [(inc.alertname, inc.component, i.job, i.job_id, i.gpu_hours_per_hour)
                                  for inc in self.manager.open_incidents() for i in inc.impact],
                "cross_shard": self.cross.stats() if self.cross is not None else None,
                "ticks_total": self.detection.ticks_total,
                "resuming": self.resume.resuming(self.last_tick, self.nodes, self.started_at, self.settings),
                "nccl_ras_sent_total": self.ras.sent_total,
                "nccl_ras_outcomes": dict(self.ras.outcomes),
                "heartbeats_dropped": dict(self.heartbeats.dropped),
                "tick_seconds_last": self.detection.tick_seconds_last,
                "tick_seconds_sum": self.detection.tick_seconds_sum,
                "newest_ts": self.admission.newest_ts,
            }
