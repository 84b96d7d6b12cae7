"""The aggregator's core: ingest agent batches, run detectors and the correlator on sample time.

``Engine(topology, settings)`` is driven by whoever owns the clock: the gRPC
service calls ``hello``/``ingest``/``disconnected`` as streams deliver and
``tick(now)`` at the newest sample time every quarter second; the simulator
and the tests call the same methods in memory.  Nothing here reads the wall
clock for windows, persistence or incident times: those run on the sample
time ``ts`` the agents stamped (``clock`` only times the tick for /metrics).

Ingest is the hot path (a 4,096-node cluster sends ~4,000 batches of ~1,500
deltas a second): a delta is skipped on ``delta == 0`` before anything else,
then on one dict lookup of its family; the few families the detectors use
become sparse events on the component found by one more dict lookup; every
other family costs nothing more.  All methods are thread-safe (one lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from ..batch import NodeBatch, NodeHello
from ..topology import Topology
from .admission import ClusterClock
from .agents_down import agents_down, restart_grace, unknown_nodes_finding
from .lateness import node_time, scale_holds
from .node_folding import NodeFolder
from .config import DetectionSettings
from .cable_health import CableHealth
from .correlator import correlate
from .detectors import (
    E_CNP, E_DOWNED, E_ERR, E_PHY, E_PRX, E_PTX, E_RECOV, E_RETRY, E_STORM, E_XWAIT, FOLDABLE, G_NVERR,
    G_NVRECOV, G_XID, GPU_SLOW_REASONS, PHY_ERRORS, PMA_ERRORS, RETRY_COUNTERS, GpuState, LinkState, NodeState,
    build_link_state, congestion_of, evaluate_gpu, evaluate_link,
)
from .drift import config_drift
from .folding import LeafFolder
from .cost import IncidentCost
from .hangs import HeartbeatTracker, hung_job_findings
from .incidents import Finding, Incident, IncidentManager, Relation
from .stragglers import StragglerTracker

# delta families the detectors use -> handler code
_F_PMA, _F_RETRY, _F_CNP, _F_XWAIT, _F_PAUSE, _F_STORM, _F_PHY, _F_NVL, _F_XID, _F_CORR = range(10)
DELTA_FAMILIES: dict[str, int] = {
    "fabricmon_ib_port_errors_total": _F_PMA,
    "fabricmon_rdma_transport_retries_total": _F_RETRY,
    "fabricmon_roce_cnp_sent_total": _F_CNP,
    "fabricmon_roce_cnp_handled_total": _F_CNP,
    "fabricmon_roce_ecn_marked_packets_total": _F_CNP,
    "fabricmon_ib_port_transmit_wait_total": _F_XWAIT,
    "fabricmon_pfc_pause_seconds_total": _F_PAUSE,
    "fabricmon_pfc_pause_storm_events_total": _F_STORM,
    "fabricmon_netdev_phy_errors_total": _F_PHY,
    "fabricmon_nvlink_errors_total": _F_NVL,
    "fabricmon_gpu_xid_errors_total": _F_XID,
    "fabricmon_netdev_phy_corrected_bit_total": _F_CORR,
}
# what the stream decoder needs to build for this engine; other families are only counted
READ_DELTA_FAMILIES = frozenset(DELTA_FAMILIES)
# fabricmon_rank_lateness_score per job: its latest ranks only.  One series per GPU of the cluster
# (32,768 at 4,096 nodes) on every scrape would cost more than the rest of /metrics together, and the
# dashboards read topk(10) of it.
LATENESS_EXPORTED_PER_JOB = 32
_G_STATE, _G_PHYS, _G_RATE, _G_WIDTH, _G_CONFIG, _G_NVUP, _G_THROTTLE, _G_GPUUP, _G_DATA, _G_RXPOW, _G_TEMP = range(11)
GAUGE_FAMILIES: dict[str, int] = {
    "fabricmon_ib_port_state": _G_STATE,
    "fabricmon_ib_port_physical_state": _G_PHYS,
    "fabricmon_ib_port_rate_bytes_per_second": _G_RATE,
    "fabricmon_ib_port_width_lanes": _G_WIDTH,
    "fabricmon_fabric_config_ok": _G_CONFIG,
    "fabricmon_nvlink_up": _G_NVUP,
    "fabricmon_gpu_throttle_reason": _G_THROTTLE,
    "fabricmon_gpu_up": _G_GPUUP,
    "fabricmon_ib_port_data_rate_bytes_per_second": _G_DATA,
    "fabricmon_transceiver_rx_power_watts": _G_RXPOW,
    "fabricmon_transceiver_temperature_celsius": _G_TEMP,
}
# Hopper's legacy counters, and Blackwell's NVLink5 COUNT fields (sources/nvml: DCGM's choice of types)
_NVL_KIND = {"replay": G_NVERR, "crc_flit": G_NVERR, "crc_data": G_NVERR, "recovery": G_NVRECOV,
             "rx_errors": G_NVERR, "local_link_integrity": G_NVERR, "recovery_failed": G_NVRECOV}
_MISSING = object()
_log = structlog.get_logger("fabricmon.aggregator.engine")


class Engine:
    # what the detectors read: the stream decoder builds only these deltas (proto/codec.py), and
    # agents are told to send only these (proto/subscription.py)
    read_delta_families = READ_DELTA_FAMILIES
    read_gauge_families = frozenset(GAUGE_FAMILIES)

    def __init__(self, topology: Topology, settings: DetectionSettings | None = None,
                 clock: Callable[[], float] | None = None, *, cluster: str | None = None,
                 shard_units: tuple[int, ...] | None = None, cluster_clock: ClusterClock | None = None) -> None:
        self.topology = topology
        self.settings = s = settings or DetectionSettings()
        self.clock = clock or time.perf_counter
        self.cluster = cluster if cluster is not None else topology.cluster
        self.shard_units = frozenset(shard_units) if shard_units else None
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeState] = {}
        self.links_by_leaf: dict[str, list[LinkState]] = {}
        self.active_links: set[LinkState] = set()
        self.active_gpus: set[GpuState] = set()
        self.config_nodes: set[str] = set()
        self.stragglers = StragglerTracker(s)
        self.heartbeats = HeartbeatTracker()
        self.cost = IncidentCost(topology)
        self.cable = CableHealth(s)
        self.manager = IncidentManager(default_hold_s=s.hold_s)
        self.folder = LeafFolder(s, self.cluster, self.links_by_leaf)
        self.node_folder = NodeFolder(s, self.cluster, self._rail_links)
        self._fatal_xids = frozenset(str(x) for x in s.xid_fatal)
        self._config_checks = frozenset(s.config_checks)
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
        self._first_tick: float | None = None
        self.last_tick = None
        self.started_at: float | None = None  # sample time of the first tick (agents_down's restart grace)
        self.suspicion: dict[tuple[str, str], float] = {}
        for name, spec in topology.nodes.items():
            if self.shard_units is not None and spec.unit not in self.shard_units:
                continue
            ns = self._node(name)
            for nic in spec.nics:
                self._link(ns, nic.device, str(nic.port), None)

    # ------------------------------------------------------------------ state helpers
    def _node(self, name: str) -> NodeState:
        ns = self.nodes.get(name)
        if ns is None:
            spec = self.topology.nodes.get(name)
            ns = NodeState(name, spec.unit if spec is not None else None)
            self.nodes[name] = ns
        return ns

    def _link(self, ns: NodeState, device: str, port: str, hello_rail: str | None,
              netdev: str = "") -> LinkState | None:
        link = ns.links.get((device, port), _MISSING)
        if link is not _MISSING:
            return link  # type: ignore[return-value]
        link = build_link_state(self.topology, ns.name, device, port, netdev, hello_rail, self.cluster)
        ns.links[(device, port)] = link
        if link is not None:
            ns.by_device.setdefault(device, link)
            if netdev:
                ns.by_netdev[netdev] = link
            if link.leaf:
                self.links_by_leaf.setdefault(link.leaf, []).append(link)
        return link

    def _gpu(self, ns: NodeState, gpu: str) -> GpuState | None:
        g = ns.gpus.get(gpu)
        if g is None:
            try:
                idx = int(gpu)
            except ValueError:
                return None
            leaf, rail = "", None
            if ns.name in self.topology.nodes:
                nic = self.topology.nic_for_gpu(ns.name, idx)
                if nic is not None:
                    rail, leaf = nic.rail, self.topology.leaf_of(ns.name, nic.rail)
            g = ns.gpus[gpu] = GpuState(ns.name, idx, leaf, rail, self.cluster)
        return g

    def _owned(self, node: str) -> bool:
        """A replica owns its units' nodes, and any node the topology does not know that streams to
        it: agents that find no unit dial ``shard.unknown_owner``, and one whose Kubernetes label names
        a unit this topology lacks lands on that unit's owner.  Dropping either would blind it."""
        if self.shard_units is None:
            return True
        spec = self.topology.nodes.get(node)
        return spec is None or spec.unit in self.shard_units

    def _note_unknown(self, node: str) -> None:
        if node in self.topology.nodes or node in self._unknown_warned:
            return
        self._unknown_warned.add(node)  # once per node: a reconnecting agent would log every time
        _log.warning("unknown_node", node=node, cluster=self.cluster,
                     hint="not in the topology: monitored at node, NIC, link and GPU level without rail or leaf "
                          "(add it to the topology, or check the agent's --node-name)")

    def nodes_view(self) -> dict:
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
        if self._first_tick is None:
            return []
        iv = max((ns.interval for ns in self.nodes.values()), default=1.0)
        if now - self._first_tick < restart_grace(self.settings, iv):
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
        if not self._owned(hello.node):
            return
        with self.lock:
            self._note_unknown(hello.node)
            ns = self._node(hello.node)
            if ns.boot_id and hello.boot_id and hello.boot_id != ns.boot_id:
                ns.grace_batches = 1  # counters began again: the first deltas are not evidence
            if hello.boot_id:
                ns.boot_id = hello.boot_id
            if hello.interval_seconds > 0:
                ns.interval = hello.interval_seconds
            ns.connected = True
            self.cluster_clock.connected(hello.node)
            for nic in hello.nics:
                if ns.links.get((nic.device, str(nic.port)), _MISSING) is None:
                    del ns.links[(nic.device, str(nic.port))]  # seen in a batch before its hello
                link = self._link(ns, nic.device, str(nic.port), nic.rail, nic.netdev)
                if link is not None and link.rail is None and nic.rail.isdigit() and ns.name not in self.topology.nodes:
                    link.rail = int(nic.rail)  # an unknown node's link seen in a batch before the hello
                if link is not None and nic.netdev:
                    link.netdev = nic.netdev
                    ns.by_netdev[nic.netdev] = link

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
                if not self._owned(batch.node):
                    return False
                self._note_unknown(batch.node)
                ns = self._node(batch.node)
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
                ns.interval = batch.interval_seconds
            self.batches_total += 1
            self.samples_total += len(batch.deltas) + batch.unread_deltas + len(batch.gauges) + len(batch.ranks)
            if batch.deltas:
                self._deltas(ns, batch)
            if batch.gauges:
                self._gauges(ns, batch)
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

    def _deltas(self, ns: NodeState, batch: NodeBatch) -> None:
        s = self.settings
        ts = batch.ts
        iv = batch.interval_seconds if batch.interval_seconds > 0 else ns.interval
        families = DELTA_FAMILIES
        pending: list = []
        cable: list = []  # (link, bits, lane or None): FEC-corrected bits for cable_health
        resets: set[str] = set()
        links = ns.links
        retry_floor = 0.1 * s.retries_min * min(1.0, iv / s.window_s)
        for d in batch.deltas:
            if d.reset:
                resets.add(d.labels[0][1] if d.labels else "")
                continue
            v = d.delta
            if not v:
                continue
            code = families.get(d.family)
            if code is None:
                continue
            lab = d.labels
            if code == _F_PMA:
                counter = lab[2][1]
                if counter in PMA_ERRORS:
                    kind = E_ERR
                elif counter == "link_error_recovery":
                    kind = E_RECOV
                elif counter == "link_downed":
                    kind = E_DOWNED
                else:
                    continue
                link = links.get((lab[0][1], lab[1][1]), _MISSING)
                if link is _MISSING:
                    link = self._link(ns, lab[0][1], lab[1][1], None)
                if link is not None:
                    pending.append((link, (ts, kind, v, 0)))
            elif code == _F_RETRY:
                # a few retries now and then are normal: keep only what could reach the threshold
                if v < retry_floor or lab[2][1] not in RETRY_COUNTERS:
                    continue
                link = links.get((lab[0][1], lab[1][1]), _MISSING)
                if link is _MISSING:
                    link = self._link(ns, lab[0][1], lab[1][1], None)
                if link is not None:
                    pending.append((link, (ts, E_RETRY, v, 0)))
            elif code == _F_CNP or code == _F_XWAIT:
                # congestion counters are normal at low rates: keep only what could matter
                floor = 0.2 * iv * (s.cnp_rate_min if code == _F_CNP else s.xmit_wait_rate_min)
                if v < floor:
                    continue
                link = links.get((lab[0][1], lab[1][1]), _MISSING)
                if link is _MISSING:
                    link = self._link(ns, lab[0][1], lab[1][1], None)
                if link is not None:
                    pending.append((link, (ts, E_CNP if code == _F_CNP else E_XWAIT, v, 0)))
            elif code == _F_PAUSE:
                tx = lab[2][1] == "tx"
                if v < (0.05 if tx else 0.02) * iv:
                    continue  # background pauses: a few microseconds
                link = ns.by_netdev.get(lab[0][1])
                if link is not None:
                    try:
                        prio = int(lab[1][1])
                    except ValueError:
                        continue
                    pending.append((link, (ts, E_PTX if tx else E_PRX, v, prio)))
            elif code == _F_STORM:
                link = ns.by_netdev.get(lab[0][1])
                if link is not None:
                    pending.append((link, (ts, E_STORM, v, 0)))
            elif code == _F_PHY:
                counter = lab[1][1]
                if counter in PHY_ERRORS:
                    link = ns.by_netdev.get(lab[0][1])
                    if link is not None:
                        pending.append((link, (ts, E_PHY, v, 0)))
                elif counter.startswith("rx_err_lane_"):
                    # raw per-lane errors before FEC (mlx5 counters.rst): the FEC corrects them, so they
                    # are a margin (cable_health), not link errors
                    link = ns.by_netdev.get(lab[0][1])
                    if link is not None:
                        try:
                            cable.append((link, v, int(counter[len("rx_err_lane_"):-len("_phy")])))
                        except ValueError:
                            continue
            elif code == _F_CORR:
                link = ns.by_netdev.get(lab[0][1])
                if link is not None:
                    cable.append((link, v, None))
            elif code == _F_NVL:
                kind = _NVL_KIND.get(lab[2][1])
                if kind is None:
                    continue
                g = ns.gpus.get(lab[0][1]) or self._gpu(ns, lab[0][1])
                if g is not None:
                    try:
                        pending.append((g, (ts, kind, v, int(lab[1][1]))))
                    except ValueError:
                        continue
            elif code == _F_XID:
                if lab[1][1] in self._fatal_xids:
                    g = ns.gpus.get(lab[0][1]) or self._gpu(ns, lab[0][1])
                    if g is not None:
                        pending.append((g, (ts, G_XID, v, int(lab[1][1]))))
        if ns.grace_batches > 0:
            ns.grace_batches -= 1
            return  # first batch after a reboot: deltas are not evidence
        for link, v, lane in cable:
            if not (link.device in resets or link.netdev in resets):
                self.cable.corrected(link, ts, v, iv, lane)
        if not pending:
            return
        for target, ev in pending:
            if resets:
                if isinstance(target, LinkState):
                    if target.device in resets or target.netdev in resets:
                        continue
                elif str(target.index) in resets:
                    continue
            target.ev.append(ev)
            if isinstance(target, LinkState):
                self.active_links.add(target)
            else:
                self.active_gpus.add(target)

    def _gauges(self, ns: NodeState, batch: NodeBatch) -> None:
        ts = batch.ts
        touched: set[LinkState] = set()
        for g in batch.gauges:
            code = GAUGE_FAMILIES.get(g.family)
            if code is None:
                continue
            lab = g.labels
            v = g.value
            if code <= _G_WIDTH:
                link = ns.links.get((lab[0][1], lab[1][1]), _MISSING)
                if link is _MISSING:
                    link = self._link(ns, lab[0][1], lab[1][1], None)
                if link is None:
                    continue
                if code == _G_STATE:
                    link.state = int(v)
                elif code == _G_PHYS:
                    link.phys = int(v)
                elif code == _G_RATE:
                    link.rate_bps = v
                else:
                    link.width = int(v)
                touched.add(link)
            elif code == _G_CONFIG:
                check = lab[2][1]
                if check not in self._config_checks:
                    continue
                dev = lab[0][1]
                fails = ns.config_fail.setdefault(dev, {})
                if v == 0:
                    fails.setdefault(check, ts)
                    self.config_nodes.add(ns.name)
                else:
                    fails.pop(check, None)
            elif code == _G_NVUP:
                gs = self._gpu(ns, lab[0][1])
                if gs is None:
                    continue
                try:
                    link_no = int(lab[1][1])
                except ValueError:
                    continue
                if v == 0:
                    gs.nvl_down.setdefault(link_no, ts)
                    self.active_gpus.add(gs)
                else:
                    gs.nvl_down.pop(link_no, None)
            elif code == _G_THROTTLE:
                if lab[1][1] in GPU_SLOW_REASONS:
                    gs = self._gpu(ns, lab[0][1])
                    if gs is None:
                        continue
                    if v:
                        gs.throttle.add(lab[1][1])
                        self.active_gpus.add(gs)
                    else:
                        gs.throttle.discard(lab[1][1])
            elif code == _G_GPUUP:
                gs = self._gpu(ns, lab[0][1])
                if gs is not None:
                    gs.up = bool(v)
            else:  # data rate and module readings: cable_health
                link = ns.links.get((lab[0][1], lab[1][1]), _MISSING)
                if link is _MISSING:
                    link = self._link(ns, lab[0][1], lab[1][1], None)
                if link is None:
                    continue
                if code == _G_DATA:
                    self.cable.data_rate(link, v)
                elif code == _G_RXPOW:
                    try:
                        self.cable.rx_power(link, ts, int(lab[2][1]), v)
                    except (ValueError, IndexError):
                        continue
                else:
                    self.cable.temperature(link, ts, v)
        for link in touched:
            down = link.is_down()
            if down and link.down_since is None:
                link.down_since = ts
                if link.seen_up:
                    link.trans.append(ts)
            elif not down:
                link.down_since = None
                if link.state is not None:
                    link.seen_up = True
            deg, _ = link.is_degraded(self.settings.degraded_rate_ratio)
            if deg:
                if link.degraded_since is None:
                    link.degraded_since = ts
            else:
                link.degraded_since = None
            if down or deg or link.trans:
                self.active_links.add(link)

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
            corr = correlate(self.topology, self.settings, findings, report, throttled, fresh, self.cluster,
                             self.manager.open_keys())
            findings.extend(corr.findings)
            self.suspicion = corr.suspicion
            self.cost.annotate(findings, self.manager, now, self.stragglers)
            scale_holds(findings, self._interval_of, self.settings.hold_s)
            changed = self.manager.update(findings, now, relations)
            self.last_tick = now
            if self._first_tick is None:
                self._first_tick = now
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
        foldable: dict[str, list[tuple[LinkState, list[Finding]]]] = {}
        congested: dict[str, list[tuple[LinkState, Finding]]] = {}
        for link in list(self.active_links):
            w = self._window(link.node)
            ns = self.nodes.get(link.node)
            t = now if ns is None else node_time(now, ns.last_ts, ns.interval)  # a late batch still counts
            fs = evaluate_link(link, t, w, s)
            cong = congestion_of(link, t, w, s)
            fold = [f for f in fs if f.alertname in FOLDABLE and (f.fire or f.keep)]
            if fold and link.leaf:
                foldable.setdefault(link.leaf, []).append((link, fold))
                findings.extend(f for f in fs if f.alertname not in FOLDABLE)
            else:
                findings.extend(fs)
            if cong is not None:
                congested.setdefault(link.leaf or link.id, []).append((link, cong))
            if not link.ev and not link.trans and link.down_since is None and link.degraded_since is None:
                self.active_links.discard(link)
        # --- cable health: warn before a link flaps; not on top of a link that already alerts ---
        loud = {f.component for f in findings if f.component_type == "link" and f.fire
                and f.alertname in ("FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors")}
        findings.extend(self.cable.evaluate(now, loud))
        node_findings, node_relations = self.node_folder.fold(foldable, now)
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
        findings.extend(hung_job_findings(self.heartbeats.hangs(now), self._rank_gpu, self.cluster))
        return findings, relations

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

    def agents_connected(self) -> int:
        with self.lock:
            return sum(1 for ns in self.nodes.values() if ns.connected)

    def metrics_snapshot(self) -> dict:
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
                "suspicion": dict(self.suspicion),
                "lateness": self.stragglers.lateness_scores(top=LATENESS_EXPORTED_PER_JOB),
                "incidents_open": open_counts,
                # one series per open incident and hurt job (bounded by the open incidents)
                "incident_cost": [(inc.alertname, inc.component, i.job, i.gpu_hours_per_hour)
                                  for inc in self.manager.open_incidents() for i in inc.impact],
                "ticks_total": self.ticks_total,
                "tick_seconds_last": self.tick_seconds_last,
                "tick_seconds_sum": self.tick_seconds_sum,
                "newest_ts": self.newest_ts,
            }
