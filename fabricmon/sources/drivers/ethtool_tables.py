"""``ethtool -S`` names per driver family (mlx5, bnxt_en, ice): data, each table cited to its source.

Labels are those of the family's spec in ``metrics.SPECS`` after ``interface``.
A curated ``counter`` label carries the ``canonical`` name where a driver's own
spelling differs from the one the detectors read (``aggregator/detectors.py``
``PHY_ERRORS``): bnxt's ``rx_fcs_err_frames`` *is* the FCS error count that
mlx5 calls ``rx_crc_errors_phy``.  The raw name stays available through the
allowlist.
"""

from __future__ import annotations

from . import DriverTable, Kind, StatRule, XoffRefresh, raw_only
from .families import (
    ECN_MARKED,
    GLOBAL_PAUSE_FRAMES,
    GLOBAL_PAUSE_SECONDS,
    GLOBAL_PAUSE_TRANSITIONS,
    PAUSE_CONTROL_FRAMES,
    PAUSE_FRAMES,
    PAUSE_FRAMES_TC,
    PAUSE_SECONDS,
    PAUSE_TRANSITIONS,
    PCI_STALLED,
    PHY_BITS,
    PHY_CORRECTED,
    PHY_ERRORS,
    STORM_EVENTS,
)

_PD = (("priority", "{priority}"), ("direction", "{direction}"))
_ERR = (("counter", "{canonical}"),)


def _errors(*names: str) -> tuple[StatRule, ...]:
    return tuple(StatRule(n, PHY_ERRORS, _ERR, unit="errors") for n in names)


# --------------------------------------------------------------------------- mlx5
# drivers/net/ethernet/mellanox/mlx5/core/en_stats.c (pport_per_prio_pfc_stats_desc,
# pport_pfc_stall_stats_desc, pport_per_tc_congest_prio_stats_desc, pport_phy_statistical_stats_desc,
# pport_802_3_stats_desc, pcie_perf_stats_desc, q_stats_desc, vnic_env_stats_dev_oob_desc) and
# Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst.
MLX5_SOURCE = ("torvalds/linux drivers/net/ethernet/mellanox/mlx5/core/en_stats.c, en_rep.c; "
               "Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst")

#: Names of older mlx5 drivers -> the current en_stats.c name, so a kernel upgrade does not split a
#: series: mlx5 before kernel 4.8 (pport_802_3/2863 strings, renamed in "net/mlx5e: Reorganize
#: ethtool statistics", bfe6d8d1d433) and dev_out_of_buffer (renamed dev_internal_queue_oob before
#: merge, 2019; MLNX_OFED kept the old name).
LEGACY_NAMES: dict[str, str] = {
    "check_seq_err": "rx_crc_errors_phy",
    "symbol_err": "rx_symbol_err_phy",
    "too_long_errors": "rx_oversize_pkts_phy",
    "in_range_len_errors": "rx_in_range_len_errors_phy",
    "out_of_range_len": "rx_out_of_range_len_phy",
    "unsupported_op_rx": "rx_unsupported_op_phy",
    "in_discards": "rx_discards_phy",
    "out_discards": "tx_discards_phy",
    "out_errors": "tx_errors_phy",
    "pause_ctrl_rx": "rx_pause_ctrl_phy",
    "pause_ctrl_tx": "tx_pause_ctrl_phy",
    "dev_out_of_buffer": "dev_internal_queue_oob",
}

#: 32-bit in firmware, read with MLX5E_READ_CTR32_*, so they WRAP: the Q counters (QUERY_Q_COUNTER
#: out_of_buffer and friends; in switchdev mode the representor's rx_vport_out_of_buffer) and the
#: vNIC env dev_internal_queue_oob.
MLX5_Q32 = ("rx_out_of_buffer", "rx_if_down_packets", "rx_vport_out_of_buffer", "dev_internal_queue_oob")

_MLX5_PHY_ERRORS = (
    "rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy", "rx_discards_phy", "tx_discards_phy",
    "link_down_events_phy", "rx_buffer_passed_thres_phy",
    "outbound_pci_stalled_rd_events", "outbound_pci_stalled_wr_events", "outbound_pci_buffer_overflow",
    "rx_pci_signal_integrity", "tx_pci_signal_integrity", "tx_errors_phy",
    "rx_in_range_len_errors_phy", "rx_out_of_range_len_phy", "rx_oversize_pkts_phy", "rx_undersize_pkts_phy",
    "rx_fragments_phy", "rx_jabbers_phy", "rx_unsupported_op_phy", "total_success_recovery_phy",
)

MLX5 = DriverTable("mlx5_core", MLX5_SOURCE, (
    StatRule("{direction}_prio{priority}_pause", PAUSE_FRAMES, _PD, unit="frames"),
    StatRule("{direction}_prio{priority}_pause_duration", PAUSE_SECONDS, _PD, unit="us"),
    StatRule("rx_prio{priority}_pause_transition", PAUSE_TRANSITIONS, (("priority", "{priority}"),), unit="events"),
    StatRule("tx_prio{priority}_pause_transition", None),
    # 802.3x (global) pause is counted in the priority-0 slot and named apart (commit e989d5a532ce)
    StatRule("{direction}_global_pause", GLOBAL_PAUSE_FRAMES, (("direction", "{direction}"),), unit="frames"),
    StatRule("{direction}_global_pause_duration", GLOBAL_PAUSE_SECONDS, (("direction", "{direction}"),), unit="us"),
    StatRule("rx_global_pause_transition", GLOBAL_PAUSE_TRANSITIONS, (), unit="events"),
    StatRule("tx_global_pause_transition", None),
    StatRule("{direction}_pause_ctrl_phy", PAUSE_CONTROL_FRAMES, (("direction", "{direction}"),), unit="frames"),
    # pport_per_tc_congest_prio_stats_desc (shown when the device has the sbcam register)
    StatRule("rx_prio{priority}_marked", ECN_MARKED, (("priority", "{priority}"),), unit="packets"),
    StatRule("rx_prio{priority}_discards", PHY_ERRORS, _ERR, unit="packets"),
    StatRule("rx_prio{priority}_buf_discard", PHY_ERRORS, _ERR, unit="packets"),
    StatRule("rx_prio{priority}_cong_discard", PHY_ERRORS, _ERR, unit="packets"),
    StatRule("tx_pause_storm_warning_events", STORM_EVENTS, (("level", "warning"),), unit="events"),
    StatRule("tx_pause_storm_error_events", STORM_EVENTS, (("level", "error"),), unit="events"),
    # rx_bits_phy: where a driver has it (the inbox en_stats.c does not); nothing may depend on it
    StatRule("rx_bits_phy", PHY_BITS, (), unit="bits"),
    StatRule("rx_corrected_bits_phy", PHY_CORRECTED, (), unit="bits"),
    StatRule("rx_err_lane_{lane}_phy", PHY_ERRORS, _ERR, unit="errors"),
    StatRule("module_{rest}", PHY_ERRORS, _ERR, unit="events"),
    StatRule("outbound_pci_stalled_rd", PCI_STALLED, (("direction", "rd"),), Kind.GAUGE, unit="percent"),
    StatRule("outbound_pci_stalled_wr", PCI_STALLED, (("direction", "wr"),), Kind.GAUGE, unit="percent"),
    *_errors(*_MLX5_PHY_ERRORS),
    *(StatRule(n, PHY_ERRORS, _ERR, width=32, unit="packets") for n in MLX5_Q32),
    *(StatRule(old, PHY_ERRORS if new in _MLX5_PHY_ERRORS or new in MLX5_Q32 else PAUSE_CONTROL_FRAMES,
               _ERR if new in _MLX5_PHY_ERRORS or new in MLX5_Q32 else (("direction", new[:2]),),
               width=32 if new in MLX5_Q32 else 64, canonical=new)
      for old, new in LEGACY_NAMES.items()),
    # pport_per_prio_traffic_stats_desc; per-queue and per-channel software counters: known, raw only
    StatRule("{direction}_prio{priority}_bytes", None), StatRule("{direction}_prio{priority}_packets", None),
    StatRule("ch{n}_{rest}", None), StatRule("rx{n}_{rest}", None), StatRule("tx{n}_{rest}", None),
    StatRule("ptp_{rest}", None), StatRule("rx_xsk_{rest}", None), StatRule("tx_xsk_{rest}", None),
    *raw_only(
        "rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "rx_packets_phy", "rx_bytes_phy", "tx_packets_phy",
        "tx_bytes_phy", "rx_vport_unicast_packets", "rx_vport_unicast_bytes", "tx_vport_unicast_packets",
        "tx_vport_unicast_bytes", "rx_vport_multicast_packets", "rx_vport_multicast_bytes",
        "tx_vport_multicast_packets", "tx_vport_multicast_bytes", "rx_vport_broadcast_packets",
        "rx_vport_broadcast_bytes", "tx_vport_broadcast_packets", "tx_vport_broadcast_bytes",
        "rx_vport_rdma_unicast_packets", "rx_vport_rdma_unicast_bytes", "tx_vport_rdma_unicast_packets",
        "tx_vport_rdma_unicast_bytes", "rx_vport_rdma_multicast_packets", "rx_vport_rdma_multicast_bytes",
        "tx_vport_rdma_multicast_packets", "tx_vport_rdma_multicast_bytes", "rx_multicast_phy",
        "tx_multicast_phy", "rx_broadcast_phy", "tx_broadcast_phy", "rx_csum_unnecessary",
        "rx_csum_none", "rx_csum_complete", "tx_csum_partial", "tx_csum_none", "rx_wqe_err",
        "rx_buff_alloc_err", "rx_cqe_compress_blks", "rx_cqe_compress_pkts", "tx_queue_stopped",
        "tx_queue_wake", "tx_queue_dropped", "tx_xmit_more", "tx_recover", "tx_cqes", "tx_cqe_err",
        "rx_cache_reuse", "rx_cache_full", "rx_cache_empty", "rx_cache_busy", "rx_cache_waive",
        "rx_congst_umr", "rx_arfs_err", "rx_recover", "ch_events", "ch_poll", "ch_arm", "ch_aff_change",
        "ch_force_irq", "ch_eq_rearm", "rx_mac_control_phy", "tx_mac_control_phy", "rx_steer_missed_packets",
        # kernels 4.5-4.7 (pport_strings, vport_strings of en.h) without a curated twin
        "alignment_err", "frames_rx", "frames_tx", "in_errors", "in_octets", "in_ucast_pkts", "mac_control_rx",
        "mac_control_tx", "octets_received", "octets_tx", "out_octets", "vport_rx_bytes", "vport_rx_packets",
        "vport_tx_bytes", "vport_tx_packets",
    ),
))


# --------------------------------------------------------------------------- bnxt_en
BNXT_EN_SOURCE = ("Broadcom/linux@0409acf0dd87d9fddca3540aa45cc233d8babee1 "
                  "drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c (bnxt_port_stats_arr, "
                  "bnxt_port_stats_ext_arr, bnxt_tx_port_stats_ext_arr, bnxt_{rx,tx}_{bytes,pkts}_pri_arr, "
                  "bnxt_pcie_stats_arr, bnxt_ring_stats_str)")

BNXT_EN = DriverTable("bnxt_en", BNXT_EN_SOURCE, (
    # PFC frames per priority (bnxt_port_stats_arr), pause time and transitions per priority (port_stats_ext)
    StatRule("{direction}_pfc_ena_frames_pri{priority}", PAUSE_FRAMES, _PD, unit="frames"),
    StatRule("pfc_pri{priority}_{direction}_duration_us", PAUSE_SECONDS, _PD, unit="us"),
    StatRule("pfc_pri{priority}_rx_transitions", PAUSE_TRANSITIONS, (("priority", "{priority}"),), unit="events"),
    StatRule("pfc_pri{priority}_tx_transitions", None),
    # 802.3x pause and all PFC frames, as the MAC counts them
    StatRule("{direction}_pause_frames", GLOBAL_PAUSE_FRAMES, (("direction", "{direction}"),), unit="frames"),
    StatRule("{direction}_pfc_frames", PAUSE_CONTROL_FRAMES, (("direction", "{direction}"),), unit="frames"),
    # pause storms: the port saw pause without relief (RoCE priority, and any priority)
    StatRule("continuous_roce_pause_events", STORM_EVENTS, (("level", "continuous_roce"),), unit="events"),
    StatRule("continuous_pause_events", STORM_EVENTS, (("level", "continuous"),), unit="events"),
    StatRule("resume_roce_pause_events", None), StatRule("resume_pause_events", None),
    # PHY: FCS and PCS errors, FEC-corrected bits over received bits (the BER numerator and denominator)
    StatRule("rx_fcs_err_frames", PHY_ERRORS, _ERR, unit="frames", canonical="rx_crc_errors_phy"),
    StatRule("rx_pcs_symbol_err", PHY_ERRORS, _ERR, unit="errors", canonical="rx_pcs_symbol_err_phy"),
    StatRule("link_down_events", PHY_ERRORS, _ERR, unit="events", canonical="link_down_events_phy"),
    StatRule("rx_buffer_passed_threshold", PHY_ERRORS, _ERR, unit="events", canonical="rx_buffer_passed_thres_phy"),
    StatRule("rx_corrected_bits", PHY_CORRECTED, (), unit="bits"),
    StatRule("rx_bits", PHY_BITS, (), unit="bits"),
    StatRule("rx_discard_packets_cos{cos}", PHY_ERRORS, _ERR, unit="packets"),
    StatRule("rx_discard_bytes_cos{cos}", None),
    *_errors("rx_align_err_frames", "rx_ovrsz_frames", "rx_jbr_frames", "rx_mtu_err_frames", "rx_undrsz_frames",
             "rx_runt_frames", "rx_stat_discard", "rx_stat_err", "tx_fcs_err_frames", "tx_err", "tx_stat_discard",
             "tx_stat_error", "tx_jabber_frames", "tx_fifo_underruns",
             "pcie_pl_signal_integrity", "pcie_dl_signal_integrity", "pcie_tl_signal_integrity",
             "pcie_link_integrity"),
    StatRule("rx_fec_corrected_blocks", PHY_ERRORS, _ERR, unit="events"),
    StatRule("rx_fec_uncorrectable_blocks", PHY_ERRORS, _ERR, unit="events"),
    # per-CoS and per-priority traffic, per-ring software counters: known, raw only
    StatRule("{direction}_bytes_cos{cos}", None), StatRule("{direction}_packets_cos{cos}", None),
    StatRule("{direction}_bytes_pri{priority}", None), StatRule("{direction}_packets_pri{priority}", None),
    StatRule("[{n}]: {rest}", None),
    StatRule("pcie_{rest}", None),
    *raw_only(
        "rx_total_discard_pkts", "tx_total_discard_pkts",
        "rx_64b_frames", "rx_65b_127b_frames", "rx_128b_255b_frames", "rx_256b_511b_frames",
        "rx_512b_1023b_frames", "rx_1024b_1518b_frames", "rx_good_vlan_frames", "rx_1519b_2047b_frames",
        "rx_2048b_4095b_frames", "rx_4096b_9216b_frames", "rx_9217b_16383b_frames", "rx_total_frames",
        "rx_ucast_frames", "rx_mcast_frames", "rx_bcast_frames", "rx_ctrl_frames", "rx_tagged_frames",
        "rx_double_tagged_frames", "rx_good_frames", "rx_eee_lpi_events", "rx_eee_lpi_duration", "rx_bytes",
        "rx_runt_bytes", "tx_64b_frames", "tx_65b_127b_frames", "tx_128b_255b_frames", "tx_256b_511b_frames",
        "tx_512b_1023b_frames", "tx_1024b_1518b_frames", "tx_good_vlan_frames", "tx_1519b_2047b_frames",
        "tx_2048b_4095b_frames", "tx_4096b_9216b_frames", "tx_9217b_16383b_frames", "tx_good_frames",
        "tx_total_frames", "tx_ucast_frames", "tx_mcast_frames", "tx_bcast_frames", "tx_eee_lpi_events",
        "tx_eee_lpi_duration", "tx_total_collisions", "tx_bytes", "tx_xthol_frames", "rx_filter_miss",
    ),
))


# --------------------------------------------------------------------------- ice
ICE_SOURCE = ("torvalds/linux@bc2f6edebd94aa2aff686eee92d72f44bab1731a "
              "drivers/net/ethernet/intel/ice/ice_ethtool.c (ice_gstrings_vsi_stats, ice_gstrings_pf_stats, "
              "ice_get_strings: tx/rx_priority_%u_xon/xoff.nic, tx/rx_queue_%u_packets/bytes)")
# ice counts the priorities of one traffic class together (DESIGN): the per-priority PFC counters are
# labelled traffic_class, not priority, which would claim a per-priority count the hardware lacks.
_TC = (("traffic_class", "{tc}"), ("direction", "{direction}"))
# ice counts XOFF/XON frames, not pause time.  The E810's MAC takes its PFC pause quanta and XOFF
# refresh timer from the PRTMAC_HSEC_CTL_TX_PAUSE_QUANTA / _REFRESH_TIMER registers that the firmware
# programs (ice_common.c ice_fill_tx_timer_and_fc_thresh only reads them back); the values are Intel's
# defaults for that MAC, as the i40e driver writes them for the same registers: quanta 0xFFFF and a
# refresh at half of it (i40e_dcb.c i40e_dcb_hw_pfc_config: refresh_time = I40E_DEFAULT_PAUSE_TIME / 2,
# "PRTMAC_HSEC_CTL_TX_PAUSE_QUANTA default value is 0xFFFF").  At 100 Gb/s: 5,960 XOFF/s paused throughout.
ICE_XOFF_REFRESH = XoffRefresh(0xFFFF // 2, (
    "torvalds/linux drivers/net/ethernet/intel/i40e/i40e_dcb.c i40e_dcb_hw_pfc_config (refresh_time = "
    "I40E_DEFAULT_PAUSE_TIME / 2, quanta default 0xFFFF); ice_common.c ice_fill_tx_timer_and_fc_thresh "
    "reads the same HSEC_CTL registers, set by the E810 firmware"))

ICE = DriverTable("ice", ICE_SOURCE, (
    StatRule("{direction}_priority_{tc}_xoff.nic", PAUSE_FRAMES_TC, _TC + (("type", "xoff"),), unit="frames"),
    StatRule("{direction}_priority_{tc}_xon.nic", PAUSE_FRAMES_TC, _TC + (("type", "xon"),), unit="frames"),
    StatRule("link_xoff_rx.nic", GLOBAL_PAUSE_FRAMES, (("direction", "rx"),), unit="frames"),
    StatRule("link_xoff_tx.nic", GLOBAL_PAUSE_FRAMES, (("direction", "tx"),), unit="frames"),
    StatRule("link_xon_rx.nic", None), StatRule("link_xon_tx.nic", None),
    StatRule("rx_crc_errors.nic", PHY_ERRORS, _ERR, unit="frames", canonical="rx_crc_errors_phy"),
    # the counters ice also reports as the standard eth-mac/rmon stats (ice_get_eth_mac_stats,
    # ice_get_rmon_stats) carry the same canonical names, so each is one series
    StatRule("rx_length_errors.nic", PHY_ERRORS, _ERR, unit="frames", canonical="rx_in_range_len_errors_phy"),
    StatRule("rx_oversize.nic", PHY_ERRORS, _ERR, unit="frames", canonical="rx_oversize_pkts_phy"),
    StatRule("rx_undersize.nic", PHY_ERRORS, _ERR, unit="frames", canonical="rx_undersize_pkts_phy"),
    StatRule("rx_fragments.nic", PHY_ERRORS, _ERR, unit="frames", canonical="rx_fragments_phy"),
    StatRule("rx_jabber.nic", PHY_ERRORS, _ERR, unit="frames", canonical="rx_jabbers_phy"),
    *_errors("illegal_bytes.nic", "mac_local_faults.nic", "mac_remote_faults.nic", "rx_dropped.nic",
             "tx_dropped_link_down.nic", "tx_errors.nic"),
    StatRule("{direction}_queue_{n}_packets", None), StatRule("{direction}_queue_{n}_bytes", None),
    *raw_only(
        "rx_unicast", "tx_unicast", "rx_multicast", "tx_multicast", "rx_broadcast", "tx_broadcast", "rx_bytes",
        "tx_bytes", "rx_dropped", "rx_unknown_protocol", "rx_alloc_fail", "rx_pg_alloc_fail", "tx_errors",
        "tx_linearize", "tx_busy", "tx_restart", "rx_gro_dropped",
        "rx_bytes.nic", "tx_bytes.nic", "rx_unicast.nic", "tx_unicast.nic", "rx_multicast.nic", "tx_multicast.nic",
        "rx_broadcast.nic", "tx_broadcast.nic", "tx_timeout.nic", "rx_size_64.nic", "tx_size_64.nic",
        "rx_size_127.nic", "tx_size_127.nic", "rx_size_255.nic", "tx_size_255.nic", "rx_size_511.nic",
        "tx_size_511.nic", "rx_size_1023.nic", "tx_size_1023.nic", "rx_size_1522.nic", "tx_size_1522.nic",
        "rx_size_big.nic", "tx_size_big.nic", "rx_csum_bad.nic", "fdir_sb_match.nic", "fdir_sb_status.nic",
        "tx_hwtstamp_skipped", "tx_hwtstamp_timeouts", "tx_hwtstamp_flushed", "tx_hwtstamp_discarded",
        "late_cached_phc_updates", "rx_eipe_error.nic",
    ),
), xoff_refresh=ICE_XOFF_REFRESH)

# --------------------------------------------------------------------------- standard groups
STANDARD_GROUPS_SOURCE = ("torvalds/linux net/ethtool/common.c (stats_eth_phy_names, stats_eth_mac_names, "
                          "stats_eth_ctrl_names, stats_rmon_names), include/uapi/linux/ethtool_netlink.h "
                          "(ETHTOOL_A_STATS_*): IEEE 802.3 clause 30 and RFC 2819 names, any driver")
_STD_ERRORS = ("eth-mac/AlignmentErrors", "eth-mac/FramesLostDueToIntMACRcvError",
               "eth-mac/FramesLostDueToIntMACXmitError", "eth-mac/CarrierSenseErrors",
               "rmon/etherStatsOversizePkts")
#: the same IEEE counter under the name mlx5 gives it (en_stats.c pport_802_3 / pport_2819 descs), so a
#: driver that has both spellings exports one series
_STD_CANONICAL = {
    "eth-mac/FrameCheckSequenceErrors": "rx_crc_errors_phy",
    "eth-phy/SymbolErrorDuringCarrier": "rx_symbol_err_phy",
    "eth-mac/InRangeLengthErrors": "rx_in_range_len_errors_phy",
    "eth-mac/OutOfRangeLengthField": "rx_out_of_range_len_phy",
    "eth-mac/FrameTooLongErrors": "rx_oversize_pkts_phy",
    "rmon/etherStatsUndersizePkts": "rx_undersize_pkts_phy",
    "rmon/etherStatsFragments": "rx_fragments_phy",
    "rmon/etherStatsJabbers": "rx_jabbers_phy",
}

#: names are "<group>/<Stat>" (sources/ethtool_groups.py); a series a driver's own -S stats already
#: give (mlx5 rx_crc_errors_phy, ice rx_crc_errors.nic) keeps the driver's value, not a second one
STANDARD_GROUPS = DriverTable("standard-groups", STANDARD_GROUPS_SOURCE, (
    *(StatRule(n, PHY_ERRORS, _ERR, unit="errors", canonical=c) for n, c in _STD_CANONICAL.items()),
    *_errors(*_STD_ERRORS),
    StatRule("eth-mac/{rest}", None), StatRule("eth-ctrl/{rest}", None),
))

#: driver name (ethtool GDRVINFO ``driver``, or the sysfs driver link) -> table
TABLES: dict[str, DriverTable] = {t.driver: t for t in (MLX5, BNXT_EN, ICE)}
#: a driver name no table knows, or none at all (a fixture tree without the driver link): every table,
#: mlx5 first (names of the three families do not collide)
ALL: tuple[DriverTable, ...] = (MLX5, BNXT_EN, ICE)
