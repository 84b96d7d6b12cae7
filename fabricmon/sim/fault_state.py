"""What the scenario's faults do to the simulated cluster's hardware at each time, and to its jobs.

``sim.faults`` is the model of each kind (shared with ``sim.fixture``); this applies it to the cluster's
parts: the link state and config at a time (down, degraded, PFC/ECN off, with carrier down events counted
on transitions), the counter evidence and gauges of the active faults over an interval, a driver reload's
counter reset, the NVLinks that are down, the GPUs that throttle, and the job's view of it all
(``Effects``: bandwidth per rail NIC, slow GPUs, slow intra-node collectives).  Each fault draws its
evidence from its own RNG, so a fault never changes the traffic noise or another fault's evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .faults import GAUGES, MODELS, degraded, fault_rng, link_down, nvlink_evidence, port_evidence, reset_fraction
from .gpu_state import Gpus
from .hw import NDEV, NGPU, NRAILS, NVL_FIELDS, K
from .link_state import Links
from .nic_counters import NicCounters
from .scenario import Fault, Scenario

if TYPE_CHECKING:
    from .switches import SimSwitches

_NVL = {f"nvl:{name}": j for j, name in enumerate(NVL_FIELDS)}


@dataclass
class Effects:
    """What the active faults do to the job (consumed by ``job.SyntheticJob``)."""

    nic_bw: np.ndarray  # (nodes, rails) bandwidth factor of each rail NIC's link (1 = nominal)
    gpu_slow: np.ndarray  # (nodes, gpus) compute-time multiplier (1 = nominal)
    tp_slow: np.ndarray  # (nodes,) intra-node (NVLink) collective time multiplier
    # the switch side (cluster: {spines: ...}; sim/switches.py), None without one: the share of its leaf's
    # uplink bandwidth each (node, rail NIC)'s traffic keeps when its job crosses that leaf's uplinks, and
    # the leaf of each (node, rail NIC) (-1: none), which tells whether a job crosses them
    uplink_bw: np.ndarray | None = None
    leaf_index: np.ndarray | None = None


class FaultState:
    def __init__(self, scenario: Scenario, index: dict[str, int], links: Links, counters: NicCounters,
                 gpus: Gpus) -> None:
        self.scenario = scenario
        self.index = index
        self.n = len(index)
        self.links = links
        self.counters = counters
        self.gpus = gpus
        # fault evidence: one RNG per fault (scalar draws), the fixture writer's for the same seed and fault
        self.frngs = [fault_rng(scenario.cluster.seed, i) for i in range(len(scenario.faults))]
        self._applied_resets: set[int] = set()

    # ------------------------------------------------------------------ where
    def unit_nodes(self, unit: int) -> range:
        npu = self.scenario.cluster.nodes_per_unit
        return range(unit * npu, min(self.n, (unit + 1) * npu))

    def targets(self, f: Fault) -> tuple[list[int], list[int]]:
        """(node indexes, device indexes) a NIC-level fault touches."""
        if f.leaf is not None:  # a leaf by its topology name (a fat tree's, an imported one's)
            names, devs = self.scenario.cluster.leaf_targets(f.leaf) or ([], [])
            return [self.index[name] for name in names], devs
        if f.unit is not None:
            return list(self.unit_nodes(f.unit)), [f.the_rail]
        n = self.index[f.the_node]
        dev = f.device_index
        if dev is None:  # config_drift without rail: every rail NIC of the node
            return [n], list(range(NRAILS))
        return [n], [dev]

    # ------------------------------------------------------------------ state
    def _link_down(self, f: Fault, t: float) -> bool:
        fails_after = f.fails_at - f.start if f.fails_at is not None else None
        return link_down(f.kind, t - f.start, f.period, fails_after)

    def link_state(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(up, lanes, speed), each (nodes, devices), of every link at time t, changing nothing: what
        the simulated agents' link watch reads between their polls, and what ``apply`` applies."""
        links = self.links
        want_up = np.ones_like(links.up)
        lanes = np.broadcast_to(links.nominal_lanes, links.lanes.shape).copy()
        speed = np.broadcast_to(links.nominal_speed, links.speed.shape).copy()
        for f in self.scenario.faults:
            m = MODELS[f.kind]
            if not f.active(t) or not m.link:
                continue
            nodes, devs = self.targets(f)
            if self._link_down(f, t):
                want_up[np.ix_(nodes, devs)] = False
            elif m.link == "degraded":
                for nn in nodes:
                    for d in devs:
                        lanes[nn, d], speed[nn, d] = degraded(int(links.nominal_lanes[d]),
                                                              int(links.nominal_speed[d]), f.degrade)
        return want_up, lanes, speed

    def apply(self, t: float) -> None:
        """Link state, rate and config as of time t; counts down events on transitions."""
        links, C = self.links, self.counters.C
        want_up, lanes, speed = self.link_state(t)
        pfc = np.zeros_like(links.pfc)
        pfc[:, links.eth_mask, 3] = True
        ecn = pfc.copy()
        for f in self.scenario.faults:
            if not f.active(t) or not MODELS[f.kind].config_off:
                continue
            nodes, devs = self.targets(f)
            pfc[np.ix_(nodes, devs, [3])] = False
            ecn[np.ix_(nodes, devs, [3])] = False
        going_down = links.up & ~want_up
        if going_down.any():
            links.downs += going_down
            C[K["pma:link_downed"]] += going_down
            C[K["eth:link_down_events_phy"]] += going_down & links.eth_mask[None, :]
            for f in self.scenario.faults:
                per_down = MODELS[f.kind].recoveries_per_down
                if per_down and f.active(t):
                    nodes, devs = self.targets(f)
                    C[K["pma:link_error_recovery"]][np.ix_(nodes, devs)] += per_down * going_down[np.ix_(nodes, devs)]
        links.up = want_up
        links.lanes, links.speed = lanes, speed
        links.pfc, links.ecn_np, links.ecn_rp = pfc, ecn, ecn.copy()

    def effects(self, t: float, switches: SimSwitches | None) -> Effects:
        """What the faults active at t do to the job."""
        links, n = self.links, self.n
        bw = links.gbps()[:, :NRAILS] / links.nominal_gbps[None, :NRAILS]
        # a rail NIC that is down: NCCL (PXN) sends its share through a neighbouring rail's NIC over
        # NVLink, at about half the bandwidth
        bw = np.where(links.up[:, :NRAILS], bw, 0.5)
        gpu = np.ones((n, NGPU))
        tp = np.ones(n)
        for f in self.scenario.faults:
            if not f.active(t):
                continue
            m = MODELS[f.kind]
            if m.bandwidth is not None:
                nodes, devs = self.targets(f)
                devs = [d for d in devs if d < NRAILS]
                if not devs:
                    continue  # the frontend NIC carries no job traffic
                bw[np.ix_(nodes, devs)] *= m.bandwidth.at(f.mag)
            elif m.gpu_slow:
                gpu[self.index[f.the_node], f.the_gpu] *= f.mag
            elif m.tp_slow or m.tp_fixed != 1.0:
                tp[self.index[f.the_node]] *= (1 + m.tp_slow * f.mag) * m.tp_fixed
        if switches is not None:
            return Effects(bw, gpu, tp, switches.leaf_factor(t), switches.leaf_index)
        return Effects(bw, gpu, tp)

    # ------------------------------------------------------------------ an interval's evidence
    def reset_counters(self, dt: float, t: float) -> np.ndarray:
        """A driver reload due by t, once: every counter of the node's mlx5 devices restarts part-way
        through the interval.  Returns the seconds of traffic each (node, device) counts this interval."""
        C = self.counters.C
        dt_arr = np.full((self.n, NDEV), float(dt))
        for i, f in enumerate(self.scenario.faults):
            if not MODELS[f.kind].resets_counters or id(f) in self._applied_resets or f.start > t:
                continue
            self._applied_resets.add(id(f))
            ni = self.index[f.the_node]
            C[:, ni, :] = 0
            self.links.downs[ni, :] = 0
            dt_arr[ni, :] = dt * reset_fraction(self.frngs[i])
        return dt_arr

    def rx_scale(self, t: float) -> np.ndarray:
        """(nodes, devices) share of what is sent that arrives (a fault that drops received traffic)."""
        rx_scale = np.ones((self.n, NDEV))
        for f in self.scenario.faults:
            if MODELS[f.kind].rx_share and f.active(t):
                nodes, devs = self.targets(f)
                rx_scale[np.ix_(nodes, devs)] = 1 - f.mag
        return rx_scale

    def add_evidence(self, dt: float, t: float, tick: int) -> list[Fault]:
        """dt seconds of the active faults' counter evidence (gauges set afresh) and the decoys' background
        errors, ending at t; returns the active faults that do not reset counters."""
        C = self.counters.C
        for g in GAUGES:
            C[K[g]] = 0  # a gauge reads what the active faults set it to this interval
        active = [(i, f) for i, f in enumerate(self.scenario.faults)
                  if f.active(t) and not MODELS[f.kind].resets_counters]
        for i, f in active:
            self._evidence(i, f, dt, t)
        self._background_errors(dt, t, tick)
        return [f for _, f in active]

    def _evidence(self, i: int, f: Fault, dt: float, t: float) -> None:
        """Counter evidence of the scenario's i-th fault, active at t, over dt seconds (``sim.faults``)."""
        m, r, since = MODELS[f.kind], self.frngs[i], t - f.start
        if m.nvlink:
            ni = self.index[f.the_node]
            for name, v, _ in nvlink_evidence(f.kind, r, dt, since, f.mag):
                self.gpus.nvl[_NVL[name], ni, f.the_gpu, f.the_link] += v
        if not m.counters:
            return  # state-only faults (link_flap's evidence is counted on its transitions)
        nodes, devs = self.targets(f)
        C, specs = self.counters.C, self.links.devs
        for nn in nodes:
            for d in devs:
                for name, v, is_set in port_evidence(f.kind, r, dt, since, f.mag, specs[d].ethernet):
                    if is_set:
                        C[K[name], nn, d] = v
                    else:
                        C[K[name], nn, d] += v

    def _background_errors(self, dt: float, t: float, tick: int) -> None:
        """Decoy ``background_errors``: symbol errors at ``rate``/s on a healthy link, forever (many real
        links show a steady trickle).  Its own random stream, so it changes no other draw."""
        for k, d in enumerate(self.scenario.decoys):
            if d.kind != "background_errors" or not d.active(t, math.inf):
                continue
            rng = np.random.default_rng([self.scenario.cluster.seed, 7, k, tick])
            self.counters.C[K["pma:symbol_error"], self.index[d.the_node], d.the_rail] += \
                int(rng.poisson(d.value("rate") * dt))

    def nvlinks_down(self, t: float) -> list[tuple[int, int, int]]:
        """(node, gpu, link) of every NVLink a fault active at t holds down."""
        return [(self.index[f.the_node], f.the_gpu, f.the_link) for f in self.scenario.faults
                if MODELS[f.kind].nvlink_down and f.active(t)]

    def throttle(self, active: list[Fault]) -> None:
        """The GPUs' throttle reasons: what the active faults set, nothing elsewhere."""
        throttle = self.gpus.throttle
        throttle[:] = 0
        for f in active:
            if MODELS[f.kind].throttle:
                throttle[self.index[f.the_node], f.the_gpu] = MODELS[f.kind].throttle
