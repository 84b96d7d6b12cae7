"""Per-component state and the link / GPU fault detectors.

State is kept per component (one ``LinkState`` per NIC port, one ``GpuState``
per GPU), created once and found by dict lookup.  Counter evidence is stored
as sparse events ``(ts, kind, value, sub)`` in a per-component deque: only
non-zero deltas of the few families a detector needs are stored, and
congestion/pause counters only above a small fraction of their thresholds, so
a quiet cluster stores nothing and a tick only visits components with recent
events or unhealthy state (the ``active`` sets).

Windows are on sample time: window ``k`` at tick ``now`` holds the events with
``now - (k+1)W < ts <= now - kW`` where ``W`` is the detection window, at
least the node's poll interval.  Detectors return ``Finding``s with a raise
verdict (persistence applied, e.g. evidence in 2 of the last 3 windows) and a
keep verdict (evidence in the newest window); the incident manager's hold
provides the resolve hysteresis.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ..topology import Topology, gpu_id, link_id, nic_id, nvlink_id
from .config import DetectionSettings
from .incidents import Finding

# link event kinds
E_ERR, E_RECOV, E_DOWNED, E_PHY, E_RETRY, E_STORM, E_CNP, E_XWAIT, E_PTX, E_PRX = range(10)
N_LINK_KINDS = 10
# gpu event kinds
G_NVERR, G_NVRECOV, G_XID = range(3)

ACTIVE_STATES = (4, 5)  # ACTIVE, ACTIVE_DEFER
LINK_UP_PHYS = 5

# PMA error counters that mean a bad cable / transceiver / port (not congestion)
PMA_ERRORS = frozenset({
    "symbol_error", "port_rcv_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
})
PHY_ERRORS = frozenset({"rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy"})
PHY_DOWN = frozenset({"link_down_events_phy"})
RETRY_COUNTERS = frozenset({
    "local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "rnr_nak_retry_err",
    "req_transport_retries_exceeded", "roce_adp_retrans", "roce_slow_restart", "duplicate_request",
    # drivers without an mlx5 twin (bnxt_re's old names arrive under these canonical ones):
    # EFA SRD retransmits and remote-health events, irdma's iWARP TCP retransmitted segments
    "retrans_pkts", "retrans_timeout_events", "impaired_remote_conn_events", "unresponsive_remote_events",
    "tcpRetransSegs",
})
GPU_SLOW_REASONS = frozenset({"HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})

STATE_NAMES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_NAMES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
              6: "LinkErrorRecovery", 7: "PhyTest"}


class LinkState:
    __slots__ = ("id", "node", "device", "port", "netdev", "rail", "unit", "leaf", "nic", "gpu",
                 "exp_gbps", "exp_width", "state", "phys", "rate_bps", "width", "ev", "down_since",
                 "trans", "degraded_since", "evidence_since", "evidence_last", "labels", "seen_up")

    def __init__(self, node: str, device: str, port: str, netdev: str, rail: int | None, unit: int | None,
                 leaf: str, gpu: int, exp_gbps: float | None, exp_width: int | None, cluster: str) -> None:
        self.id = link_id(node, device, port)
        self.node, self.device, self.port, self.netdev = node, device, port, netdev
        self.rail, self.unit, self.leaf, self.gpu = rail, unit, leaf, gpu
        self.nic = nic_id(node, device)
        self.exp_gbps, self.exp_width = exp_gbps, exp_width
        self.state: int | None = None
        self.phys: int | None = None
        self.rate_bps: float | None = None
        self.width: int | None = None
        self.ev: deque = deque()
        self.down_since: float | None = None
        self.trans: deque = deque()  # sample times of up -> down transitions
        self.degraded_since: float | None = None
        self.evidence_since: float | None = None  # start of the current run of fold-able evidence
        self.evidence_last = 0.0
        self.seen_up = False
        lab = {"node": node}
        if rail is not None:
            lab["rail"] = str(rail)
        if leaf:
            lab["leaf"] = leaf
        if cluster:
            lab["cluster"] = cluster
        self.labels = lab

    def is_down(self) -> bool:
        if self.state is not None and self.state not in ACTIVE_STATES:
            return True
        return self.phys is not None and self.phys != LINK_UP_PHYS

    def is_degraded(self, ratio: float) -> tuple[bool, str]:
        if self.is_down() or self.state is None:
            return False, ""
        why = []
        if self.exp_gbps and self.rate_bps is not None and self.rate_bps * 8 / 1e9 < self.exp_gbps * ratio:
            why.append(f"rate {self.rate_bps * 8 / 1e9:g} Gb/s < expected {self.exp_gbps:g}")
        if self.exp_width and self.width is not None and 0 < self.width < self.exp_width:
            why.append(f"width {self.width}X < expected {self.exp_width}X")
        return bool(why), "; ".join(why)


class GpuState:
    __slots__ = ("id", "node", "index", "nvl_down", "ev", "throttle", "up", "labels", "leaf", "rail")

    def __init__(self, node: str, index: int, leaf: str, rail: int | None, cluster: str) -> None:
        self.id = gpu_id(node, index)
        self.node, self.index, self.leaf, self.rail = node, index, leaf, rail
        self.nvl_down: dict[int, float] = {}  # link -> since
        self.ev: deque = deque()
        self.throttle: set[str] = set()
        self.up: bool = True
        lab = {"node": node, "gpu": str(index)}
        if leaf:
            lab["leaf"] = leaf
        if rail is not None:
            lab["rail"] = str(rail)
        if cluster:
            lab["cluster"] = cluster
        self.labels = lab


@dataclass
class NodeState:
    name: str
    unit: int | None
    boot_id: str = ""
    last_seq: int = -1
    last_ts: float = -math.inf
    interval: float = 1.0
    connected: bool = False
    ever_seen: bool = False
    grace_batches: int = 0  # error deltas ignored for this many batches (after a reboot)
    links: dict[tuple[str, str], LinkState | None] = field(default_factory=dict)
    by_netdev: dict[str, LinkState] = field(default_factory=dict)
    by_device: dict[str, LinkState] = field(default_factory=dict)
    gpus: dict[str, GpuState] = field(default_factory=dict)
    config_fail: dict[str, dict[str, float]] = field(default_factory=dict)  # device -> check -> since
    rank_keys: set = field(default_factory=set)


def window_sums(ev: deque, now: float, w: float, n: int, kinds: int) -> list[list[float]]:
    """Per kind, the sum of event values in each of the last ``n`` windows (0 = newest)."""
    out = [[0.0] * n for _ in range(kinds)]
    for ts, kind, value, _sub in ev:
        if ts > now:
            continue
        k = int((now - ts) // w)
        if k < n:
            out[kind][k] += value
    return out


def _hits(flags: list[bool], persist: int, of: int) -> bool:
    return sum(1 for f in flags[:of] if f) >= persist


def _fmt(x: float) -> str:
    if x >= 100 or x == int(x):
        return f"{x:.0f}"
    return f"{x:.3g}"


FOLDABLE = ("FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded")


def evaluate_link(link: LinkState, now: float, w: float, s: DetectionSettings) -> list[Finding]:
    """Every finding of one link at ``now``."""
    out: list[Finding] = []
    n = max(s.of_windows, s.congestion_of_windows, 3)
    # prune old events
    ev = link.ev
    horizon = now - s.history_s
    while ev and ev[0][0] < horizon:
        ev.popleft()
    while link.trans and link.trans[0] < now - s.flap_window_s:
        link.trans.popleft()
    sums = window_sums(ev, now, w, n, N_LINK_KINDS) if ev else None
    lab = link.labels

    # --- down ---
    if link.is_down():
        since = link.down_since if link.down_since is not None else now
        if now - since >= s.link_down_persist_s:
            ev_s = [f"state {link.state} ({STATE_NAMES.get(link.state or 0, '?')}), "
                    f"phys_state {link.phys} ({PHYS_NAMES.get(link.phys or 0, '?')}) since t={since:.0f}"]
            if sums and sums[E_DOWNED][0] > 0:
                ev_s.append(f"link_downed +{_fmt(sums[E_DOWNED][0])}")
            out.append(Finding("FabricLinkDown", "link", link.id, lab, ev_s, hold_s=s.state_hold_s))
    # --- flapping ---
    downs = sums[E_DOWNED] if sums else [0.0] * n
    n_trans = len(link.trans)
    downed_total = 0.0
    if ev:
        lo = now - s.flap_window_s
        downed_total = sum(v for ts, k, v, _ in ev if k == E_DOWNED and lo < ts <= now)
    flaps = max(n_trans, int(downed_total))
    if flaps >= s.flap_min_transitions:
        recent = (link.trans and now - link.trans[-1] <= 3 * w) or downs[0] > 0 or downs[1] > 0
        out.append(Finding("FabricLinkFlapping", "link", link.id, lab,
                           [f"{flaps} down transitions in {s.flap_window_s:.0f}s"], fire=bool(recent),
                           keep=bool(recent)))
    if sums is None:
        deg, why = link.is_degraded(s.degraded_rate_ratio)
        if deg and link.degraded_since is not None and now - link.degraded_since >= s.degraded_persist_s:
            out.append(Finding("FabricLinkDegraded", "link", link.id, lab, [why + " while ACTIVE"],
                               hold_s=s.state_hold_s))
        return out
    # --- errors ---
    err, rec, phy = sums[E_ERR], sums[E_RECOV], sums[E_PHY]
    # error thresholds are rates (per window_s): a window widened to a 10 s or 60 s poll needs as many
    # errors per second, so a healthy link's steady trickle never fires whatever the interval
    per = w / s.window_s
    err_min, phy_min = s.link_errors_min * per, s.phy_errors_min * per
    hit = [err[k] >= err_min or rec[k] >= s.link_recovery_min or phy[k] >= phy_min for k in range(n)]
    burst = err[0] + phy[0] >= s.link_errors_burst
    if hit[0] or any(hit[: s.of_windows]):
        fire = _hits(hit, s.persist_windows, s.of_windows) or burst
        keep = hit[0]
        if fire or keep:
            e = []
            span = s.of_windows
            if sum(err[:span]):
                e.append(f"PMA symbol/rcv errors +{_fmt(sum(err[:span]))} in {span * w:g}s")
            if sum(rec[:span]):
                e.append(f"link_error_recovery +{_fmt(sum(rec[:span]))}")
            if sum(phy[:span]):
                e.append(f"phy errors +{_fmt(sum(phy[:span]))}")
            e.append(f"errors in {sum(hit[:span])} of last {span} windows")
            out.append(Finding("FabricLinkErrors", "link", link.id, lab, e, fire=fire, keep=keep))
    # --- degraded ---
    deg, why = link.is_degraded(s.degraded_rate_ratio)
    if deg and link.degraded_since is not None and now - link.degraded_since >= s.degraded_persist_s:
        out.append(Finding("FabricLinkDegraded", "link", link.id, lab, [why + " while ACTIVE"],
                           hold_s=s.state_hold_s))
    # --- retransmits ---
    rt = sums[E_RETRY]
    rhit = [v >= s.retries_min * per for v in rt]
    if any(rhit[: s.of_windows]):
        fire = _hits(rhit, s.persist_windows, s.of_windows)
        if fire or rhit[0]:
            out.append(Finding("RDMARetransmits", "link", link.id, lab,
                               [f"transport retries/sequence errors +{_fmt(sum(rt[:s.of_windows]))} "
                                f"in {s.of_windows * w:g}s ({sum(rhit[:s.of_windows])} of {s.of_windows} windows)"],
                               fire=fire, keep=rhit[0]))
    # --- PFC storm: this port EMITS pauses (tx) and receives few ---
    if any(k == E_PTX or k == E_STORM for _, k, _, _ in ev):
        per_prio: dict[int, list[float]] = {}
        rx_prio: dict[int, list[float]] = {}
        storms = [0.0] * n
        for ts, kind, value, sub in ev:
            if ts > now:
                continue
            k = int((now - ts) // w)
            if k >= n:
                continue
            if kind == E_PTX:
                per_prio.setdefault(sub, [0.0] * n)[k] += value
            elif kind == E_PRX:
                rx_prio.setdefault(sub, [0.0] * n)[k] += value
            elif kind == E_STORM:
                storms[k] += value
        best = None
        for prio, arr in per_prio.items():
            ratio = [v / w for v in arr]
            rx = [v / w for v in rx_prio.get(prio, [0.0] * n)]
            emits = [ratio[k] >= s.pfc_pause_ratio and rx[k] < s.pfc_victim_ratio * ratio[k] for k in range(n)]
            keepk = ratio[0] >= s.pfc_keep_ratio or storms[0] > 0
            fire = _hits(emits, s.persist_windows, s.of_windows) or (
                storms[0] > 0 and ratio[0] >= s.pfc_keep_ratio and rx[0] < s.pfc_victim_ratio * ratio[0])
            if fire or keepk:
                if best is None or ratio[0] > best[1]:
                    best = (prio, ratio[0], rx[0], fire, keepk)
        if best is not None:
            prio, r, rx, fire, keepk = best
            e = [f"emits PFC pause {r * 100:.0f}% of time on priority {prio}, receives {rx * 100:.0f}%"]
            if sum(storms[: s.of_windows]):
                e.append(f"pause storm events +{_fmt(sum(storms[:s.of_windows]))}")
            out.append(Finding("FabricPFCStorm", "link", link.id, lab, e, fire=fire, keep=keepk))
    return out


def congestion_of(link: LinkState, now: float, w: float, s: DetectionSettings) -> Finding | None:
    if not link.ev:
        return None
    n = s.congestion_of_windows
    sums = window_sums(link.ev, now, w, n, N_LINK_KINDS)
    cnp = [v / w for v in sums[E_CNP]]
    xw = [v / w for v in sums[E_XWAIT]]
    hit = [cnp[k] >= s.cnp_rate_min or xw[k] >= s.xmit_wait_rate_min for k in range(n)]
    if not hit[0] and not any(hit):
        return None
    fire = _hits(hit, s.congestion_persist_windows, s.congestion_of_windows)
    if not (fire or hit[0]):
        return None
    e = []
    if max(cnp) > 0:
        e.append(f"CNP/ECN {_fmt(cnp[0])}/s")
    if max(xw) > 0:
        e.append(f"port_xmit_wait {_fmt(xw[0])} ticks/s")
    return Finding("FabricCongestion", "link", link.id, link.labels, e, fire=fire, keep=hit[0])


def evaluate_gpu(g: GpuState, now: float, w: float, s: DetectionSettings) -> list[Finding]:
    out: list[Finding] = []
    horizon = now - max(s.history_s, s.xid_hold_s)
    while g.ev and g.ev[0][0] < horizon:
        g.ev.popleft()
    for link, since in sorted(g.nvl_down.items()):
        if now - since >= s.nvlink_down_persist_s:
            lab = dict(g.labels)
            out.append(Finding("NVLinkDown", "nvlink", nvlink_id(g.node, g.index, link), lab,
                               [f"NVLink {link} state 0 since t={since:.0f}"], hold_s=s.state_hold_s))
    if not g.ev:
        return out
    n = s.of_windows
    per_link: dict[int, list[list[float]]] = {}
    xids: dict[int, float] = {}
    for ts, kind, value, sub in g.ev:
        if ts > now:
            continue
        if kind == G_XID:
            if now - ts <= s.xid_hold_s:
                xids[sub] = xids.get(sub, 0.0) + value
            continue
        k = int((now - ts) // w)
        if k >= n:
            continue
        arr = per_link.setdefault(sub, [[0.0] * n, [0.0] * n])
        arr[0 if kind == G_NVERR else 1][k] += value
    for link, (errs, recs) in sorted(per_link.items()):
        hit = [errs[k] >= s.nvlink_errors_min * (w / s.window_s) or recs[k] >= s.nvlink_recovery_min
               for k in range(n)]
        fire = _hits(hit, s.persist_windows, s.of_windows)
        if fire or hit[0]:
            out.append(Finding("NVLinkErrors", "nvlink", nvlink_id(g.node, g.index, link), dict(g.labels),
                               [f"NVLink {link} replay/CRC +{_fmt(sum(errs))}, recovery +{_fmt(sum(recs))} "
                                f"in {n * w:g}s"], fire=fire, keep=hit[0]))
    if xids:
        recent = any(kind == G_XID and now - ts <= 3 * w for ts, kind, _, _ in g.ev)
        e = [f"XID {x} x{_fmt(c)}" for x, c in sorted(xids.items())]
        out.append(Finding("GPUXidFatal", "gpu", g.id, dict(g.labels), e, fire=True, keep=recent,
                           hold_s=s.xid_hold_s))
    return out


def leaf_fold_threshold(n_links: int, s: DetectionSettings) -> int:
    return max(2, min(s.leaf_fold_min_links, math.ceil(s.leaf_fold_ratio * n_links)))


def build_link_state(topo: Topology, node: str, device: str, port: str, netdev: str,
                     hello_rail: str | None, cluster: str) -> LinkState | None:
    """A LinkState for a rail NIC port; None for a NIC on no rail (frontend)."""
    if node not in topo.nodes:
        # A node the topology does not know (its real hostname, say): still monitored at link level,
        # but without rail or leaf labels: a rail we cannot place on a leaf would scope Alertmanager's
        # rail-wide inhibitions to a guess (DESIGN "Topology from the fabric").  ``rail`` is kept off
        # the labels, not off the state: config drift still knows a rail NIC from a frontend one.
        rail = int(hello_rail) if hello_rail and hello_rail.isdigit() else None
        link = LinkState(node, device, str(port), netdev, rail, None, "", -1, None, None, cluster)
        link.labels.pop("rail", None)
        return link
    spec = topo.nic(node, device)
    unit = topo.nodes[node].unit
    if spec is not None:
        rail = spec.rail
        gpu = spec.gpu
        exp_gbps, exp_width = spec.rate_gbps, spec.width
    elif hello_rail:
        try:
            rail = int(hello_rail)
        except ValueError:
            return None
        gpu, exp_gbps, exp_width = rail, None, None
    elif hello_rail == "":
        # a NIC on no rail (frontend), announced in the hello: state and PFC only, no leaf
        return LinkState(node, device, str(port), netdev, None, unit, "", -1, None, None, cluster)
    else:
        return None
    leaf = topo.leaf_of(node, rail) if unit is not None else ""
    return LinkState(node, device, str(port), netdev, rail, unit, leaf, gpu, exp_gbps, exp_width, cluster)
