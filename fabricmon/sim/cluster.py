"""The simulated cluster's hardware state in memory, vectorized over nodes with numpy: a composition of
its parts, each in its own module, and the clock that moves them.

- ``links`` (``sim.link_state``): per node, per NIC (8 rail NICs ``mlx5_0..7`` + frontend ``mlx5_8``) the
  link state (up, lanes, speed, carrier down events) and the lossless config (PFC, ECN per priority);
- ``counters`` (``sim.nic_counters``): the NICs' raw counters of ``sim.fixture`` (PMA, mlx5
  hw_counters, ``ethtool -S``) as true unbounded values, and the traffic that moves them;
- ``gpus`` (``sim.gpu_state``): per GPU the fake-NVML state (utilization, throttle reasons, 18 NVLinks
  with tx/rx KiB and error counters);
- ``optics`` (``sim.link_optics``): each link's pre-FEC BER and its optical module's readings;
- ``faults`` (``sim.fault_state``): what the scenario's faults do to all of these, and to the job;
- ``switches`` (``sim.switches``): the switch side, when the cluster has spines;
- the nodes' identity here: names, devices, GUIDs, LIDs, boot ids.

Time: ``advance(dt, ...)`` moves the clock from ``t`` to ``t + dt``: first the
fault state at ``t + dt`` is applied (a link that goes down at ``start`` is
down in the snapshot taken at ``start``), then ``dt`` seconds of traffic and
fault evidence accumulate.  Traffic follows the synthetic job (``job.py``):
the bytes per second each rail NIC carries in the job's ring all-reduce; the
frontend NIC carries a little storage traffic.  Every random draw keeps its place: the identity RNG
draws in one order at construction, the traffic RNG (shared by the NIC and NVLink traffic) in one order
per interval, the optics and each fault their own streams, so a seed makes the same cluster.
"""

from __future__ import annotations

import numpy as np

from .fault_state import Effects, FaultState
from .gpu_state import Gpus
from .hw import (
    NDEV,
    NGPU,
    NRAILS,
    NVLINKS,
    device_specs,
)
from .link_optics import LinkOptics
from .link_state import Links
from .nic_counters import NicCounters
from .scenario import Scenario

EPOCH = 1764000000.0  # wall-clock time of simulated t = 0 (sample times are EPOCH + t)


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
        self.links = Links(self.devs, n, ident.integers(0, 2, size=(n, NDEV), dtype=np.int64))
        self.lid = np.where(self.links.eth_mask[None, :], 0, lid)  # Ethernet ports have none

        # the NICs' counters and the traffic that moves them (sim/nic_counters.py)
        self.counters = NicCounters(self.links, self.rng, rail_util, frontend_util)

        # GPUs and their NVLinks (sim/gpu_state.py)
        util = ident.integers(88, 100, size=(n, NGPU), dtype=np.int64)
        self.gpus = Gpus(n, uuid_bits, gpu_load, util,
                             ident.choice(np.array([0, 0, 0, 1, 2]), size=(n, NGPU, NVLINKS)))

        # a believable uptime of history
        uptime = ident.uniform(3600, 30 * 86400, size=(n, NDEV))
        self.counters.traffic(uptime, self.counters.default_offered(), self.links, baseline=True)
        self.gpus.nvlink_traffic(self.rng, ident.uniform(3600, 30 * 86400, size=(n, 1, 1)), np.ones(n))
        # what the scenario's faults do to the parts, and to the job (sim/fault_state.py)
        self.faults = FaultState(scenario, self.index, self.links, self.counters, self.gpus)
        # the optics: each link's pre-FEC BER and its module's readings (sim/link_optics.py)
        self.optics = LinkOptics(scenario, n, self.faults.targets, self.links.up)
        self.faults.apply(0.0)
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

    def effects(self, t: float | None = None) -> Effects:
        """What the faults active at t (default: now) do to the job."""
        return self.faults.effects(self.t if t is None else t, self.switches)

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
        faults, counters, gpus = self.faults, self.counters, self.gpus
        faults.apply(t_new)
        offered = counters.default_offered()
        if rail_bytes_per_second is not None:
            offered[:, :NRAILS] = rail_bytes_per_second
        dt_arr = faults.reset_counters(dt, t_new)
        counters.traffic(dt_arr, offered, self.links, rx_scale=faults.rx_scale(t_new))
        active = faults.add_evidence(dt, t_new, self.tick)
        act = np.ones(self.n) if nvlink_activity is None else nvlink_activity
        self.optics.advance(dt, t_new, self.links, counters.C)
        gpus.nvlink_traffic(self.rng, np.full((self.n, 1, 1), float(dt)), act if job_running else act * 0,
                            faults.nvlinks_down(t_new))
        gpus.util = self.rng.integers(88, 100, size=(self.n, NGPU)) if job_running else np.zeros((self.n, NGPU),
                                                                                                 np.int64)
        faults.throttle(active)
        if self.switches is not None:
            self.switches.advance(dt, t_new)
        self.t = t_new
        self.tick += 1

    def node_guid(self, node: int, dev: int) -> str:
        from .hw import guid_str

        return guid_str("a088c2" if self.devs[dev].role == "compute" else "b83fd2", int(self.guid_low[node, dev]))
