"""Names of the curated metric families driver statistics land in (see ``metrics.SPECS``)."""

from __future__ import annotations

# ethtool
PAUSE_FRAMES = "fabricmon_pfc_pause_frames_total"
PAUSE_SECONDS = "fabricmon_pfc_pause_seconds_total"
PAUSE_TRANSITIONS = "fabricmon_pfc_pause_transitions_total"
PAUSE_FRAMES_TC = "fabricmon_pfc_frames_by_traffic_class_total"
XOFF_FULL_RATE = "fabricmon_pfc_xoff_refresh_frames_per_second"
STORM_EVENTS = "fabricmon_pfc_pause_storm_events_total"
PHY_ERRORS = "fabricmon_netdev_phy_errors_total"
PHY_BITS = "fabricmon_netdev_phy_received_bit_total"
PHY_CORRECTED = "fabricmon_netdev_phy_corrected_bit_total"
GLOBAL_PAUSE_FRAMES = "fabricmon_global_pause_frames_total"
GLOBAL_PAUSE_SECONDS = "fabricmon_global_pause_seconds_total"
GLOBAL_PAUSE_TRANSITIONS = "fabricmon_global_pause_transitions_total"
PAUSE_CONTROL_FRAMES = "fabricmon_netdev_pause_control_frames_total"
ECN_MARKED = "fabricmon_netdev_ecn_marked_packets_total"
PCI_STALLED = "fabricmon_netdev_pci_stalled_ratio"

# hw_counters
HW_STAT = "fabricmon_rdma_hw_stat_total"
HW_GAUGE = "fabricmon_rdma_hw_stat_level"
HW_HIGH_WATER = "fabricmon_rdma_hw_stat_high_water"
HW_LIFESPAN = "fabricmon_rdma_hw_stat_lifespan_seconds"
CNP_SENT = "fabricmon_roce_cnp_sent_total"
CNP_HANDLED = "fabricmon_roce_cnp_handled_total"
CNP_IGNORED = "fabricmon_roce_cnp_ignored_total"
ROCE_ECN_MARKED = "fabricmon_roce_ecn_marked_packets_total"
RETRIES = "fabricmon_rdma_transport_retries_total"
