"""The simulated cluster's hardware state in memory, vectorized over nodes with numpy.

Per node, per NIC (8 rail NICs ``mlx5_0..7`` + frontend ``mlx5_8``) the raw
counters of ``sim.fixture`` (PMA counters, mlx5 hw_counters, ``ethtool
-S`` stats; netdev statistics are derived from them at render time), the link
state (up, lanes, speed, carrier down events) and the lossless config (PFC,
ECN per priority); per GPU the fake-NVML state (utilization, throttle
reasons, 18 NVLinks with tx/rx KiB and error counters).

Counters are kept as their *true* unbounded values (int64); the width
behaviour of the hardware is applied when they are read out
(``raw_pma``/``raw_hw``): PMA error counters saturate at their IBTA width,
mlx5 Q/accel hw_counters are shown masked to 32 bits (they wrap), the rest are
64-bit.  The layout of ``C`` is ``(counter, node, device)`` so that the per-tick
column updates are contiguous.

Time: ``advance(dt, ...)`` moves the clock from ``t`` to ``t + dt``: first the
fault state at ``t + dt`` is applied (a link that goes down at ``start`` is
down in the snapshot taken at ``start``), then ``dt`` seconds of traffic and
fault evidence accumulate.  Traffic follows the synthetic job (``job.py``):
the bytes per second each rail NIC carries in the job's ring all-reduce; the
frontend NIC carries a little storage traffic.  What a fault does is ``sim.faults``' model (shared
with ``sim.fixture``); each fault draws its evidence from its own RNG, so a fault never changes the
traffic noise or another fault's evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .faults import GAUGES, MODELS, degraded, fault_rng, link_down, nvlink_evidence, port_evidence, reset_fraction
from .gpu_state import GpuState
from .hw import (
    NDEV,
    NGPU,
    NRAILS,
    NVL_FIELDS,
    NVLINKS,
    K,
    device_specs,
)
from .link_optics import LinkOptics
from .link_state import LinkState
from .port_counters import PortCounters
from .scenario import Fault, Scenario

EPOCH = 1764000000.0  # wall-clock time of simulated t = 0 (sample times are EPOCH + t)
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


class ClusterState:
    def __init__(self, scenario: Scenario, *, epoch: float = EPOCH) -> None:
        c = scenario.cluster
        self.scenario = scenario
        self.epoch = epoch
        self.n = n = c.nodes
        self.layout = c.layout
        self.names = c.node_names()
        self.index = {name: i for i, name in enumerate(self.names)}
        self.devs = device_specs(c.layout)
        self.t = 0.0
        self.tick = 0

        ident = np.random.default_rng([c.seed, 0])
        self.rng = np.random.default_rng([c.seed, 1])  # traffic noise
        # fault evidence: one RNG per fault (scalar draws), the fixture writer's for the same seed and fault
        self.frngs = [fault_rng(c.seed, i) for i in range(len(scenario.faults))]
        # identity
        self.guid_low = ident.integers(0, 1 << 40, size=(n, NDEV), dtype=np.int64)
        lid = ident.integers(0x10, 0x7FFF, size=(n, NDEV))  # drawn here: every draw keeps its place
        uuid_bits = ident.integers(0, 1 << 62, size=(n, NGPU, 3), dtype=np.int64)
        self.boot_id = ident.integers(0, 1 << 62, size=n, dtype=np.int64)
        # offered load when no job drives the rails (fraction of the nominal line rate)
        rail_util = ident.uniform(0.15, 0.55, size=(n, NRAILS))
        frontend_util = ident.uniform(0.01, 0.1, size=n)
        gpu_load = ident.uniform(0.15, 0.4, size=(n, NGPU))  # NVLink utilization of the job

        # link state, config and carrier down events so far (sim/link_state.py)
        self.links = LinkState(self.devs, n, ident.integers(0, 2, size=(n, NDEV), dtype=np.int64))
        self.lid = np.where(self.links.eth_mask[None, :], 0, lid)  # Ethernet ports have none

        # the NICs' counters and the traffic that moves them (sim/port_counters.py)
        self.counters = PortCounters(self.links, self.rng, rail_util, frontend_util)

        # GPUs and their NVLinks (sim/gpu_state.py)
        util = ident.integers(88, 100, size=(n, NGPU), dtype=np.int64)
        self.gpus = GpuState(n, uuid_bits, gpu_load, util,
                             ident.choice(np.array([0, 0, 0, 1, 2]), size=(n, NGPU, NVLINKS)))

        # a believable uptime of history
        uptime = ident.uniform(3600, 30 * 86400, size=(n, NDEV))
        self.counters.traffic(uptime, self.counters.default_offered(), self.links, baseline=True)
        self.gpus.nvlink_traffic(self.rng, ident.uniform(3600, 30 * 86400, size=(n, 1, 1)), np.ones(n))
        self._applied_resets: set[int] = set()
        self._flap_phase: dict[int, bool] = {}
        # the optics: each link's pre-FEC BER and its module's readings (sim/link_optics.py)
        self.optics = LinkOptics(scenario, n, self._fault_targets, self.links.up)
        self._set_fault_state(0.0)
        layout = c.switch_layout()
        self.switches = None
        if layout is not None:
            from .switches import SimSwitches

            self.switches = SimSwitches(scenario, self, layout)

    # ------------------------------------------------------------------ helpers
    def node_index(self, node: str) -> int:
        return self.index[node]

    def ts(self, t: float | None = None) -> float:
        """Sample time (epoch seconds) of simulated time t."""
        return self.epoch + (self.t if t is None else t)

    def unit_nodes(self, unit: int) -> range:
        npu = self.scenario.cluster.nodes_per_unit
        return range(unit * npu, min(self.n, (unit + 1) * npu))

    # ------------------------------------------------------------------ faults
    def _fault_targets(self, f: Fault) -> tuple[list[int], list[int]]:
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

    def _link_down(self, f: Fault, t: float) -> bool:
        fails_after = f.fails_at - f.start if f.fails_at is not None else None
        return link_down(f.kind, t - f.start, f.period, fails_after)

    def set_fault_state(self, t: float) -> None:
        """Link state, rates and config at t without advancing counters (sim/impact.py's job-only runs)."""
        self._set_fault_state(t)

    def link_state(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(up, lanes, speed), each (nodes, devices), of every link at time t, changing nothing: what
        the simulated agents' link watch reads between their polls, and what ``_set_fault_state`` applies."""
        want_up = np.ones_like(self.links.up)
        lanes = np.broadcast_to(self.links.nominal_lanes, self.links.lanes.shape).copy()
        speed = np.broadcast_to(self.links.nominal_speed, self.links.speed.shape).copy()
        for f in self.scenario.faults:
            m = MODELS[f.kind]
            if not f.active(t) or not m.link:
                continue
            nodes, devs = self._fault_targets(f)
            if self._link_down(f, t):
                want_up[np.ix_(nodes, devs)] = False
            elif m.link == "degraded":
                for nn in nodes:
                    for d in devs:
                        lanes[nn, d], speed[nn, d] = degraded(int(self.links.nominal_lanes[d]),
                                                              int(self.links.nominal_speed[d]), f.degrade)
        return want_up, lanes, speed

    def _set_fault_state(self, t: float) -> None:
        """Link state, rate and config as of time t; counts down events on transitions."""
        want_up, lanes, speed = self.link_state(t)
        pfc = np.zeros_like(self.links.pfc)
        pfc[:, self.links.eth_mask, 3] = True
        ecn = pfc.copy()
        for f in self.scenario.faults:
            if not f.active(t) or not MODELS[f.kind].config_off:
                continue
            nodes, devs = self._fault_targets(f)
            pfc[np.ix_(nodes, devs, [3])] = False
            ecn[np.ix_(nodes, devs, [3])] = False
        going_down = self.links.up & ~want_up
        if going_down.any():
            self.links.downs += going_down
            self.counters.C[K["pma:link_downed"]] += going_down
            self.counters.C[K["eth:link_down_events_phy"]] += going_down & self.links.eth_mask[None, :]
            for f in self.scenario.faults:
                per_down = MODELS[f.kind].recoveries_per_down
                if per_down and f.active(t):
                    nodes, devs = self._fault_targets(f)
                    self.counters.C[K["pma:link_error_recovery"]][np.ix_(nodes, devs)] += \
                        per_down * going_down[np.ix_(nodes, devs)]
        self.links.up = want_up
        self.links.lanes, self.links.speed = lanes, speed
        self.links.pfc, self.links.ecn_np, self.links.ecn_rp = pfc, ecn, ecn.copy()

    def effects(self, t: float | None = None) -> Effects:
        t = self.t if t is None else t
        n = self.n
        bw = self.links.gbps()[:, :NRAILS] / self.links.nominal_gbps[None, :NRAILS]
        # a rail NIC that is down: NCCL (PXN) sends its share through a neighbouring rail's NIC over
        # NVLink, at about half the bandwidth
        bw = np.where(self.links.up[:, :NRAILS], bw, 0.5)
        gpu = np.ones((n, NGPU))
        tp = np.ones(n)
        for f in self.scenario.faults:
            if not f.active(t):
                continue
            m = MODELS[f.kind]
            if m.bandwidth is not None:
                nodes, devs = self._fault_targets(f)
                devs = [d for d in devs if d < NRAILS]
                if not devs:
                    continue  # the frontend NIC carries no job traffic
                bw[np.ix_(nodes, devs)] *= m.bandwidth.at(f.mag)
            elif m.gpu_slow:
                gpu[self.index[f.the_node], f.the_gpu] *= f.mag
            elif m.tp_slow or m.tp_fixed != 1.0:
                tp[self.index[f.the_node]] *= (1 + m.tp_slow * f.mag) * m.tp_fixed
        if self.switches is not None:
            return Effects(bw, gpu, tp, self.switches.leaf_factor(t), self.switches.leaf_index)
        return Effects(bw, gpu, tp)

    # ------------------------------------------------------------------ time
    def advance(self, dt: float, rail_bytes_per_second: np.ndarray | None = None,
                nvlink_activity: np.ndarray | None = None, job_running: bool = True) -> None:
        """Move time by dt seconds.

        ``rail_bytes_per_second`` (nodes, rails): what the job offers each rail NIC (each direction);
        None: the fixed background load.  ``nvlink_activity`` (nodes,): NVLink load multiplier.
        """
        if dt <= 0:
            raise ValueError(f"dt must be > 0, got {dt}")
        t_new = self.t + dt
        self._set_fault_state(t_new)
        resets = [(i, f) for i, f in enumerate(self.scenario.faults)
                  if MODELS[f.kind].resets_counters and id(f) not in self._applied_resets and f.start <= t_new]
        counters = self.counters
        C = counters.C
        offered = counters.default_offered()
        if rail_bytes_per_second is not None:
            offered[:, :NRAILS] = rail_bytes_per_second
        dt_arr = np.full((self.n, NDEV), float(dt))
        for i, f in resets:
            # driver reload part-way through the interval: every counter of every mlx5 device restarts
            self._applied_resets.add(id(f))
            ni = self.index[f.the_node]
            C[:, ni, :] = 0
            self.links.downs[ni, :] = 0
            dt_arr[ni, :] = dt * reset_fraction(self.frngs[i])
        rx_scale = np.ones((self.n, NDEV))
        for f in self.scenario.faults:
            if MODELS[f.kind].rx_share and f.active(t_new):
                nodes, devs = self._fault_targets(f)
                rx_scale[np.ix_(nodes, devs)] = 1 - f.mag
        counters.traffic(dt_arr, offered, self.links, rx_scale=rx_scale)
        for g in GAUGES:
            C[K[g]] = 0  # a gauge reads what the active faults set it to this interval
        active = [(i, f) for i, f in enumerate(self.scenario.faults)
                  if f.active(t_new) and not MODELS[f.kind].resets_counters]
        for i, f in active:
            self._evidence(i, f, dt, t_new)
        self._background_errors(dt, t_new)
        act = np.ones(self.n) if nvlink_activity is None else nvlink_activity
        self.optics.advance(dt, t_new, self.links, C)
        gpus = self.gpus
        down = [(self.index[f.the_node], f.the_gpu, f.the_link) for f in self.scenario.faults
                if MODELS[f.kind].nvlink_down and f.active(t_new)]
        gpus.nvlink_traffic(self.rng, np.full((self.n, 1, 1), float(dt)), act if job_running else act * 0, down)
        gpus.util = self.rng.integers(88, 100, size=(self.n, NGPU)) if job_running else np.zeros((self.n, NGPU),
                                                                                                 np.int64)
        gpus.throttle[:] = 0
        for _, f in active:
            if MODELS[f.kind].throttle:
                gpus.throttle[self.index[f.the_node], f.the_gpu] = MODELS[f.kind].throttle
        if self.switches is not None:
            self.switches.advance(dt, t_new)
        self.t = t_new
        self.tick += 1

    def _background_errors(self, dt: float, t: float) -> None:
        """Decoy ``background_errors``: symbol errors at ``rate``/s on a healthy link, forever (many real
        links show a steady trickle).  Its own random stream, so it changes no other draw."""
        for k, d in enumerate(self.scenario.decoys):
            if d.kind != "background_errors" or not d.active(t, math.inf):
                continue
            rng = np.random.default_rng([self.scenario.cluster.seed, 7, k, self.tick])
            self.counters.C[K["pma:symbol_error"], self.index[d.the_node], d.the_rail] += \
                int(rng.poisson(d.value("rate") * dt))

    def _evidence(self, i: int, f: Fault, dt: float, t: float) -> None:
        """Counter evidence of the scenario's i-th fault, active at t, over dt seconds (``sim.faults``)."""
        m, r, since = MODELS[f.kind], self.frngs[i], t - f.start
        if m.nvlink:
            ni = self.index[f.the_node]
            for name, v, _ in nvlink_evidence(f.kind, r, dt, since, f.mag):
                self.gpus.nvl[_NVL[name], ni, f.the_gpu, f.the_link] += v
        if not m.counters:
            return  # state-only faults (link_flap's evidence is counted on its transitions)
        nodes, devs = self._fault_targets(f)
        C = self.counters.C
        for nn in nodes:
            for d in devs:
                for name, v, is_set in port_evidence(f.kind, r, dt, since, f.mag, self.devs[d].ethernet):
                    if is_set:
                        C[K[name], nn, d] = v
                    else:
                        C[K[name], nn, d] += v

    def node_guid(self, node: int, dev: int) -> str:
        from .hw import guid_str

        return guid_str("a088c2" if self.devs[dev].role == "compute" else "b83fd2", int(self.guid_low[node, dev]))
