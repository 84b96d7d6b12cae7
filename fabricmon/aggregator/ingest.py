"""The ingest stage: one admitted batch's deltas and gauges become typed events and state on components.

Ingest is the hot path (a 4,096-node cluster sends ~4,000 batches of ~1,500 deltas a second): a
delta is skipped on ``delta == 0`` before anything else, then on one dict lookup of its family
(``DELTA_ROUTES``); the few families the detectors use become sparse events (``LinkEvent``,
``GpuEvent``) on the component found by one more dict lookup; every other family costs nothing
more.

Labels are read by name: each route names the labels it reads, and their positions in the
family's series come from ``metrics.SPECS`` (the order the agent and the wire keep), resolved once
when this module is imported, so the hot path indexes a position it already knows.

Adding a family the detectors read: its ``MetricSpec`` in metrics.py, a ``Route`` member, a row in
``DELTA_ROUTES`` or ``GAUGE_ROUTES`` naming the labels it reads, and its branch in
``Ingest.deltas`` / ``Ingest.gauges``.  Adding an event kind: see state.py.
"""

from __future__ import annotations

import math
from enum import Enum, auto

from ..batch import NodeBatch
from ..metrics import SPECS
from .cable_health import CableHealth
from .config import DetectionSettings
from .state import TRAFFIC_CLASS_SUB, Event, GpuEvent, GpuState, LinkEvent, LinkState, NodeState, Registry

# PMA error counters that mean a bad cable / transceiver / port (not congestion)
PMA_ERRORS = frozenset({
    "symbol_error", "port_rcv_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
})
PHY_ERRORS = frozenset({"rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy"})
RETRY_COUNTERS = frozenset({
    "local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "rnr_nak_retry_err",
    "req_transport_retries_exceeded", "roce_adp_retrans", "roce_slow_restart", "duplicate_request",
    # drivers without an mlx5 twin (bnxt_re's old names arrive under these canonical ones):
    # EFA SRD retransmits and remote-health events, irdma's iWARP TCP retransmitted segments
    "retrans_pkts", "retrans_timeout_events", "impaired_remote_conn_events", "unresponsive_remote_events",
    "tcpRetransSegs",
})
GPU_SLOW_REASONS = frozenset({"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})
# Hopper's legacy counters, and Blackwell's NVLink5 COUNT fields (sources/nvml: DCGM's choice of types)
NVLINK_EVENTS = {"replay": GpuEvent.NVLINK_ERR, "crc_flit": GpuEvent.NVLINK_ERR, "crc_data": GpuEvent.NVLINK_ERR,
                 "recovery": GpuEvent.NVLINK_RECOVERY, "rx_errors": GpuEvent.NVLINK_ERR,
                 "local_link_integrity": GpuEvent.NVLINK_ERR, "recovery_failed": GpuEvent.NVLINK_RECOVERY}
LANE_PREFIX, LANE_SUFFIX = "rx_err_lane_", "_phy"  # mlx5 raw per-lane errors: rx_err_lane_<N>_phy


class Route(Enum):
    """What a family the detectors read is, for the ingest stage."""

    # counters (deltas)
    PMA_ERRORS = auto()
    RETRIES = auto()
    CNP = auto()
    XMIT_WAIT = auto()
    PFC_PAUSE = auto()
    PFC_XOFF = auto()
    PFC_STORM = auto()
    PHY_ERRORS = auto()
    FEC_CORRECTED = auto()
    NVLINK_ERRORS = auto()
    XID = auto()
    # gauges
    PORT_STATE = auto()
    PORT_PHYS_STATE = auto()
    PORT_RATE = auto()
    PORT_WIDTH = auto()
    CONFIG_OK = auto()
    NVLINK_UP = auto()
    GPU_THROTTLE = auto()
    GPU_UP = auto()
    PORT_DATA_RATE = auto()
    RX_POWER = auto()
    MODULE_TEMPERATURE = auto()
    XOFF_FULL_RATE = auto()
    JOB_GPU = auto()


def _at(family: str, *names: str) -> tuple[int, ...]:
    """Where the named labels sit in the family's series: resolved once, by name, from metrics.SPECS."""
    labels = SPECS[family].labels
    return tuple(labels.index(n) for n in names)


def _routes(*rows: tuple[str, Route, tuple[str, ...]]) -> dict[str, tuple[Route, tuple[int, ...]]]:
    return {family: (route, _at(family, *names)) for family, route, names in rows}


_PORT = ("device", "port")
# family -> (route, positions of the labels the route reads, in the order named here)
DELTA_ROUTES = _routes(
    ("fabricmon_ib_port_errors_total", Route.PMA_ERRORS, (*_PORT, "counter")),
    ("fabricmon_rdma_transport_retries_total", Route.RETRIES, (*_PORT, "counter")),
    ("fabricmon_roce_cnp_sent_total", Route.CNP, _PORT),
    ("fabricmon_roce_cnp_handled_total", Route.CNP, _PORT),
    ("fabricmon_roce_ecn_marked_packets_total", Route.CNP, _PORT),
    ("fabricmon_ib_port_transmit_wait_total", Route.XMIT_WAIT, _PORT),
    ("fabricmon_pfc_pause_seconds_total", Route.PFC_PAUSE, ("interface", "priority", "direction")),
    # frames-only pause (ice: per traffic class; a table's per-priority frames where it gives no time)
    ("fabricmon_pfc_frames_by_traffic_class_total", Route.PFC_XOFF,
     ("interface", "traffic_class", "direction", "type")),
    ("fabricmon_pfc_pause_frames_total", Route.PFC_XOFF, ("interface", "priority", "direction")),
    ("fabricmon_pfc_pause_storm_events_total", Route.PFC_STORM, ("interface",)),
    ("fabricmon_netdev_phy_errors_total", Route.PHY_ERRORS, ("interface", "counter")),
    ("fabricmon_nvlink_errors_total", Route.NVLINK_ERRORS, ("gpu", "link", "type")),
    ("fabricmon_gpu_xid_errors_total", Route.XID, ("gpu", "xid")),
    ("fabricmon_netdev_phy_corrected_bit_total", Route.FEC_CORRECTED, ("interface",)),
)
GAUGE_ROUTES = _routes(
    ("fabricmon_ib_port_state", Route.PORT_STATE, _PORT),
    ("fabricmon_ib_port_physical_state", Route.PORT_PHYS_STATE, _PORT),
    ("fabricmon_ib_port_rate_bytes_per_second", Route.PORT_RATE, _PORT),
    ("fabricmon_ib_port_width_lanes", Route.PORT_WIDTH, _PORT),
    ("fabricmon_fabric_config_ok", Route.CONFIG_OK, ("device", "check")),
    ("fabricmon_nvlink_up", Route.NVLINK_UP, ("gpu", "link")),
    ("fabricmon_gpu_throttle_reason", Route.GPU_THROTTLE, ("gpu", "reason")),
    ("fabricmon_gpu_up", Route.GPU_UP, ("gpu",)),
    ("fabricmon_ib_port_data_rate_bytes_per_second", Route.PORT_DATA_RATE, _PORT),
    ("fabricmon_transceiver_rx_power_watts", Route.RX_POWER, (*_PORT, "lane")),
    ("fabricmon_transceiver_temperature_celsius", Route.MODULE_TEMPERATURE, _PORT),
    ("fabricmon_pfc_xoff_refresh_frames_per_second", Route.XOFF_FULL_RATE, ("interface",)),
    ("fabricmon_job_gpu_info", Route.JOB_GPU, ("hpc_job", "job_id", "gpu")),
)
# family -> position of the label naming the hardware whose counters a reset restarts
RESET_OWNER: dict[str, int] = {
    family: next(i for i, n in enumerate(spec.labels) if n in ("device", "interface", "gpu"))
    for family, spec in SPECS.items() if {"device", "interface", "gpu"} & set(spec.labels)
}
_DELTA_MEMBERS = (Route.PMA_ERRORS, Route.RETRIES, Route.CNP, Route.XMIT_WAIT, Route.PFC_PAUSE, Route.PFC_STORM,
                  Route.PHY_ERRORS, Route.FEC_CORRECTED, Route.NVLINK_ERRORS, Route.XID, Route.PFC_XOFF)
_GAUGE_MEMBERS = (Route.PORT_STATE, Route.PORT_PHYS_STATE, Route.PORT_RATE, Route.PORT_WIDTH, Route.CONFIG_OK,
                  Route.NVLINK_UP, Route.GPU_THROTTLE, Route.GPU_UP, Route.PORT_DATA_RATE, Route.RX_POWER,
                  Route.MODULE_TEMPERATURE, Route.XOFF_FULL_RATE, Route.JOB_GPU)
_LINK_EVENTS = tuple(LinkEvent)  # ERR .. PAUSE_RX, in their order


class Ingest:
    """Applies one node's admitted batch to the registry's state (the engine admits, this applies)."""

    def __init__(self, registry: Registry, settings: DetectionSettings, cable: CableHealth) -> None:
        self.registry = registry
        self.cable = cable
        self.configure(settings)

    def configure(self, settings: DetectionSettings) -> None:
        """The thresholds and the XIDs and config checks that count (again on a reload)."""
        self.settings = settings
        self._fatal_xids = frozenset(str(x) for x in settings.xid_fatal)
        self._config_checks = frozenset(settings.config_checks)

    def _port(self, ns: NodeState, device: str, port: str) -> LinkState | None:
        link = ns.links.get((device, port), _MISSING)
        if link is _MISSING:
            return self.registry.link(ns, device, port, None)
        return link  # type: ignore[return-value]  # not _MISSING: a LinkState or None

    def _gpu(self, ns: NodeState, gpu: str) -> GpuState | None:
        return ns.gpus.get(gpu) or self.registry.gpu(ns, gpu)

    def deltas(self, ns: NodeState, batch: NodeBatch) -> None:
        s = self.settings
        ts = batch.ts
        iv = batch.interval_seconds if batch.interval_seconds > 0 else ns.interval
        routes = DELTA_ROUTES
        # enum members as locals: an Enum class attribute costs ~0.7 us in CPython 3.11, and this loop
        # runs once per delta
        (pma_errors, retries, cnp_r, xmit_wait, pfc_pause, pfc_storm, phy_errors, fec_corrected, nvlink_errors,
         xid_r, pfc_xoff) = _DELTA_MEMBERS
        err, recov, downed, phy, retry, storm, cnp_e, xwait, pause_tx, pause_rx = _LINK_EVENTS
        gpu_xid = GpuEvent.XID
        pending: list[tuple[LinkState | GpuState, Event]] = []
        # (link, bits, lane or None): FEC-corrected bits for cable_health
        cable: list[tuple[LinkState, float, int | None]] = []
        resets: set[str] = set()
        by_netdev = ns.by_netdev
        retry_floor = 0.1 * s.retries_min * min(1.0, iv / s.window_s)
        for d in batch.deltas:
            # SEAM (metric kind): the series' kind (counter or gauge) is read here once it travels with
            # the series definition; a gauge's decrease is never a reset
            if d.reset:
                # the device (or interface, or GPU) whose counters began again: its events in this
                # batch are not evidence
                at_owner = RESET_OWNER.get(d.family)
                if at_owner is not None and at_owner < len(d.labels):
                    resets.add(d.labels[at_owner][1])
                continue
            v = d.delta
            if not v:
                continue
            hit = routes.get(d.family)
            if hit is None:
                continue
            route, at = hit
            lab = d.labels
            if route is pma_errors:
                counter = lab[at[2]][1]
                if counter in PMA_ERRORS:
                    kind = err
                elif counter == "link_error_recovery":
                    kind = recov
                elif counter == "link_downed":
                    kind = downed
                else:
                    continue
                link = self._port(ns, lab[at[0]][1], lab[at[1]][1])
                if link is not None:
                    pending.append((link, (ts, kind, v, 0)))
            elif route is retries:
                # a few retries now and then are normal: keep only what could reach the threshold
                if v < retry_floor or lab[at[2]][1] not in RETRY_COUNTERS:
                    continue
                link = self._port(ns, lab[at[0]][1], lab[at[1]][1])
                if link is not None:
                    pending.append((link, (ts, retry, v, 0)))
            elif route is cnp_r or route is xmit_wait:
                # congestion counters are normal at low rates: keep only what could matter
                cnp = route is cnp_r
                if v < 0.2 * iv * (s.cnp_rate_min if cnp else s.xmit_wait_rate_min):
                    continue
                link = self._port(ns, lab[at[0]][1], lab[at[1]][1])
                if link is not None:
                    pending.append((link, (ts, cnp_e if cnp else xwait, v, 0)))
            elif route is pfc_pause:
                tx = lab[at[2]][1] == "tx"
                if v < (0.05 if tx else 0.02) * iv:
                    continue  # background pauses: a few microseconds
                link = by_netdev.get(lab[at[0]][1])
                if link is not None:
                    try:
                        prio = int(lab[at[1]][1])
                    except ValueError:
                        continue
                    pending.append((link, (ts, pause_tx if tx else pause_rx, v, prio)))
            elif route is pfc_xoff:
                # XOFF frames of a driver that counts no pause time: over the frames a port sends while
                # paused without a break (the agent's per-driver gauge) they are the share of time paused,
                # the same evidence as pause seconds; a driver that gives time has no gauge and is skipped
                link = by_netdev.get(lab[at[0]][1])
                if link is None or not link.xoff_full_rate:
                    continue
                if len(at) == 4 and lab[at[3]][1] != "xoff":
                    continue  # XON ends a pause
                paused = v / link.xoff_full_rate
                tx = lab[at[2]][1] == "tx"
                if paused < (0.05 if tx else 0.02) * iv:
                    continue
                try:
                    # a traffic class is not a priority: it is kept apart (sub 8..15) so the finding says which
                    sub = int(lab[at[1]][1]) + (TRAFFIC_CLASS_SUB if len(at) == 4 else 0)
                except ValueError:
                    continue
                pending.append((link, (ts, pause_tx if tx else pause_rx, paused, sub)))
            elif route is pfc_storm:
                link = by_netdev.get(lab[at[0]][1])
                if link is not None:
                    pending.append((link, (ts, storm, v, 0)))
            elif route is phy_errors:
                counter = lab[at[1]][1]
                if counter in PHY_ERRORS:
                    link = by_netdev.get(lab[at[0]][1])
                    if link is not None:
                        pending.append((link, (ts, phy, v, 0)))
                elif counter.startswith(LANE_PREFIX):
                    # raw per-lane errors before FEC (mlx5 counters.rst): the FEC corrects them, so they
                    # are a margin (cable_health), not link errors
                    link = by_netdev.get(lab[at[0]][1])
                    if link is not None:
                        try:
                            cable.append((link, v, int(counter[len(LANE_PREFIX):-len(LANE_SUFFIX)])))
                        except ValueError:
                            continue
            elif route is fec_corrected:
                link = by_netdev.get(lab[at[0]][1])
                if link is not None:
                    cable.append((link, v, None))
            elif route is nvlink_errors:
                gkind = NVLINK_EVENTS.get(lab[at[2]][1])
                if gkind is None:
                    continue
                g = self._gpu(ns, lab[at[0]][1])
                if g is not None:
                    try:
                        pending.append((g, (ts, gkind, v, int(lab[at[1]][1]))))
                    except ValueError:
                        continue
            elif route is xid_r:
                xid = lab[at[1]][1]
                if xid in self._fatal_xids:
                    g = self._gpu(ns, lab[at[0]][1])
                    if g is not None:
                        pending.append((g, (ts, gpu_xid, v, int(xid))))
        if ns.grace_batches > 0:
            ns.grace_batches -= 1
            return  # first batch after a reboot: deltas are not evidence
        for link, bits, lane in cable:
            if not (link.device in resets or link.netdev in resets):
                self.cable.corrected(link, ts, bits, iv, lane)
        if not pending:
            return
        active_links, active_gpus = self.registry.active_links, self.registry.active_gpus
        for target, ev in pending:
            if resets:
                if isinstance(target, LinkState):
                    if target.device in resets or target.netdev in resets:
                        continue
                elif str(target.index) in resets:
                    continue
            target.ev.append(ev)
            if isinstance(target, LinkState):
                active_links.add(target)
            else:
                active_gpus.add(target)

    def gauges(self, ns: NodeState, batch: NodeBatch) -> None:
        ts = batch.ts
        reg = self.registry
        (port_state, port_phys, port_rate, port_width, config_ok, nvlink_up, gpu_throttle, gpu_up, data_rate,
         rx_power, _temperature, xoff_full, job_gpu) = _GAUGE_MEMBERS  # as locals: see deltas
        touched: set[LinkState] = set()
        for g in batch.gauges:
            hit = GAUGE_ROUTES.get(g.family)
            if hit is None:
                continue
            route, at = hit
            lab = g.labels
            v = g.value
            if route is port_state or route is port_phys or route is port_rate or route is port_width:
                link = self._port(ns, lab[at[0]][1], lab[at[1]][1])
                if link is None:
                    continue
                if route is port_state:
                    link.state = int(v)
                elif route is port_phys:
                    link.phys = int(v)
                elif route is port_rate:
                    link.rate_bps = v
                else:
                    link.width = int(v)
                touched.add(link)
            elif route is config_ok:
                check = lab[at[1]][1]
                if check not in self._config_checks:
                    continue
                fails = ns.config_fail.setdefault(lab[at[0]][1], {})
                if v == 0:
                    fails.setdefault(check, ts)
                    reg.config_nodes.add(ns.name)
                else:
                    fails.pop(check, None)
            elif route is nvlink_up:
                gs = reg.gpu(ns, lab[at[0]][1])
                if gs is None:
                    continue
                try:
                    link_no = int(lab[at[1]][1])
                except ValueError:
                    continue
                if v == 0:
                    gs.nvl_down.setdefault(link_no, ts)
                    reg.active_gpus.add(gs)
                else:
                    gs.nvl_down.pop(link_no, None)
            elif route is gpu_throttle:
                reason = lab[at[1]][1]
                if reason in GPU_SLOW_REASONS:
                    gs = reg.gpu(ns, lab[at[0]][1])
                    if gs is None:
                        continue
                    if v:
                        gs.throttle.add(reason)
                        reg.active_gpus.add(gs)
                    else:
                        gs.throttle.discard(reason)
            elif route is gpu_up:
                gs = reg.gpu(ns, lab[at[0]][1])
                if gs is not None:
                    gs.up = bool(v)
            elif route is job_gpu:  # the schedulers' job -> GPU map (aggregator/job_gpus.py)
                reg.job_gpus.set(ns.name, lab[at[0]][1], lab[at[1]][1], lab[at[2]][1], v > 0)
            elif route is xoff_full:
                link = ns.by_netdev.get(lab[at[0]][1])
                if link is not None:
                    link.xoff_full_rate = v if v > 0 and math.isfinite(v) else None
            else:  # data rate and module readings: cable_health
                link = self._port(ns, lab[at[0]][1], lab[at[1]][1])
                if link is None:
                    continue
                if route is data_rate:
                    self.cable.data_rate(link, v)
                elif route is rx_power:
                    try:
                        self.cable.rx_power(link, ts, int(lab[at[2]][1]), v)
                    except (ValueError, IndexError):
                        continue
                else:
                    self.cable.temperature(link, ts, v)
        for link in touched:
            down = link.note_state(ts)
            deg, _ = link.is_degraded(self.settings.degraded_rate_ratio)
            if deg:
                if link.degraded_since is None:
                    link.degraded_since = ts
            else:
                link.degraded_since = None
            if down or deg or link.trans:
                reg.active_links.add(link)


_MISSING = object()
