"""The simulated cluster's NIC counters and the traffic that moves them, vectorized over nodes.

Per node, per NIC (8 rail NICs ``mlx5_0..7`` + frontend ``mlx5_8``) the raw counters of ``sim.fixture``
(PMA counters, mlx5 hw_counters, ``ethtool -S`` stats; netdev statistics are derived from them at render
time), kept as their *true* unbounded values (int64); the width behaviour of the hardware is applied when
they are read out (``raw``): PMA error counters saturate at their IBTA width, mlx5 Q/accel hw_counters are
shown masked to 32 bits (they wrap), the rest are 64-bit.  The layout of ``C`` is ``(counter, node,
device)`` so that the per-tick column updates are contiguous.

Traffic: the bytes and packets each port carries at its offered load (the job's ring all-reduce on the
rail NICs, a fixed background share of the line rate without one), capped by the link's current rate,
with the background PFC pauses and ECN marking of a RoCE fabric.  A fault's evidence is added on top by
``sim.cluster``.
"""

from __future__ import annotations

import numpy as np

from .hw import (
    ETH_STATS,
    FRONTEND,
    HW_CONG64,
    HW_PPCNT64,
    HW_Q32,
    HW_ROCE_ACCL32,
    NCOUNTERS,
    NDEV,
    NRAILS,
    PMA_ERR_WIDTH,
    PRIO_SHARE,
    K,
)
from .link_state import Links


class NicCounters:
    def __init__(self, links: Links, rng: np.random.Generator, rail_util: np.ndarray,
                 frontend_util: np.ndarray) -> None:
        self.devs = links.devs
        self.n = n = len(frontend_util)
        self.rng = rng  # traffic noise (the cluster's, shared with the NVLink traffic)
        # offered load when no job drives the rails (fraction of the nominal line rate)
        self.rail_util = rail_util
        self.frontend_util = frontend_util
        self._nominal_gbps = links.nominal_gbps
        self.C = np.zeros((NCOUNTERS, n, NDEV), dtype=np.int64)
        self.C[K["pma:link_downed"]] = links.downs
        self.C[K["eth:link_down_events_phy"]] = links.downs * links.eth_mask

    def default_offered(self) -> np.ndarray:
        """(nodes, devices) offered bytes/s without a job: fixed share of the nominal line rate."""
        util = np.empty((self.n, NDEV))
        util[:, :NRAILS] = self.rail_util
        util[:, FRONTEND] = self.frontend_util
        return util * self._nominal_gbps[None, :] * 1e9 / 8

    def traffic(self, dt: np.ndarray, offered: np.ndarray, links: Links, rx_scale: np.ndarray | None = None,
                baseline: bool = False) -> None:
        """Add dt seconds of traffic at the offered load, capped by the current link rate (vectorized
        Port.advance of sim.fixture)."""
        C, rng, eth = self.C, self.rng, links.eth_mask[None, :]
        n = self.n
        cap = links.gbps() * 1e9 / 8 * 0.97
        up = links.up
        rate = np.minimum(offered * rng.uniform(0.9, 1.1, size=(n, NDEV)), cap)
        rate = np.where(up, rate, 0.0)
        tx = (rate * dt).astype(np.int64)
        rx = tx if rx_scale is None else (tx * rx_scale).astype(np.int64)
        txp, rxp = tx // 4096, rx // 4096
        C[K["pma:port_xmit_data"]] += tx // 4  # 4-octet words
        C[K["pma:port_rcv_data"]] += rx // 4
        C[K["pma:port_xmit_packets"]] += txp
        C[K["pma:port_rcv_packets"]] += rxp
        C[K["pma:unicast_xmit_packets"]] += txp - txp // 5000
        C[K["pma:unicast_rcv_packets"]] += rxp - rxp // 5000
        C[K["pma:multicast_xmit_packets"]] += txp // 5000
        C[K["pma:multicast_rcv_packets"]] += rxp // 5000
        util = np.where(up, rate / np.maximum(cap, 1.0), 0.0)
        C[K["pma:port_xmit_wait"]] += (dt * 1e3 * util * rng.uniform(0, 2, size=(n, NDEV))).astype(np.int64)
        C[K["hw:rx_write_requests"]] += rxp // 3  # RDMA operations arriving
        C[K["hw:rx_read_requests"]] += rxp // 50
        C[K["hw:rx_atomic_requests"]] += rxp // 100000
        # Ethernet (RoCE) ports: PHY, vport, per-priority counters, background PFC and ECN
        etx, erx = tx * eth, rx * eth
        etxp, erxp = txp * eth, rxp * eth
        for k, v in (("rx_bytes_phy", erx), ("tx_bytes_phy", etx), ("rx_packets_phy", erxp),
                     ("tx_packets_phy", etxp),
                     ("rx_vport_rdma_unicast_bytes", erx), ("tx_vport_rdma_unicast_bytes", etx),
                     ("rx_vport_rdma_unicast_packets", erxp), ("tx_vport_rdma_unicast_packets", etxp),
                     ("rx_bytes", erx // 50), ("tx_bytes", etx // 50),  # netdev (non-RDMA) share
                     ("rx_packets", erxp // 50), ("tx_packets", etxp // 50)):
            C[K["eth:" + k]] += v
        for prio, share in enumerate(PRIO_SHARE):
            C[K[f"eth:rx_prio{prio}_bytes"]] += (erx * share).astype(np.int64)
            C[K[f"eth:rx_prio{prio}_packets"]] += (erxp * share).astype(np.int64)
            C[K[f"eth:tx_prio{prio}_bytes"]] += (etx * share).astype(np.int64)
            C[K[f"eth:tx_prio{prio}_packets"]] += (etxp * share).astype(np.int64)
        live = eth & up
        for d, scale in (("rx", 2), ("tx", 1)):  # background PFC: a few short pauses now and then
            cnt = (rng.uniform(0, 1, size=(n, NDEV)) * (scale * dt + 1)).astype(np.int64) * live
            C[K[f"eth:{d}_prio3_pause"]] += cnt
            C[K[f"eth:{d}_prio3_pause_duration"]] += cnt * rng.integers(1, 11, size=(n, NDEV))  # microseconds
        C[K["eth:rx_prio3_pause_transition"]] = C[K["eth:rx_prio3_pause"]] // 2
        # background ECN marking in an all-reduce: a few marked packets per million, each answered by a CNP
        marked = (erxp * rng.uniform(0, 4e-6, size=(n, NDEV))).astype(np.int64)
        C[K["hw:np_ecn_marked_roce_packets"]] += marked
        C[K["hw:np_cnp_sent"]] += marked
        C[K["hw:rp_cnp_handled"]] += (etxp * rng.uniform(0, 4e-6, size=(n, NDEV))).astype(np.int64)
        C[K["eth:rx_prio3_marked"]] += marked
        if baseline:  # a little history, as on a real long-running node
            shape = (n, NDEV)
            for k, hi in (("hw:out_of_sequence", 40), ("hw:duplicate_request", 10), ("hw:local_ack_timeout_err", 3),
                          ("hw:req_cqe_flush_error", 200), ("hw:resp_cqe_flush_error", 200),
                          ("pma:link_error_recovery", 1)):
                C[K[k]] += rng.integers(0, hi + 1, size=shape)
            for k, lo, hi in (("eth:rx_discards_phy", 0, 5), ("eth:rx_out_of_buffer", 0, 20),
                              ("eth:rx_buffer_passed_thres_phy", 0, 50), ("eth:rx_corrected_bits_phy", 0, 5000),
                              ("eth:rx_prio3_marked", 0, 10000), ("hw:np_ecn_marked_roce_packets", 1000, 100000),
                              ("hw:rp_cnp_handled", 1000, 100000)):
                C[K[k]] += rng.integers(lo, hi + 1, size=shape) * eth
            C[K["hw:np_cnp_sent"]] += C[K["hw:np_ecn_marked_roce_packets"]] // 3

    def raw(self, name: str, node: int, dev: int) -> int:
        """The value the hardware shows for counter ``name`` ("pma:..", "hw:..", "eth:..")."""
        v = int(self.C[K[name], node, dev])
        kind, short = name.split(":", 1)
        if kind == "pma" and short in PMA_ERR_WIDTH:
            return min(v, (1 << PMA_ERR_WIDTH[short]) - 1)
        if kind == "hw" and (short in HW_Q32 or short in HW_ROCE_ACCL32):
            return v & 0xFFFFFFFF
        return v & 0xFFFFFFFFFFFFFFFF

    def node_counters(self, node: int) -> list[list[int]]:
        """[device][counter] true values of one node (for the tree renderer)."""
        return self.C[:, node, :].T.tolist()

    def hw_names(self, dev: int) -> tuple[str, ...]:
        d = self.devs[dev]
        return HW_Q32 + ((HW_ROCE_ACCL32 + HW_CONG64 + HW_PPCNT64) if d.ethernet else ())

    def eth_names(self) -> tuple[str, ...]:
        return ETH_STATS
