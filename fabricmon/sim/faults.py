"""The fault model: per fault kind, what each affected counter, state and job effect does over time.

One model for both writers: ``sim.cluster`` (the simulated cluster, rendered by ``sim.tree`` and
``sim.inmemory``) and ``sim.fixture`` (one node as numbered snapshots).  Each writer keeps its own
representation of the hardware (numpy arrays over nodes, or one node's dicts) and asks this module
what a fault does; neither has a copy of the rules.

Time: a writer advances from ``t`` to ``t + dt`` and asks about a fault active at ``t + dt``, with
``since`` = ``t + dt - start`` (0 in the first interval the fault covers).  Counter evidence is a rate
per second (scaled by the fault's magnitude where the rule says so), drawn from the fault's own RNG
(``fault_rng``): a fault never changes another fault's or the traffic's draws, and the same fault and
seed draw the same evidence in both writers when they step by the same ``dt``.

Counter names are ``sim.hw.K``'s ("pma:..", "hw:..", "eth:..") for a NIC port and "nvl:<field>"
(``hw.NVL_FIELDS``) for an NVLink.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .hw import NVLINKS, PMA_ERR_WIDTH, THROTTLE_THERMAL, U32

DEFAULT_FLAP_PERIOD = 6.0  # link_flap: seconds per down+up cycle when the scenario gives none
RESET_FRACTION = (0.2, 0.8)  # counter_reset: part of the interval after the driver reload

How = Literal["uniform", "events", "gauge", "saturate", "wrap"]


@dataclass(frozen=True)
class CounterRule:
    """One counter a fault moves, per (node, device) or NVLink it targets.

    how:
      uniform   counter += int(uniform(lo, hi) * dt * m) each interval (m = magnitude, or 1)
      events    counter += a count of mean lo * dt * m (its integer part, plus one with the fractional
                part's probability)
      gauge     counter = randint(lo, hi) while active; the writer sets it to 0 each interval before
      saturate  in the first interval only: counter += 2^width + randint(0, lo) (a PMA error counter
                then shows pinned at 2^width - 1)
      wrap      in the first interval: counter moved to 2^32 - lo (masked); afterwards += hi each interval
    ``also``: the same drawn value, divided, into more counters (one ECN mark answered by half a CNP...).
    """

    counter: str
    lo: float
    hi: float = 0.0
    how: How = "uniform"
    also: tuple[tuple[str, int], ...] = ()
    ethernet_only: bool = False
    after_s: float = 0.0  # only once the fault has lasted this long
    magnitude: bool = True  # scaled by the fault's magnitude


@dataclass(frozen=True)
class BandwidthFactor:
    """The job-visible bandwidth of the faulted rail NICs: max(floor, intercept + slope * magnitude)."""

    intercept: float
    slope: float
    floor: float

    def at(self, mag: float) -> float:
        return max(self.floor, self.intercept + self.slope * mag)


@dataclass(frozen=True)
class FaultModel:
    link: Literal["down", "flap", "degraded", "absent"] | None = None  # the port's state while active
    recoveries_per_down: int = 0  # pma:link_error_recovery added at each down transition
    config_off: bool = False  # PFC and ECN (np, rp) disabled on the RoCE priority
    rx_share: bool = False  # the port receives 1 - magnitude of its traffic (a slow receiver)
    counters: tuple[CounterRule, ...] = ()
    nvlink: tuple[CounterRule, ...] = ()  # on the faulted NVLink
    nvlink_down: bool = False  # the faulted NVLink is state 0 and carries nothing
    throttle: int = 0  # NVML throttle_reasons of the faulted GPU
    bandwidth: BandwidthFactor | None = None  # job effect on the faulted rail NICs
    gpu_slow: bool = False  # job effect: the GPU's compute time x magnitude
    tp_slow: float = 0.0  # job effect: intra-node collective time x (1 + tp_slow * magnitude)
    tp_fixed: float = 1.0  # job effect: intra-node collective time x tp_fixed
    resets_counters: bool = False  # every counter of the node restarts (driver reload) at start
    notes: str = ""


_FLAKY = (
    CounterRule("pma:symbol_error", 20, 200),
    CounterRule("pma:port_rcv_errors", 0.5, 5),
    CounterRule("pma:link_error_recovery", 0.1, how="events"),
    CounterRule("eth:rx_corrected_bits_phy", 1e5, 1e7, ethernet_only=True),
    CounterRule("eth:rx_pcs_symbol_err_phy", 1, 100, ethernet_only=True),
    CounterRule("eth:rx_err_lane_2_phy", 1e4, 1e6, ethernet_only=True),
    CounterRule("eth:rx_crc_errors_phy", 0.1, 5, ethernet_only=True),
)

MODELS: dict[str, FaultModel] = {
    "flaky_cable": FaultModel(counters=_FLAKY, bandwidth=BandwidthFactor(1.0, -0.25, 0.3)),
    "link_down": FaultModel(link="down"),
    "link_flap": FaultModel(link="flap", recoveries_per_down=3,  # recoveries that worked before one failed
                            notes="down for the first half of each period"),
    "link_degraded": FaultModel(link="degraded", notes="half the lanes (width) or one speed down (speed)"),
    # slow receiver: it cannot drain its buffers, so it pauses its partner (one frame per ~40 us paused)
    "pfc_storm": FaultModel(rx_share=True, bandwidth=BandwidthFactor(1.0, -1.0, 0.05), counters=(
        CounterRule("eth:tx_prio3_pause", 20000, 30000),
        CounterRule("eth:tx_prio3_pause_duration", 0.9765e6, 1.0235e6),  # ~magnitude of each second paused
        CounterRule("eth:outbound_pci_stalled_wr", 60, 95, how="gauge"),  # host side: PCIe writes stall (%)
        CounterRule("eth:tx_pause_storm_warning_events", 0.2, how="events"),
        CounterRule("eth:tx_pause_storm_error_events", 0.1, how="events", after_s=5),  # past the stall timeout
        CounterRule("eth:rx_discards_phy", 10, 500, after_s=5),
        CounterRule("eth:rx_buffer_passed_thres_phy", 100, 1000),
        CounterRule("eth:outbound_pci_stalled_wr_events", 50, 500),
        CounterRule("eth:rx_out_of_buffer", 1e3, 1e5),
        CounterRule("eth:dev_internal_queue_oob", 10, 1000),
    )),
    "ecn_congestion": FaultModel(bandwidth=BandwidthFactor(0.0, 1.0, 0.0), counters=(
        CounterRule("pma:port_xmit_wait", 2e5, 4e5),
        # RoCE only: IB ports have no ECN/CNP hw_counters; each marked packet is answered by a CNP
        CounterRule("hw:np_ecn_marked_roce_packets", 200000, 800000, ethernet_only=True, magnitude=False,
                    also=(("hw:np_cnp_sent", 2), ("hw:rp_cnp_handled", 2), ("eth:rx_prio3_marked", 1))),
    )),
    "rdma_retransmits": FaultModel(bandwidth=BandwidthFactor(1.0, -0.15, 0.3), counters=(
        CounterRule("hw:local_ack_timeout_err", 5, 50),
        CounterRule("hw:packet_seq_err", 10, 100),
        CounterRule("hw:out_of_sequence", 100, 1000),
        CounterRule("hw:implied_nak_seq_err", 1, 10),
        CounterRule("hw:duplicate_request", 10, 100),
        CounterRule("hw:rnr_nak_retry_err", 0, 5),
        CounterRule("hw:roce_adp_retrans", 10, 100, ethernet_only=True),
        CounterRule("hw:req_transport_retries_exceeded", 0.2, how="events", after_s=5),
        CounterRule("hw:req_cqe_error", 0.2, how="events", after_s=5),
    )),
    # a bad switch: every port of it sees errors and waits
    "leaf_degraded": FaultModel(bandwidth=BandwidthFactor(0.0, 1.0, 0.0), counters=(
        CounterRule("pma:symbol_error", 2, 30),
        CounterRule("pma:port_rcv_errors", 0, 1),
        CounterRule("pma:port_xmit_wait", 2e4, 1e5),
        CounterRule("eth:rx_corrected_bits_phy", 1e4, 1e6, ethernet_only=True),
    )),
    "config_drift": FaultModel(config_off=True, notes="counters unaffected"),
    "nvlink_errors": FaultModel(tp_slow=0.05, nvlink=(  # replays cost NVLink bandwidth
        CounterRule("nvl:replay", 5, 50),
        CounterRule("nvl:crc_flit", 10, 200),
        CounterRule("nvl:crc_data", 0.1, 5),
        CounterRule("nvl:recovery", 0.2, how="events"),
    )),
    "nvlink_down": FaultModel(nvlink_down=True, tp_fixed=NVLINKS / (NVLINKS - 1) * 1.05),  # 17 left, uneven
    "slow_gpu": FaultModel(throttle=THROTTLE_THERMAL, gpu_slow=True, notes="no fabric or NVLink evidence"),
    # the cable flaps from fails_at; before, its BER and module readings drift (sim.cluster's optics)
    "cable_degrading": FaultModel(link="flap", recoveries_per_down=3),
    "rank_hang": FaultModel(notes="a job effect only (sim.job)"),
    "counter_reset": FaultModel(resets_counters=True, notes="not a fault: a driver reload"),
    # the switch side: counters, state and job effect in sim/switches.py (nothing on a host port)
    "uplink_flaky": FaultModel(notes="switch side (sim/switches.py)"),
    "uplink_down": FaultModel(notes="switch side (sim/switches.py)"),
    "spine_degraded": FaultModel(notes="switch side (sim/switches.py)"),
    "switch_congestion": FaultModel(notes="switch side (sim/switches.py)"),
    # fixture-only kinds (sim.fixture): the agent's width and presence handling, not scenario faults
    "hot_unplug": FaultModel(link="absent", notes="the NIC vanishes; re-probed with counters restarted at end"),
    "counter_saturation": FaultModel(counters=(
        CounterRule("pma:symbol_error", 1000, how="saturate"),
        CounterRule("pma:port_rcv_errors", 1000, how="saturate"),
        CounterRule("pma:link_error_recovery", 1000, how="saturate"),
        CounterRule("hw:out_of_sequence", 6, 1000, how="wrap"),  # 2^32-6, then wrapped past 2^32
    )),
}


# counters some rule sets as a gauge: a writer zeroes them each interval before the active faults set them
GAUGES: tuple[str, ...] = tuple(sorted({r.counter for m in MODELS.values() for r in m.counters if r.how == "gauge"}))


def fault_rng(seed: int, index: int) -> random.Random:
    """The evidence RNG of a scenario's ``index``-th fault (the fixture's one fault is index 0)."""
    return random.Random(f"fabricmon-fault:{seed}:{index}")


def link_down(kind: str, since: float, period: float | None, fails_after: float | None = None) -> bool:
    """Whether the faulted port is down ``since`` seconds into an active fault.  ``fails_after``:
    cable_degrading's flap begins that many seconds after its start."""
    m = MODELS[kind]
    if m.link == "down":
        return True
    if m.link != "flap":
        return False
    p = period or DEFAULT_FLAP_PERIOD
    if fails_after is not None:
        if since < fails_after:
            return False
        since -= fails_after
    return (since % p) < p / 2


def degraded(lanes: int, speed_index: int, how: str | None) -> tuple[int, int]:
    """link_degraded's (lanes, speed index): half the lanes (``width``, default) or one speed down."""
    if how == "speed":
        return lanes, max(0, speed_index - 1)
    return max(1, lanes // 2), speed_index


def _count(rng: random.Random, lam: float) -> int:
    return int(lam) + (1 if rng.random() < lam - int(lam) else 0)


def evidence(rules: tuple[CounterRule, ...], rng: random.Random, dt: float, since: float, mag: float,
             ethernet: bool, current: dict[str, int] | None = None) -> Iterator[tuple[str, int, bool]]:
    """What ``rules`` do to one target over ``dt`` seconds: (counter, value, is_set) in rule order; is_set:
    the counter takes the value (a gauge, a wrap) instead of adding it.  ``current``: the target's
    counter values, for the ``wrap`` rule."""
    for r in rules:
        if (r.ethernet_only and not ethernet) or since < r.after_s:
            continue
        m = mag if r.magnitude else 1.0
        if r.how == "uniform":
            v = int(rng.uniform(r.lo, r.hi) * dt * m)
        elif r.how == "events":
            v = _count(rng, r.lo * dt * m)
        elif r.how == "gauge":
            yield r.counter, rng.randint(int(r.lo), int(r.hi)), True
            continue
        elif r.how == "saturate":
            if since > 0:
                continue
            short = r.counter.split(":", 1)[1]
            v = (1 << PMA_ERR_WIDTH[short]) + rng.randint(0, int(r.lo))
        else:  # wrap
            if since > 0:
                v = int(r.hi)
            else:
                cur = (current or {}).get(r.counter, 0)
                v = (U32 - int(r.lo) + 1 - cur) & U32  # the masked value lands on 2^32 - lo
        yield r.counter, v, False
        for name, div in r.also:
            yield name, v // div, False


def port_evidence(kind: str, rng: random.Random, dt: float, since: float, mag: float, ethernet: bool,
                  current: dict[str, int] | None = None) -> Iterator[tuple[str, int, bool]]:
    return evidence(MODELS[kind].counters, rng, dt, since, mag, ethernet, current)


def nvlink_evidence(kind: str, rng: random.Random, dt: float, since: float, mag: float
                    ) -> Iterator[tuple[str, int, bool]]:
    return evidence(MODELS[kind].nvlink, rng, dt, since, mag, False)


def reset_fraction(rng: random.Random) -> float:
    """counter_reset: the part of the interval that runs after the reload (counters grow again)."""
    return rng.uniform(*RESET_FRACTION)
