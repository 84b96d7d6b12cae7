"""FabricCableDegrading: a link predicted to fail, from the trend of its pre-FEC BER, errors
concentrating on one lane, or its module's RX power drifting down, before it flaps.

Inputs per link (sample time):
* FEC-corrected bits (``fabricmon_netdev_phy_corrected_bit_total``) and per-lane raw errors
  (``rx_err_lane_N_phy``) as deltas; the BER denominator is the data rate
  (``fabricmon_ib_port_data_rate_bytes_per_second``) times the interval: the inbox mlx5 driver has no
  ``rx_bits_phy``.
* module readings (``fabricmon_transceiver_rx_power_watts{lane}``, temperature) as gauges, refreshed
  every 30-60 s by the agent's module reader.

Deltas are summed into buckets of ``cable_bucket_s`` (10 s); every closed bucket the window of the
last ``cable_window_s`` is judged.  A healthy link's BER wanders around a stable level and steps up
or down when traffic or a neighbour changes; a dying cable climbs steadily.  So a trend needs both a
robust slope (Theil-Sen, in decades per minute) and a monotone climb: the medians of the window's
three thirds each above the previous one by a margin.  A single step moves one third against the
next, never both; wander moves neither by a decade fraction for long.  The same rule, in dB, for
RX power falling.  Evidence persisting over ``cable_persist`` evaluations fires; the incident keeps
while the trend continues (half the slope suffices) and resolves after its hold once it stops.

A cable is one link: the links of a leaf that is degraded (the leaf folder's episode) trend together
because of the leaf, and are its evidence.  While the leaf is degraded their trend state is dropped
(no warning per link, and after the leaf recovers the window holds no trace of it), and a warning
already open on one of them ends with one last finding of no hold: it never outlives the leaf's
incident (issue 36: a degraded leaf opened a ticket per link that lasted past its recovery).
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from statistics import median
from typing import TYPE_CHECKING

from ..components import Component
from .config import DetectionSettings
from .incidents import Finding

if TYPE_CHECKING:
    from .state import LinkState

# (t_mid, corrected bits, seconds, bits per lane (8))
_Bucket = tuple[float, float, float, tuple[float, ...]]
# (lane, slope dB/min, first dBm, last dBm, fire, keep)
_RxDrift = tuple[int, float, float, float, bool, bool]

ALERT = "FabricCableDegrading"
BER_FLOOR = 1e-13  # log of zero corrected bits over an interval
DARK_W = 1e-6  # below -30 dBm a lane is dark (LOS), not drifting


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """Median of pairwise slopes: robust to a few outliers (one noisy bucket, one odd reading)."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return median(slopes) if slopes else 0.0


def thirds_rise(ys: list[float]) -> tuple[float, float]:
    """(second third's median - first's, third's - second's)."""
    k = len(ys) // 3
    a, b, c = median(ys[:k]), median(ys[k:2 * k]), median(ys[2 * k:])
    return b - a, c - b


class _Track:
    __slots__ = ("link", "data_Bps", "cur", "cur_start", "buckets", "rx", "temp", "hits", "last_slot",
                 "finding", "phase", "rx_new", "rx_worst")

    def __init__(self, link: LinkState) -> None:
        self.link = link
        self.data_Bps: float | None = None
        self.cur: list[float] | None = None  # [corrected bits, seconds, lane0.. lane7]
        self.cur_start = 0.0
        self.buckets: deque[_Bucket] = deque()
        self.rx: dict[int, deque[tuple[float, float]]] = {}  # lane -> (ts, dBm)
        self.temp: deque[tuple[float, float]] = deque()  # (ts, Celsius)
        self.hits = 0
        self.rx_new = False  # a module reading arrived since the last judgement
        self.rx_worst: _RxDrift | None = None  # the last RX judgement
        self.last_slot = -1
        self.finding: Finding | None = None
        # judged once per bucket, each link at its own phase so the work spreads over the ticks
        self.phase = (zlib.crc32(link.id.id.encode()) % 1000) / 1000.0


class CableHealth:
    """Per-link trend state; ``evaluate(now)`` returns this tick's FabricCableDegrading findings."""

    def __init__(self, settings: DetectionSettings) -> None:
        self.s = settings
        self.tracks: dict[Component, _Track] = {}

    def _track(self, link: LinkState) -> _Track:
        t = self.tracks.get(link.id)
        if t is None:
            t = self.tracks[link.id] = _Track(link)
        return t

    # -- ingest ---------------------------------------------------------------------------
    def data_rate(self, link: LinkState, value: float) -> None:
        self._track(link).data_Bps = value

    def corrected(self, link: LinkState, ts: float, bits: float, interval: float, lane: int | None = None) -> None:
        """FEC-corrected bits of one interval (lane None: the port total)."""
        t = self._track(link)
        b = self.s.cable_bucket_s
        if t.cur is None or ts - t.cur_start >= b:
            self._close(t)
            t.cur = [0.0, 0.0] + [0.0] * 8
            t.cur_start = ts - (ts % b)
        if lane is None:
            t.cur[0] += bits
            t.cur[1] += interval
        elif 0 <= lane < 8:
            t.cur[2 + lane] += bits

    def _close(self, t: _Track) -> None:
        if t.cur is None or t.cur[1] <= 0:
            return
        t.buckets.append((t.cur_start + self.s.cable_bucket_s / 2, t.cur[0], t.cur[1], tuple(t.cur[2:])))
        horizon = t.cur_start - self.s.cable_window_s
        while t.buckets and t.buckets[0][0] < horizon:
            t.buckets.popleft()
        t.cur = None

    def rx_power(self, link: LinkState, ts: float, lane: int, watts: float) -> None:
        t = self._track(link)
        dq = t.rx.setdefault(lane, deque())
        if dq and dq[-1][0] >= ts:
            return
        dq.append((ts, 10 * math.log10(max(watts, 1e-9) * 1e3)))
        t.rx_new = True
        while dq and dq[0][0] < ts - self.s.cable_window_s:
            dq.popleft()

    def temperature(self, link: LinkState, ts: float, celsius: float) -> None:
        t = self._track(link)
        t.temp.append((ts, celsius))
        while t.temp and t.temp[0][0] < ts - self.s.cable_window_s:
            t.temp.popleft()

    # -- detection ------------------------------------------------------------------------
    def evaluate(self, now: float, suppressed: set[Component] | None = None,
                 degraded_leaves: frozenset[Component] = frozenset()) -> list[Finding]:
        """``suppressed``: links with an open down/flap/errors incident: those already alert, the
        warning does not open on top of them (it keeps if it was already open).  ``degraded_leaves``:
        leaves the folder holds degraded now; their links are the leaf's evidence (module doc)."""
        out = []
        for tr in self.tracks.values():
            if degraded_leaves and tr.link.leaf in degraded_leaves:
                last = self._leaf_evidence(tr)
                if last is not None:
                    out.append(last)
                continue
            if tr.cur is not None and now - tr.cur_start >= self.s.cable_bucket_s:
                self._close(tr)
            slot = int(now // self.s.cable_bucket_s + tr.phase)
            if slot != tr.last_slot:
                tr.last_slot = slot
                tr.finding = self._judge(tr, now, suppressed or set())
            if tr.finding is not None:
                out.append(tr.finding)
        return out

    def _leaf_evidence(self, tr: _Track) -> Finding | None:
        """A link of a degraded leaf: forget its trend; a warning it had ends now (a last finding, hold 0)."""
        was = tr.finding
        tr.buckets.clear()
        tr.cur = None
        tr.rx.clear()
        tr.temp.clear()
        tr.hits = 0
        tr.rx_new = False
        tr.rx_worst = None
        tr.finding = None
        if was is None:
            return None
        link = tr.link
        return Finding(ALERT, link.id, link.labels,
                       [f"leaf {link.leaf} is degraded: this link's trend is the leaf's evidence, not a cable's"],
                       fire=False, keep=True, hold_s=0.0, severity="warning")

    def _judge(self, tr: _Track, now: float, suppressed: set[Component]) -> Finding | None:
        s = self.s
        link = tr.link
        if link.is_down():
            tr.hits = 0
            return None  # a down link is FabricLinkDown's; its window of old data says nothing new
        ev: list[str] = []
        fire_any = keep_any = False
        # A link with no evidence so far only needs the fire test, whose cheap part (three medians)
        # comes first: the slopes (O(n^2) pairs) are computed for the few links that pass it.
        warm = tr.finding is not None or tr.hits > 0
        # --- BER trend ---
        bk = [b for b in tr.buckets if b[0] > now - s.cable_window_s]
        rate = tr.data_Bps
        if rate and len(bk) >= s.cable_min_buckets:
            denom = rate * 8
            xs = [b[0] / 60.0 for b in bk]
            ys = [math.log10(max(b[1] / (denom * b[2]), BER_FLOOR)) for b in bk]
            r1, r2 = thirds_rise(ys)
            climbs = min(r1, r2) >= s.cable_ber_step and r1 + r2 >= s.cable_ber_rise
            slope = theil_sen(xs, ys) if climbs or warm else 0.0
            fire = climbs and slope >= s.cable_ber_slope
            keep = slope >= s.cable_ber_slope / 2
            if fire or keep:
                ev.append(f"pre-FEC BER rising {slope:.2f} decades/min over {(xs[-1] - xs[0]):.0f} min, "
                          f"now {10 ** median(ys[-3:]):.1e}")
            fire_any |= fire
            keep_any |= keep
            # --- lanes: who carries the errors, and is that lane climbing ---
            lanes = [sum(col) for col in zip(*[b[3] for b in bk], strict=True)]  # 8 lanes each
            total = sum(lanes)
            if total > 0:
                top = max(range(8), key=lambda i: lanes[i])
                share = lanes[top] / total
                used = sum(1 for v in lanes if v > 0)
                if used >= 2 and share >= s.cable_lane_share:
                    # the lane's own BER, as if it carried 1/used of the bits
                    ly = [math.log10(max(b[3][top] * used / (denom * b[2]), BER_FLOOR)) for b in bk]
                    l1, l2 = thirds_rise(ly)
                    lclimbs = min(l1, l2) >= s.cable_ber_step and l1 + l2 >= s.cable_ber_rise
                    lslope = theil_sen(xs, ly) if lclimbs or warm else 0.0
                    lfire = lclimbs and lslope >= s.cable_ber_slope
                    if lfire or lslope >= s.cable_ber_slope / 2:
                        ev.append(f"lane {top} carries {share * 100:.0f}% of the corrected bits, its BER rising "
                                  f"{lslope:.2f} decades/min")
                    fire_any |= lfire
                    keep_any |= lslope >= s.cable_ber_slope / 2
        # --- RX power drift: judged again only when a module reading arrived (every 30-60 s) ---
        worst = tr.rx_worst
        if tr.rx_new or warm:
            worst = tr.rx_worst = self._rx_drift(tr, now, warm)
            tr.rx_new = False
        if worst is not None:
            lane, slope, first, last, fire, keep = worst
            ev.append(f"RX power lane {lane} falling {-slope:.2f} dB/min ({first:.1f} -> {last:.1f} dBm)")
            fire_any |= fire
            keep_any |= keep
        if len(tr.temp) >= s.cable_min_readings and (ev or fire_any):
            d = tr.temp[-1][1] - tr.temp[0][1]
            if d >= 2.0:
                ev.append(f"module temperature +{d:.1f} C to {tr.temp[-1][1]:.1f} C")
        tr.hits = tr.hits + 1 if fire_any else 0
        fire = tr.hits >= s.cable_persist and link.id not in suppressed
        if not (fire or keep_any):
            return None
        return Finding(ALERT, link.id, link.labels, ev, fire=fire, keep=keep_any or fire,
                       hold_s=s.cable_hold_s, severity="warning")

    def _rx_drift(self, tr: _Track, now: float, warm: bool) -> _RxDrift | None:
        """(lane, slope dB/min, first dBm, last dBm, fire, keep) of the lane falling fastest, or None."""
        s = self.s
        worst: _RxDrift | None = None
        for lane, dq in tr.rx.items():
            pts = [(ts, v) for ts, v in dq if ts > now - s.cable_window_s]
            if len(pts) < s.cable_min_readings or pts[-1][1] < 10 * math.log10(DARK_W * 1e3):
                continue
            xs = [p[0] / 60.0 for p in pts]
            ys = [p[1] for p in pts]
            d1, d2 = thirds_rise(ys)
            falls = max(d1, d2) <= -s.cable_rx_step_db and d1 + d2 <= -s.cable_rx_drop_db
            slope = theil_sen(xs, ys) if falls or warm else 0.0
            fire = falls and slope <= -s.cable_rx_slope_db
            keep = slope <= -s.cable_rx_slope_db / 2
            if (fire or keep) and (worst is None or slope < worst[1]):
                worst = (lane, slope, ys[0], ys[-1], fire, keep)
        return worst
