"""The optics of the simulated cluster's links: each link's pre-FEC bit error rate, wandering around its own
level, the FEC-corrected bits it makes (``rx_corrected_bits_phy`` and per lane ``rx_err_lane_N_phy`` on
Ethernet ports), and each port's 4-lane optical module (RX/TX power, TX bias, temperature) with the
EEPROM image (SFF-8636) the agent's transceiver source reads.

A degrading cable (``cable_degrading``) and a leaf whose ports degrade with ``optics`` drive one lane's
BER towards the FEC limit, its RX power down and the module warmer.  Own RNG (and the bad lane's own
stream): the optics never change the traffic noise or a fault's counter evidence.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np

from .hw import NDEV, K
from .link_state import Links
from .scenario import Fault, Scenario

OPTIC_LANES = 4
BER_WANDER = 0.08  # stationary std of a healthy link's log10 BER around its level (decades)
BER_TAU_S = 60.0  # correlation time of that wander
DEGRADED_BER_LOG = -3.6  # the bad lane at fails_at: near the KP4 FEC limit, where links drop
LEAF_OPTICS_RAMP_S = 600.0  # leaf_degraded with optics and no end: its ports' drift reaches the FEC limit here
MODULE_INTERVAL_S = 30.0  # module readings refresh (the agent's sources.transceiver.interval)
_DATA_PER_LINE = 0.97  # 256b/257b + FEC overhead of the line rate (what the agent's data rate gauge says)


class LinkOptics:
    def __init__(self, scenario: Scenario, n: int, targets: Callable[[Fault], tuple[list[int], list[int]]],
                 up: np.ndarray) -> None:
        """Per link: a pre-FEC BER level (log10) that wanders around its own stable level, and a
        4-lane optical module (RX/TX power, TX bias, temperature).  Own RNG: optics never change
        the traffic noise.  ``targets``: the (nodes, devices) a fault touches; ``up``: the links' state."""
        self.scenario = scenario
        self._targets = targets
        seed = scenario.cluster.seed
        self.orng = np.random.default_rng([seed, 2])
        o = self.orng
        # NDR PAM4 links run at a pre-FEC BER of 1e-8..1e-6, far below the KP4 FEC limit (2.4e-4)
        self.ber_level = o.uniform(-8.0, -6.5, size=(n, NDEV))
        self.ber_log = self.ber_level + o.normal(0, BER_WANDER, size=(n, NDEV))
        share = o.uniform(0.8, 1.2, size=(n, NDEV, OPTIC_LANES))
        self.lane_share = share / share.sum(axis=2, keepdims=True)
        self.rx_dbm0 = o.uniform(-2.5, 0.5, size=(n, NDEV, OPTIC_LANES))
        self.tx_dbm0 = o.uniform(-1.0, 1.5, size=(n, NDEV, OPTIC_LANES))
        self.bias_ma0 = o.uniform(6.0, 9.0, size=(n, NDEV, OPTIC_LANES))
        self.temp_c0 = o.uniform(38.0, 52.0, size=(n, NDEV))
        self.rx_dbm = self.rx_dbm0.copy()
        self.tx_dbm = self.tx_dbm0.copy()
        self.bias_ma = self.bias_ma0.copy()
        self.temp_c = self.temp_c0.copy()
        self.lane_ber_log = np.repeat(self.ber_log[:, :, None], OPTIC_LANES, axis=2)
        # the degrading cable's bad lane: an optics property (the fixture has no optics), drawn from the
        # stream the simulator has always drawn it from, so a scenario keeps its lane
        lanes = random.Random(seed * 7919 + 17)
        self.bad_lane = {id(f): lanes.randrange(OPTIC_LANES) for f in self.scenario.faults
                         if f.kind == "cable_degrading"}
        self._read_modules(0.0, self.rx_dbm0, self.temp_c0, up)

    def advance(self, dt: float, t: float, links: Links, C: np.ndarray) -> None:
        """dt seconds of FEC-corrected bits (rx_corrected_bits_phy and per lane rx_err_lane_N_phy on
        Ethernet ports) at each link's BER over its data rate, and the module readings, refreshed
        every MODULE_INTERVAL_S as an agent's slow module reader would."""
        o = self.orng
        # mean-reverting wander (Ornstein-Uhlenbeck, correlation time BER_TAU_S): the level stays
        a = math.exp(-dt / BER_TAU_S)
        self.ber_log = self.ber_level + (self.ber_log - self.ber_level) * a + \
            o.normal(0, BER_WANDER * math.sqrt(1 - a * a), size=self.ber_log.shape)
        lane_log = np.repeat(self.ber_log[:, :, None], OPTIC_LANES, axis=2)
        rx = self.rx_dbm0.copy()
        temp = self.temp_c0.copy()
        for f in self.scenario.faults:
            if f.kind != "cable_degrading" or not f.active(t):
                continue
            nodes, devs = self._targets(f)
            ni, d = nodes[0], devs[0]
            lane = self.bad_lane[id(f)]
            p = min(1.0, (t - f.start) / (f.the_fails_at - f.start))
            # the bad lane's BER climbs (linear in log) to the FEC limit by fails_at
            lane_log[ni, d, lane] = self.ber_log[ni, d] + (DEGRADED_BER_LOG - self.ber_log[ni, d]) * p
            rx[ni, d, lane] -= 4.0 * f.mag * p
            temp[ni, d] += 6.0 * p
        for f in self.scenario.faults:
            if f.kind == "leaf_degraded" and f.optics and f.active(t):
                self._leaf_optics(f, t, lane_log, rx, temp)
        self.lane_ber_log = lane_log
        bits_per_s = links.gbps() * 1e9 * _DATA_PER_LINE
        lane_bits = (10.0 ** lane_log) * self.lane_share * OPTIC_LANES * (bits_per_s * dt / OPTIC_LANES)[:, :, None]
        live = (links.eth_mask[None, :] & links.up)[:, :, None]
        lane_cnt = o.poisson(lane_bits * live).astype(np.int64)
        for lane in range(OPTIC_LANES):
            C[K[f"eth:rx_err_lane_{lane}_phy"]] += lane_cnt[:, :, lane]
        C[K["eth:rx_corrected_bits_phy"]] += lane_cnt.sum(axis=2)
        if t - self.module_taken_at >= MODULE_INTERVAL_S:
            self._read_modules(t, rx, temp, links.up)

    def _read_modules(self, t: float, rx: np.ndarray, temp: np.ndarray, up: np.ndarray) -> None:
        o = self.orng
        self.module_taken_at = t
        shape = self.rx_dbm0.shape
        self.rx_dbm = rx + o.normal(0, 0.03, size=shape)
        self.tx_dbm = self.tx_dbm0 + o.normal(0, 0.03, size=shape)
        self.bias_ma = self.bias_ma0 + o.normal(0, 0.02, size=shape)
        self.temp_c = temp + o.normal(0, 0.2, size=self.temp_c0.shape)
        # a dark lane (link down: no light from the far end) reads about nothing
        self.rx_dbm = np.where(up[:, :, None], self.rx_dbm, -40.0)

    def module_image(self, node: int, dev: int) -> bytes:
        """The module EEPROM (SFF-8636 lower + upper page 00h, QSFP28-style 4 lanes) of one port."""
        from .optics import sff8636_image

        return sff8636_image(float(self.temp_c[node, dev]), 3.3,
                             [10 ** (x / 10) * 1e-3 for x in self.rx_dbm[node, dev]],
                             [10 ** (x / 10) * 1e-3 for x in self.tx_dbm[node, dev]],
                             [x * 1e-3 for x in self.bias_ma[node, dev]])

    def _leaf_optics(self, f: Fault, t: float, lane_log: np.ndarray, rx: np.ndarray, temp: np.ndarray) -> None:
        """A leaf_degraded fault with ``optics``: every port of the leaf drifts as a dying cable does (one
        lane's BER climbing to the FEC limit, its RX power falling 4 dB, the module
        warming) over the fault's span (LEAF_OPTICS_RAMP_S when it has no end).  Each port's bad lane is
        drawn from its position, so it stays put for the whole fault."""
        nodes, devs = self._targets(f)
        span = (f.end - f.start) if f.end is not None else LEAF_OPTICS_RAMP_S
        p = min(1.0, (t - f.start) / span)
        for ni in nodes:
            for d in devs:
                lane = (ni * 7 + d * 3) % OPTIC_LANES
                lane_log[ni, d, lane] = self.ber_log[ni, d] + (DEGRADED_BER_LOG - self.ber_log[ni, d]) * p
                rx[ni, d, lane] -= 4.0 * p
                temp[ni, d] += 6.0 * p
