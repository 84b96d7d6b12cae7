"""The simulated cluster's link state, vectorized over (node, device): up, width, speed, carrier down
events, and the lossless config (PFC, ECN per priority) and MTU of each port.

``sim.fault_state`` sets it from the scenario's faults at each time; the traffic, the optics, the node trees
and the in-memory batches read it.  The arrays are replaced, not changed in place, when the state moves:
readers take them from here each time they read (``links.up``), never keep one.
"""

from __future__ import annotations

import numpy as np

from .hw import DOWN_RATE, LANE_DGBPS, NDEV, SPEED_IDX, SPEEDS, DeviceSpec, rate_str

_LANE_DGBPS_BY_IDX = np.array([LANE_DGBPS[s] for s in SPEEDS], dtype=np.float64)


class Links:
    def __init__(self, devs: tuple[DeviceSpec, ...], n: int, downs: np.ndarray) -> None:
        self.devs = devs
        self.eth_mask = np.array([d.ethernet for d in devs])
        self.nominal_lanes = np.array([d.lanes for d in devs], dtype=np.int64)
        self.nominal_speed = np.array([SPEED_IDX[d.speed] for d in devs], dtype=np.int64)
        self.nominal_gbps = np.array([LANE_DGBPS[d.speed] * d.lanes / 10 for d in devs])
        self.up = np.ones((n, NDEV), dtype=bool)
        self.lanes = np.broadcast_to(self.nominal_lanes, (n, NDEV)).copy()
        self.speed = np.broadcast_to(self.nominal_speed, (n, NDEV)).copy()
        self.downs = downs  # carrier down events so far
        # lossless config (Ethernet ports): PFC and ECN (np, rp) enabled per priority
        self.pfc = np.zeros((n, NDEV, 8), dtype=bool)
        self.pfc[:, self.eth_mask, 3] = True
        self.ecn_np = self.pfc.copy()
        self.ecn_rp = self.pfc.copy()
        self.mtu = np.where(self.eth_mask, 9000, 4092)

    def gbps(self) -> np.ndarray:
        """(nodes, devices) current signalling rate in Gb/s (ignoring up/down)."""
        return _LANE_DGBPS_BY_IDX[self.speed] * self.lanes / 10

    def rate_text(self, node: int, dev: int) -> str:
        d = self.devs[dev]
        if not self.up[node, dev]:
            return rate_str(*DOWN_RATE[d.link_layer])
        return rate_str(int(self.lanes[node, dev]), SPEEDS[self.speed[node, dev]])
