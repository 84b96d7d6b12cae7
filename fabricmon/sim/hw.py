"""Static facts of the simulated DGX-H100-like node: devices, counter names and widths, formats.

Shared by the two tree writers, ``sim.tree`` (a node of a simulated cluster over
time) and ``sim.fixture`` (one node as fault snapshots, the trees the sources are
tested against), so both render identical layouts and formats.
"""

from __future__ import annotations

from dataclasses import dataclass

U32 = (1 << 32) - 1

# DGX-H100-like PCI addresses for the 8 compute rails (one CX-7 per GPU, behind the GPU's PCIe switch)
# plus a frontend NIC.  Bus numbers pick the netdev names; GPU i sits on NIC i's bus + 3.
RAIL_BDFS = ("0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0",
             "0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0")
RAIL_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)
FRONTEND_BDF = "0000:aa:00.0"
NRAILS = 8
NDEV = 9  # 8 rail NICs + frontend mlx5_8
FRONTEND = 8

# Per-lane rate in deci-Gb/s, as drivers/infiniband/core/sysfs.c rate_show() has it.
LANE_DGBPS = {"SDR": 25, "DDR": 50, "QDR": 100, "FDR10": 100, "FDR": 140, "EDR": 250, "HDR": 500,
              "NDR": 1000, "XDR": 2000}
SPEEDS = ("SDR", "DDR", "QDR", "FDR", "EDR", "HDR", "NDR", "XDR")  # index = speed code in the state arrays
SPEED_IDX = {s: i for i, s in enumerate(SPEEDS)}
# What a DOWN port reports: IB ports fall back to 4X SDR; mlx5 RoCE ports report their 4X QDR default.
DOWN_RATE = {"InfiniBand": (4, "SDR"), "Ethernet": (4, "QDR")}

# IB PMA PortCounters with the IBTA width of the wire counter; error counters SATURATE.
PMA_ERR_WIDTH = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16, "port_xmit_wait": 32,
}
PMA_TRAFFIC = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
               "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets")

# mlx5 hw_counters: Q counters and RoCE accel counters are 32-bit (WRAP); congestion + PPCNT are 64-bit.
HW_Q32 = ("rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect", "out_of_buffer",
          "out_of_sequence", "duplicate_request", "rnr_nak_retry_err", "packet_seq_err", "implied_nak_seq_err",
          "local_ack_timeout_err", "resp_local_length_error", "resp_cqe_error", "req_cqe_error",
          "req_remote_invalid_request", "req_remote_access_errors", "resp_remote_access_errors",
          "resp_cqe_flush_error", "req_cqe_flush_error", "req_transport_retries_exceeded",
          "req_rnr_retries_exceeded")
HW_ROCE_ACCL32 = ("roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
                  "roce_slow_restart_trans")
HW_CONG64 = ("rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent")
HW_PPCNT64 = ("rx_icrc_encapsulated",)
HW_LIFESPAN_MS = 10

# `ethtool -S` names of an mlx5 Ethernet netdev, in print order; outbound_pci_stalled_{rd,wr} are gauges (%).
# No rx_bits_phy: the inbox driver (en_stats.c) has none, so the simulator must not invent it.
# mlx5 lists the pause counters only for PFC-enabled priorities: priority 3 on every Ethernet NIC here.
PFC_STATS = ("rx_prio3_pause", "rx_prio3_pause_duration", "rx_prio3_pause_transition", "tx_prio3_pause",
             "tx_prio3_pause_duration", "rx_prio3_buf_discard", "rx_prio3_cong_discard", "rx_prio3_marked",
             "rx_prio3_discards")
ETH_STATS = (
    "rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_packets_phy", "tx_packets_phy", "rx_bytes_phy",
    "tx_bytes_phy", "rx_crc_errors_phy", "rx_symbol_err_phy", "rx_discards_phy", "tx_discards_phy",
    "rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "rx_out_of_buffer", "link_down_events_phy",
    "rx_buffer_passed_thres_phy", "tx_pause_storm_warning_events", "tx_pause_storm_error_events",
    "rx_pcs_symbol_err_phy", "rx_corrected_bits_phy", "rx_err_lane_0_phy", "rx_err_lane_1_phy",
    "rx_err_lane_2_phy", "rx_err_lane_3_phy", "rx_vport_rdma_unicast_packets", "rx_vport_rdma_unicast_bytes",
    "tx_vport_rdma_unicast_packets", "tx_vport_rdma_unicast_bytes", "outbound_pci_buffer_overflow",
    "outbound_pci_stalled_rd", "outbound_pci_stalled_wr", "outbound_pci_stalled_rd_events",
    "outbound_pci_stalled_wr_events", "dev_internal_queue_oob", "module_unplug", "module_bus_stuck",
    "module_high_temp", "module_bad_shorted",
) + tuple(name for p in range(8) for name in (f"rx_prio{p}_bytes", f"rx_prio{p}_packets", f"tx_prio{p}_bytes",
                                              f"tx_prio{p}_packets") + (PFC_STATS if p == 3 else ()))
ETH_Q32 = frozenset({"rx_out_of_buffer", "dev_internal_queue_oob"})  # 32-bit in firmware: they wrap
ETH_GAUGES = frozenset({"outbound_pci_stalled_rd", "outbound_pci_stalled_wr"})
PRIO_SHARE = (0.08, 0.0025, 0.0025, 0.9, 0.0025, 0.0025, 0.0025, 0.0025)  # RoCE on 3, TCP on 0
ROCE_PRIORITY = 3

NGPU, NVLINKS = 8, 18                 # H100 SXM: 18 NVLink4 links per GPU
NVLINK_KIB_S = 25e9 / 1024            # 25 GB/s per link and direction, in KiB/s
THROTTLE_THERMAL = 0x40 | 0x20        # HwThermalSlowdown | SwThermalSlowdown
NVL_FIELDS = ("tx_kib", "rx_kib", "replay", "recovery", "crc_flit", "crc_data")
GPU_NAME = "NVIDIA H100 80GB HBM3"

# One index space for every raw counter of a port: "pma:", "hw:" and "eth:" prefixed names.
COUNTER_NAMES: tuple[str, ...] = (
    tuple(f"pma:{n}" for n in PMA_TRAFFIC + tuple(PMA_ERR_WIDTH))
    + tuple(f"hw:{n}" for n in HW_Q32 + HW_ROCE_ACCL32 + HW_CONG64 + HW_PPCNT64)
    + tuple(f"eth:{n}" for n in ETH_STATS)
)
K = {name: i for i, name in enumerate(COUNTER_NAMES)}
NCOUNTERS = len(COUNTER_NAMES)


def rate_str(lanes: int, speed: str) -> str:
    """The `rate` file as the kernel prints it, e.g. (4, "NDR") -> "400 Gb/sec (4X NDR)"."""
    r = LANE_DGBPS[speed] * lanes
    return f"{r // 10}{'.5' if r % 10 else ''} Gb/sec ({lanes}X {speed})"


def gbps(lanes: int, speed: str) -> float:
    return LANE_DGBPS[speed] * lanes / 10


@dataclass(frozen=True)
class DeviceSpec:
    index: int
    name: str
    bdf: str
    numa: int
    rail: int | None
    gpu: int | None
    role: str  # compute | frontend
    ifname: str
    link_layer: str  # InfiniBand | Ethernet
    lanes: int
    speed: str
    hca_type: str
    board_id: str
    fw_ver: str

    @property
    def ethernet(self) -> bool:
        return self.link_layer == "Ethernet"


def device_specs(layout: str) -> tuple[DeviceSpec, ...]:
    """The node's 9 HCAs for a layout (sim.fixture builds its devices from these)."""
    roce = layout == "roce"
    devs = [DeviceSpec(i, f"mlx5_{i}", bdf, RAIL_NUMA[i], i, i, "compute",
                       f"enp{int(bdf[5:7], 16)}s0np0" if roce else f"ibp{int(bdf[5:7], 16)}s0",
                       "Ethernet" if roce else "InfiniBand", 4, "NDR", "MT4129", "MT_0000000838", "28.39.2048")
            for i, bdf in enumerate(RAIL_BDFS)]
    devs.append(DeviceSpec(FRONTEND, "mlx5_8", FRONTEND_BDF, 1, None, None, "frontend", "enp170s0f0np0",
                           "Ethernet", 4, "HDR", "MT41692", "NVD0000000033", "32.39.2048"))
    return tuple(devs)


def gpu_pci_bus_id(gpu: int) -> str:
    return f"00000000:{int(RAIL_BDFS[gpu][5:7], 16) + 3:02X}:00.0"


def pci_device_path(bdf: str) -> str:
    """Where a simulated PCI function sits under ``sys/devices``, as the kernel nests it.

    Rail NIC i and GPU i share one PCIe switch, as on an HGX H100 board (the pairing NCCL and the
    agent's rail rule read: fabricmon/sources/pci_affinity.py); any other function (the frontend
    NIC) sits in a root-port slot.  Numbered as tests/support/pcitree.py puts back the ports an NCCL
    topology dump folds: host bridge ``pci<dom>:<bus-1>`` with root port ``<bus-1>:01.0`` above the
    switch's upstream port on ``bus``, its downstream ports ``<bus+1>:<i>.0``."""
    bus = int(bdf[5:7], 16)
    gpus = [gpu_pci_bus_id(i)[4:].lower() for i in range(NRAILS)]
    if bdf in RAIL_BDFS or bdf in gpus:
        up = int(RAIL_BDFS[RAIL_BDFS.index(bdf) if bdf in RAIL_BDFS else gpus.index(bdf)][5:7], 16) - 2
        port = 0 if bdf in RAIL_BDFS else 1
        parts = [f"pci0000:{up - 1:02x}", f"0000:{up - 1:02x}:01.0", f"0000:{up:02x}:00.0",
                 f"0000:{up + 1:02x}:{port:02x}.0"]
    elif bus > 0:
        parts = [f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0"]
    else:
        parts = ["pci0000:00"]
    return "/".join([*parts, bdf])


def mac_from_guid(g: str) -> str:
    h = g.replace(":", "")
    six = h[:6] + h[10:]
    return ":".join(six[i:i + 2] for i in range(0, 12, 2))


def guid_str(oui: str, low40: int) -> str:
    raw = oui + f"{low40:010x}"
    return ":".join(raw[i:i + 4] for i in range(0, 16, 4))
