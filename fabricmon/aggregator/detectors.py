"""The link / GPU fault detectors over the per-component state (state.py).

Counter evidence arrives as sparse events ``(ts, kind, value, sub)`` in each
component's deque (ingest.py stores only non-zero deltas of the few families a
detector needs, congestion/pause counters only above a small fraction of their
thresholds), so a quiet cluster stores nothing and a tick only visits
components with recent events or unhealthy state (the registry's ``active`` sets).

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

from .config import DetectionSettings
from .incidents import Finding
from .state import TRAFFIC_CLASS_SUB, Event, GpuEvent, GpuState, LinkEvent, LinkState
from .wording import at, secs

STATE_NAMES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_NAMES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
              6: "LinkErrorRecovery", 7: "PhyTest"}


def window_sums(ev: deque[Event], now: float, w: float, n: int, kinds: int) -> list[list[float]]:
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
    sums = window_sums(ev, now, w, n, len(LinkEvent)) if ev else None
    lab = link.labels

    # --- down ---
    if link.is_down():
        since = link.down_since if link.down_since is not None else now
        if now - since >= s.link_down_persist_s:
            ev_s = [f"state {link.state} ({STATE_NAMES.get(link.state or 0, '?')}), "
                    f"phys_state {link.phys} ({PHYS_NAMES.get(link.phys or 0, '?')}) since {at(since)}"]
            if sums and sums[LinkEvent.DOWNED][0] > 0:
                ev_s.append(f"link_downed +{_fmt(sums[LinkEvent.DOWNED][0])}")
            out.append(Finding("FabricLinkDown", link.id, lab, ev_s, hold_s=s.state_hold_s))
    # --- flapping ---
    downs = sums[LinkEvent.DOWNED] if sums else [0.0] * n
    n_trans = len(link.trans)
    downed_total = 0.0
    if ev:
        lo = now - s.flap_window_s
        downed = LinkEvent.DOWNED
        downed_total = sum(v for ts, k, v, _ in ev if k == downed and lo < ts <= now)
    flaps = max(n_trans, int(downed_total))
    if flaps >= s.flap_min_transitions:
        recent = (link.trans and now - link.trans[-1] <= 3 * w) or downs[0] > 0 or downs[1] > 0
        out.append(Finding("FabricLinkFlapping", link.id, lab,
                           [f"{flaps} down transitions in {s.flap_window_s:.0f}s"], fire=bool(recent),
                           keep=bool(recent)))
    if sums is None:
        deg, why = link.is_degraded(s.degraded_rate_ratio)
        if deg and link.degraded_since is not None and now - link.degraded_since >= s.degraded_persist_s:
            out.append(Finding("FabricLinkDegraded", link.id, lab, [why + " while ACTIVE"],
                               hold_s=s.state_hold_s))
        return out
    # --- errors ---
    err, rec, phy = sums[LinkEvent.ERR], sums[LinkEvent.RECOV], sums[LinkEvent.PHY]
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
                e.append(f"PMA symbol/rcv errors +{_fmt(sum(err[:span]))} in {secs(span * w)}")
            if sum(rec[:span]):
                e.append(f"link_error_recovery +{_fmt(sum(rec[:span]))}")
            if sum(phy[:span]):
                e.append(f"phy errors +{_fmt(sum(phy[:span]))}")
            e.append(f"errors in {sum(hit[:span])} of last {span} windows")
            out.append(Finding("FabricLinkErrors", link.id, lab, e, fire=fire, keep=keep))
    # --- degraded ---
    deg, why = link.is_degraded(s.degraded_rate_ratio)
    if deg and link.degraded_since is not None and now - link.degraded_since >= s.degraded_persist_s:
        out.append(Finding("FabricLinkDegraded", link.id, lab, [why + " while ACTIVE"],
                           hold_s=s.state_hold_s))
    # --- retransmits ---
    rt = sums[LinkEvent.RETRY]
    rhit = [v >= s.retries_min * per for v in rt]
    if any(rhit[: s.of_windows]):
        fire = _hits(rhit, s.persist_windows, s.of_windows)
        if fire or rhit[0]:
            out.append(Finding("RDMARetransmits", link.id, lab,
                               [f"transport retries/sequence errors +{_fmt(sum(rt[:s.of_windows]))} "
                                f"in {s.of_windows * w:g}s ({sum(rhit[:s.of_windows])} of {s.of_windows} windows)"],
                               fire=fire, keep=rhit[0]))
    # --- PFC storm: this port EMITS pauses (tx) and receives few ---
    # members bound to locals in the loops over events: an Enum class attribute costs ~1 us in CPython 3.11
    pause_tx, pause_rx, storm = LinkEvent.PAUSE_TX, LinkEvent.PAUSE_RX, LinkEvent.STORM
    if any(k == pause_tx or k == storm for _, k, _, _ in ev):
        per_prio: dict[int, list[float]] = {}
        rx_prio: dict[int, list[float]] = {}
        storms = [0.0] * n
        for ts, kind, value, sub in ev:
            if ts > now:
                continue
            k = int((now - ts) // w)
            if k >= n:
                continue
            if kind == pause_tx:
                per_prio.setdefault(sub, [0.0] * n)[k] += value
            elif kind == pause_rx:
                rx_prio.setdefault(sub, [0.0] * n)[k] += value
            elif kind == storm:
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
            prio, r, rx_r, fire, keepk = best
            where = (f"traffic class {prio - TRAFFIC_CLASS_SUB} (from XOFF frames)" if prio >= TRAFFIC_CLASS_SUB
                     else f"priority {prio}")
            e = [f"emits PFC pause {r * 100:.0f}% of time on {where}, receives {rx_r * 100:.0f}%"]
            if sum(storms[: s.of_windows]):
                e.append(f"pause storm events +{_fmt(sum(storms[:s.of_windows]))}")
            out.append(Finding("FabricPFCStorm", link.id, lab, e, fire=fire, keep=keepk))
    return out


def congestion_of(link: LinkState, now: float, w: float, s: DetectionSettings) -> Finding | None:
    if not link.ev:
        return None
    n = s.congestion_of_windows
    sums = window_sums(link.ev, now, w, n, len(LinkEvent))
    cnp = [v / w for v in sums[LinkEvent.CNP]]
    xw = [v / w for v in sums[LinkEvent.XWAIT]]
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
    return Finding("FabricCongestion", link.id, link.labels, e, fire=fire, keep=hit[0])


def evaluate_gpu(g: GpuState, now: float, w: float, s: DetectionSettings) -> list[Finding]:
    out: list[Finding] = []
    horizon = now - max(s.history_s, s.xid_hold_s)
    while g.ev and g.ev[0][0] < horizon:
        g.ev.popleft()
    for link, since in sorted(g.nvl_down.items()):
        if now - since >= s.nvlink_down_persist_s:
            lab = dict(g.labels)
            out.append(Finding("NVLinkDown", g.nvlink(link), lab,
                               [f"NVLink {link} state 0 since {at(since)}"], hold_s=s.state_hold_s))
    if not g.ev:
        return out
    n = s.of_windows
    per_link: dict[int, list[list[float]]] = {}
    xids: dict[int, float] = {}
    xid, nvlink_err = GpuEvent.XID, GpuEvent.NVLINK_ERR
    for ts, kind, value, sub in g.ev:
        if ts > now:
            continue
        if kind == xid:
            if now - ts <= s.xid_hold_s:
                xids[sub] = xids.get(sub, 0.0) + value
            continue
        k = int((now - ts) // w)
        if k >= n:
            continue
        arr = per_link.setdefault(sub, [[0.0] * n, [0.0] * n])
        arr[0 if kind == nvlink_err else 1][k] += value
    for link, (errs, recs) in sorted(per_link.items()):
        hit = [errs[k] >= s.nvlink_errors_min * (w / s.window_s) or recs[k] >= s.nvlink_recovery_min
               for k in range(n)]
        fire = _hits(hit, s.persist_windows, s.of_windows)
        if fire or hit[0]:
            out.append(Finding("NVLinkErrors", g.nvlink(link), dict(g.labels),
                               [f"NVLink {link} replay/CRC +{_fmt(sum(errs))}, recovery +{_fmt(sum(recs))} "
                                f"in {secs(n * w)}"], fire=fire, keep=hit[0]))
    if xids:
        recent = any(kind == xid and now - ts <= 3 * w for ts, kind, _, _ in g.ev)
        e = [f"XID {x} x{_fmt(c)}" for x, c in sorted(xids.items())]
        out.append(Finding("GPUXidFatal", g.id, dict(g.labels), e, fire=True, keep=recent,
                           hold_s=s.xid_hold_s))
    return out


def leaf_fold_threshold(n_links: int, s: DetectionSettings) -> int:
    return max(2, min(s.leaf_fold_min_links, math.ceil(s.leaf_fold_ratio * n_links)))
