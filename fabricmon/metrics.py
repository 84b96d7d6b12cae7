"""The declarative table of every metric family the agent exports.

Sources emit ``Reading``s naming a family here; the exporter turns the table
into prometheus_client metric families.  ``node`` is added to every series by
the exporter and is not listed.  Dashboards, rules and tests rely on these
names: add, never rename.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "counter" | "gauge" | "info"
    help: str
    labels: tuple[str, ...]


def _specs(*rows: tuple[str, str, str, tuple[str, ...]]) -> dict[str, MetricSpec]:
    return {r[0]: MetricSpec(*r) for r in rows}


_PORT = ("device", "port")

SPECS: dict[str, MetricSpec] = _specs(
    # --- InfiniBand / RoCE ports (sources/infiniband.py) ---
    ("fabricmon_ib_port_info", "info", "RDMA port identity; value 1.",
     ("device", "port", "rail", "link_layer", "interface", "hca_type", "fw_ver", "node_guid", "board_id")),
    ("fabricmon_ib_port_state", "gauge",
     "IB logical port state id (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).", _PORT),
    ("fabricmon_ib_port_physical_state", "gauge", "IB physical port state id (5 LinkUp, 2 Polling, 3 Disabled, ...).",
     _PORT),
    ("fabricmon_ib_port_rate_bytes_per_second", "gauge", "Port signalling rate in bytes per second.", _PORT),
    ("fabricmon_ib_port_data_rate_bytes_per_second", "gauge",
     "Port data rate in bytes per second: the rate less line coding (8b/10b for SDR/DDR/QDR, 64b/66b for FDR).", _PORT),
    ("fabricmon_ib_port_width_lanes", "gauge", "Port link width in lanes (1, 2, 4, 8, 12).", _PORT),
    ("fabricmon_ib_port_receive_bytes_total", "counter", "Bytes received (port_rcv_data x 4).", _PORT),
    ("fabricmon_ib_port_transmit_bytes_total", "counter", "Bytes transmitted (port_xmit_data x 4).", _PORT),
    ("fabricmon_ib_port_receive_packets_total", "counter", "Packets received.", _PORT),
    ("fabricmon_ib_port_transmit_packets_total", "counter", "Packets transmitted.", _PORT),
    ("fabricmon_ib_port_transmit_wait_total", "counter", "Ticks with data pending but not sent (IB congestion).",
     _PORT),
    ("fabricmon_ib_port_pma_total", "counter", "Every other PMA port counter, by sysfs file name.",
     _PORT + ("counter",)),
    ("fabricmon_ib_port_errors_total", "counter", "PMA error counters, by sysfs file name.", _PORT + ("counter",)),
    ("fabricmon_ib_port_error_saturated", "gauge", "1 when a narrow PMA counter is pinned at its IBTA maximum.",
     _PORT + ("counter",)),
    ("fabricmon_ib_port_up", "gauge", "1 while the port is readable in sysfs.", _PORT),
    ("fabricmon_rdma_hw_stat_total", "counter", "Every hw_counters file; 32-bit ones unwrapped into a monotonic count.",
     _PORT + ("counter",)),
    ("fabricmon_rdma_hw_stat_lifespan_seconds", "gauge", "hw_counters cache lifetime.", _PORT),
    ("fabricmon_rdma_hw_stat_level", "gauge",
     "hw_counters files that are levels, not counts (bnxt_re active_qps, db_fifo_register), as read.",
     _PORT + ("counter",)),
    ("fabricmon_rdma_hw_stat_high_water", "gauge",
     "hw_counters high-water marks (bnxt_re watermark_*), as read.", _PORT + ("counter",)),
    ("fabricmon_rdma_hw_stat_unclassified", "gauge",
     "hw_counters files no driver table knows (exported as 64-bit counters; names logged once).", ("device",)),
    ("fabricmon_roce_cnp_sent_total", "counter", "CNPs sent by the notification point (np_cnp_sent).", _PORT),
    ("fabricmon_roce_cnp_handled_total", "counter", "CNPs handled by the reaction point (rp_cnp_handled).", _PORT),
    ("fabricmon_roce_cnp_ignored_total", "counter",
     "CNPs ignored by the reaction point (rp_cnp_ignored): congestion control off.", _PORT),
    ("fabricmon_roce_ecn_marked_packets_total", "counter",
     "ECN-marked RoCE packets received (np_ecn_marked_roce_packets).", _PORT),
    ("fabricmon_rdma_transport_retries_total", "counter",
     "RDMA transport retry and sequence errors (local_ack_timeout_err, out_of_sequence, packet_seq_err, ...).",
     _PORT + ("counter",)),
    # --- ethtool (sources/ethtool.py) ---
    ("fabricmon_pfc_pause_frames_total", "counter", "PFC pause frames per priority and direction.",
     ("interface", "priority", "direction")),
    ("fabricmon_pfc_pause_seconds_total", "counter", "Time paused by PFC per priority and direction.",
     ("interface", "priority", "direction")),
    ("fabricmon_pfc_frames_by_traffic_class_total", "counter",
     "PFC XOFF/XON frames per traffic class, where the NIC counts the priorities of a class together (ice).",
     ("interface", "traffic_class", "direction", "type")),
    ("fabricmon_pfc_xoff_refresh_frames_per_second", "gauge",
     "XOFF frames per second per priority or traffic class a port sends while it keeps its partner paused "
     "without a break (link speed over the driver's XOFF refresh interval); only for drivers that count "
     "pause in frames, not time (ice): XOFF frames per second over it is the share of time paused.",
     ("interface",)),
    ("fabricmon_pfc_pause_transitions_total", "counter", "PFC XOFF to XON transitions received.",
     ("interface", "priority")),
    ("fabricmon_pfc_pause_storm_events_total", "counter", "Pause storm events (level warning or error).",
     ("interface", "level")),
    ("fabricmon_netdev_phy_errors_total", "counter", "Physical-layer errors and discards, by ethtool stat name.",
     ("interface", "counter")),
    ("fabricmon_netdev_phy_received_bit_total", "counter",
     "Bits received at the PHY (rx_bits_phy), where the driver has it; the inbox mlx5 driver does not.",
     ("interface",)),
    ("fabricmon_netdev_phy_corrected_bit_total", "counter", "FEC-corrected bits (rx_corrected_bits_phy).",
     ("interface",)),
    ("fabricmon_netdev_phy_pre_fec_bit_error_ratio", "gauge",
     "Pre-FEC bit error ratio of the last interval: corrected bits over data rate x interval (agent/margins.py).",
     ("interface",)),
    ("fabricmon_netdev_phy_lane_error_share_ratio", "gauge",
     "Share of the last interval's raw (pre-FEC) errors on each lane (rx_err_lane_N_phy).", ("interface", "lane")),
    # --- switch side (sources/ib_switches: the in-band sweep of every switch port; one node per plane) ---
    ("fabricmon_switch_port_errors_total", "counter",
     "Switch port PMA error counters (host names: symbol_error, link_downed, ...), from the last sweep.",
     ("switch", "port", "counter")),
    ("fabricmon_switch_port_error_saturated", "gauge", "1 when a narrow switch port PMA counter is pinned at its "
     "IBTA maximum.", ("switch", "port", "counter")),
    ("fabricmon_switch_port_transmit_wait_total", "counter", "Switch port ticks with data pending but not sent.",
     ("switch", "port")),
    ("fabricmon_switch_port_transmit_bytes_total", "counter", "Bytes the switch port sent (PortXmitData x 4).",
     ("switch", "port")),
    ("fabricmon_switch_port_receive_bytes_total", "counter", "Bytes the switch port received (PortRcvData x 4).",
     ("switch", "port")),
    ("fabricmon_switch_port_up", "gauge", "1 while a cabled switch port is ACTIVE in PortInfo; 0 once it went down "
     "(kept, never dropped).", ("switch", "port")),
    ("fabricmon_switch_port_info", "info", "A cabled switch port and the far end of its cable; value 1.",
     ("switch", "switch_guid", "port", "peer", "peer_port", "peer_type")),
    ("fabricmon_switch_sweep_seconds", "gauge", "Wall time of the last complete switch sweep.", ()),
    ("fabricmon_switch_sweep_age_seconds", "gauge", "Seconds since the last complete switch sweep ended.", ()),
    ("fabricmon_switch_queries_total", "counter", "Switch queries (tool runs) by result: ok, timeout, error.",
     ("result",)),
    ("fabricmon_switches_unreachable", "gauge", "Switches whose PMA did not answer in the last sweep.", ()),
    ("fabricmon_switches_swept", "gauge", "Switches in the map the last sweep covered (excluded ones not counted).",
     ()),
    # --- switch side over gNMI (sources/gnmi_switches: Ethernet switches; one node per fabric). Port errors,
    # bytes and up/down use the families above (counter: in_errors, in_discards, out_discards, fcs,
    # fec_uncorrectable) ---
    ("fabricmon_switch_pfc_frames_total", "counter", "PFC pause frames per priority a switch port received (rx) or "
     "sent (tx) (SONiC COUNTERS_DB SAI_PORT_STAT_PFC_<p>_RX/TX_PKTS).", ("switch", "port", "priority", "direction")),
    ("fabricmon_switch_port_pause_frames_total", "counter", "Link-level (802.3x) pause frames of a switch port "
     "(OpenConfig in/out-mac-pause-frames).", ("switch", "port", "direction")),
    ("fabricmon_switch_queue_dropped_packets_total", "counter", "Packets an egress queue of a switch port dropped.",
     ("switch", "port", "queue")),
    ("fabricmon_switch_ecn_marked_packets_total", "counter", "Packets an egress queue of a switch port ECN-marked.",
     ("switch", "port", "queue")),
    ("fabricmon_switch_pfc_watchdog_storms_total", "counter", "PFC storms the switch's PFC watchdog detected on a "
     "port's priority (SONiC Pfcwd PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED).", ("switch", "port", "priority")),
    ("fabricmon_switch_transceiver_input_power_dbm", "gauge", "Received optical power of a switch transceiver lane.",
     ("switch", "port", "lane")),
    ("fabricmon_switch_transceiver_output_power_dbm", "gauge", "Transmitted optical power of a switch transceiver "
     "lane.", ("switch", "port", "lane")),
    ("fabricmon_switch_transceiver_pre_fec_ber", "gauge", "Pre-FEC bit error ratio of a switch transceiver.",
     ("switch", "port")),
    ("fabricmon_switch_transceiver_post_fec_ber", "gauge", "Post-FEC bit error ratio of a switch transceiver.",
     ("switch", "port")),
    ("fabricmon_switch_port_pfc_enabled_priorities", "gauge", "PFC-enabled priorities of the switch port as a "
     "bitmask, bit p for priority p (SONiC CONFIG_DB PORT_QOS_MAP pfc_enable \"3,4\" is 24): one series per port.",
     ("switch", "port")),
    ("fabricmon_switch_port_ecn_marking_queues", "gauge", "Queues of the switch port that ECN-mark, as a bitmask, "
     "bit q for queue q (SONiC CONFIG_DB QUEUE wred_profile whose ecn is not ecn_none).", ("switch", "port")),
    ("fabricmon_switch_lossless_config_checked", "gauge", "1 when the switch's PFC and ECN settings are read and "
     "compared with the host ends (sonic profile); 0 when its profile models none (openconfig): not checked.",
     ("switch", "profile")),
    ("fabricmon_switch_gnmi_up", "gauge", "1 while the switch's gNMI subscription is synced and delivering.",
     ("switch",)),
    ("fabricmon_switch_gnmi_failures_total", "counter", "gNMI sessions of a switch that ended, and updates refused, by "
     "reason (unreachable, auth, credentials, stalled, oversize, malformed, series_limit, error).",
     ("switch", "reason")),
    ("fabricmon_switch_gnmi_updates_total", "counter", "gNMI updates (leaves or DB rows) accepted from the switch.",
     ("switch",)),
    ("fabricmon_switch_gnmi_series", "gauge", "Series the switch's gNMI values make (bounded by max_series).",
     ("switch",)),
    ("fabricmon_switch_gnmi_update_age_seconds", "gauge", "Seconds since the switch's last gNMI message.",
     ("switch",)),
    ("fabricmon_switch_gnmi_sample_interval_seconds", "gauge", "The SAMPLE interval asked of the switches "
     "(the aggregator widens switch-fed windows to it).", ()),
    ("fabricmon_switches_gnmi_unreachable", "gauge", "Configured gNMI switches not delivering now.", ()),
    # --- transceiver modules (sources/transceiver.py; opt-in, needs CAP_NET_ADMIN) ---
    ("fabricmon_transceiver_temperature_celsius", "gauge", "Module temperature (SFF-8636 / CMIS monitor).", _PORT),
    ("fabricmon_transceiver_supply_voltage_volts", "gauge", "Module supply voltage (Vcc monitor).", _PORT),
    ("fabricmon_transceiver_rx_power_watts", "gauge", "Received optical power per lane.", _PORT + ("lane",)),
    ("fabricmon_transceiver_tx_power_watts", "gauge", "Transmitted optical power per lane.", _PORT + ("lane",)),
    ("fabricmon_transceiver_tx_bias_amperes", "gauge", "Laser bias current per lane.", _PORT + ("lane",)),
    ("fabricmon_transceiver_flag", "gauge",
     "A module alarm/warning/LOS flag that is set (value 1); lane is empty for module-level flags.",
     _PORT + ("lane", "flag")),
    ("fabricmon_transceiver_modules_unreadable", "gauge",
     "Interfaces whose module EEPROM read the kernel refused at the last module read, by reason "
     "(permission: EPERM, the agent lacks CAP_NET_ADMIN; present only while some are refused).", ("reason",)),
    ("fabricmon_transceiver_reading_age_seconds", "gauge",
     "Seconds since the module readings were taken (they refresh at sources.transceiver.interval).", _PORT),
    ("fabricmon_global_pause_frames_total", "counter", "IEEE 802.3x (global, non-PFC) pause frames by direction.",
     ("interface", "direction")),
    ("fabricmon_global_pause_seconds_total", "counter", "Time paused by global (802.3x) pause by direction.",
     ("interface", "direction")),
    ("fabricmon_global_pause_transitions_total", "counter", "Global pause XOFF to XON transitions received.",
     ("interface",)),
    ("fabricmon_netdev_pause_control_frames_total", "counter",
     "Pause MAC control frames at the PHY (PFC and global), by direction.",
     ("interface", "direction")),
    ("fabricmon_netdev_ecn_marked_packets_total", "counter",
     "ECN-marked packets received per priority (rx_prioN_marked).",
     ("interface", "priority")),
    ("fabricmon_netdev_pci_stalled_ratio", "gauge", "Share of the last second PCIe outbound was stalled.",
     ("interface", "direction")),
    ("fabricmon_ethtool_stat", "gauge", "Other ethtool statistics by name (allowlisted).", ("interface", "stat")),
    ("fabricmon_ethtool_up", "gauge", "1 when the ethtool stats of the interface were read this poll.", ("interface",)),
    ("fabricmon_ethtool_unclassified_stats", "gauge",
     "ethtool stats of the interface no driver table knows (raw only through the allowlist; names logged once).",
     ("interface", "driver")),
    # --- lossless config (sources/fabric_config.py) ---
    ("fabricmon_fabric_config_ok", "gauge", "1 when the interface matches the expected lossless profile for the check.",
     ("device", "interface", "check", "port")),
    ("fabricmon_fabric_config_unknown", "gauge",
     "1 when the host answers but cannot tell the setting (a VF's empty DCB APP table): unknown, not drift.",
     ("device", "interface", "check", "port")),
    # --- NVML (sources/nvml/) ---
    ("fabricmon_gpu_info", "info",
     "GPU identity; value 1.  nvlink_counters: the path its NVLink error counters are read through "
     "(count_fields on NVLink5, legacy before, none, unknown, no_links).",
     ("gpu", "uuid", "name", "pci_bus_id", "nvlink_counters")),
    ("fabricmon_gpu_up", "gauge", "1 while NVML answers for the GPU.", ("gpu",)),
    ("fabricmon_gpu_utilization_ratio", "gauge", "GPU compute utilization (0-1).", ("gpu",)),
    ("fabricmon_gpu_throttle_reason", "gauge", "1 when the clock-throttle reason is active.", ("gpu", "reason")),
    ("fabricmon_gpu_xid_errors_total", "counter", "XID errors seen, by XID code.", ("gpu", "xid")),
    ("fabricmon_gpu_xid_fatal_errors_total", "counter",
     "Fatal XID errors seen (sources/nvml/xid.py FATAL_XIDS), created at 0 for every GPU.", ("gpu",)),
    ("fabricmon_job_gpu_info", "gauge",
     "1 while the scheduler has the job on the GPU (gpu \"all\": the whole node), 0 for a while after it left "
     "(Slurm prolog job files, Kubernetes PodResources).", ("hpc_job", "job_id", "gpu")),
    ("fabricmon_pod_jobs_up", "gauge",
     "1 when the last read of the kubelet's PodResources and the pods' labels had no error (sources.jobs.kubernetes; "
     "absent where it does not run).", ()),
    ("fabricmon_pod_jobs_errors_total", "counter",
     "Failed PodResources reads by reason: socket (missing), kubelet (List failed), api (API server unreachable or "
     "refusing), answer (not what was asked for), device (a device id naming no GPU NVML shows).", ("reason",)),
    ("fabricmon_pci_nvidia_gpus", "gauge",
     "NVIDIA display or 3D controllers on the PCI bus (vendor 0x10de, class 0x03xxxx), NVML or not.", ()),
    ("fabricmon_gpu_ecc_errors_total", "counter", "ECC errors, by type (corrected, uncorrected).", ("gpu", "type")),
    ("fabricmon_gpu_pcie_replay_total", "counter", "PCIe replay counter.", ("gpu",)),
    ("fabricmon_nvlink_up", "gauge", "1 when the NVLink is active.", ("gpu", "link")),
    ("fabricmon_nvlink_remote_info", "info", "PCI bus id at the far end of the NVLink; value 1.",
     ("gpu", "link", "remote_pci_bus_id")),
    ("fabricmon_nvlink_transmit_bytes_total", "counter", "NVLink data bytes transmitted.", ("gpu", "link")),
    ("fabricmon_nvlink_receive_bytes_total", "counter", "NVLink data bytes received.", ("gpu", "link")),
    ("fabricmon_nvlink_errors_total", "counter",
     "NVLink errors by type: replay, recovery, crc_flit, crc_data (legacy path); recovery, recovery_failed, rx_errors, "
     "rx_malformed, rx_buffer_overrun, local_link_integrity, effective, symbol (NVLink5 COUNT fields).",
     ("gpu", "link", "type")),
    ("fabricmon_nvlink_nvml_path", "gauge",
     "1 for the NVML path a GPU's NVLink counters (traffic, errors) are read through: throughput_fields, count_fields, "
     "legacy; none when NVML supports neither (unmonitored); all 0 while not yet known.", ("gpu", "counters", "path")),
    # --- host (sources/host.py) ---
    ("fabricmon_host_cpu_utilization_ratio", "gauge", "Host CPU utilization (0-1) since the previous poll.", ()),
    ("fabricmon_host_load1", "gauge", "1-minute load average.", ()),
    ("fabricmon_host_boot_time_seconds", "gauge",
     "When the host booted (btime of /proc/stat, Unix seconds): the rules hold a just-booted node's link state.", ()),
    ("fabricmon_host_memory_total_bytes", "gauge", "Total memory.", ()),
    ("fabricmon_host_memory_available_bytes", "gauge", "Available memory.", ()),
    ("fabricmon_host_network_receive_bytes_total", "counter", "Bytes received per netdev.", ("interface",)),
    ("fabricmon_host_network_transmit_bytes_total", "counter", "Bytes transmitted per netdev.", ("interface",)),
    ("fabricmon_host_network_drops_total", "counter", "Packets dropped per netdev and direction.",
     ("interface", "direction")),
    ("fabricmon_host_network_errors_total", "counter", "Packet errors per netdev and direction.",
     ("interface", "direction")),
    # --- NCCL Inspector / rank timings (agent/nccl_inspector.py) ---
    ("fabricmon_nccl_collectives_total", "counter", "Collectives completed.", ("rank", "comm", "collective")),
    ("fabricmon_nccl_collective_seconds_total", "counter", "Sum of collective execution time.",
     ("rank", "comm", "collective")),
    ("fabricmon_nccl_collective_bytes_total", "counter", "Sum of collective message sizes.",
     ("rank", "comm", "collective")),
    ("fabricmon_nccl_bus_bandwidth_bytes_per_second", "gauge", "Mean bus bandwidth over the last interval.",
     ("rank", "comm", "collective")),
    ("fabricmon_nccl_p2p_operations_total", "counter",
     "Point-to-point operations (Send tx, Recv rx) completed, per peer rank.",
     ("rank", "comm", "direction", "peer")),
    ("fabricmon_nccl_p2p_seconds_total", "counter", "Sum of point-to-point execution time.",
     ("rank", "comm", "direction", "peer")),
    ("fabricmon_nccl_p2p_bytes_total", "counter", "Sum of point-to-point message sizes.",
     ("rank", "comm", "direction", "peer")),
    ("fabricmon_nccl_p2p_bus_bandwidth_bytes_per_second", "gauge",
     "Mean point-to-point bus bandwidth over the last interval.",
     ("rank", "comm", "direction", "peer")),
    ("fabricmon_nccl_window_bus_bandwidth_bytes_per_second", "gauge",
     "NCCL Inspector Prometheus mode (NCCL 2.30): geometric-mean bus bandwidth of the last dump window (>= 30 s), "
     "its message-size and algorithm buckets folded; collective is the NCCL function (Send/Recv for p2p). "
     "No counts: not for straggler timing.", ("uuid", "comm_name", "collective")),
    ("fabricmon_nccl_window_age_seconds", "gauge",
     "Seconds since NCCL Inspector last rewrote the GPU's prom-mode window (an idle or stalled rank stops rewriting).",
     ("uuid",)),
    ("fabricmon_nccl_window_ranks", "gauge",
     "Prom mode: GPUs of this node in the communicator, expected (nranks / n_nodes when even) and reporting a "
     "fresh window; fewer reporting than expected means ranks missing from Inspector's output.",
     ("comm_name", "nranks", "state")),
    ("fabricmon_nccl_comm_info", "info", "NCCL communicator name (header comm_name, NCCL 2.30+); value 1.",
     ("rank", "comm", "comm_name")),
    ("fabricmon_rank_step_seconds", "gauge", "Last reported step time per rank (job_id empty when the job sends none).",
     ("hpc_job", "job_id", "rank")),
    ("fabricmon_rank_comm_seconds", "gauge", "Last reported communication time per rank.",
     ("hpc_job", "job_id", "rank")),
    # --- intake self-metrics (agent/intake.py, agent/nccl_inspector.py); reasons are fixed enums ---
    ("fabricmon_intake_lines_total", "counter",
     "Rank-timing lines and NCCL Inspector records read, by result and reason.",
     ("source", "result", "reason")),
    ("fabricmon_intake_series", "gauge", "Series the intake source holds.", ("source",)),
    ("fabricmon_intake_files", "gauge",
     "Files in the NCCL Inspector dump directory by kind: json (tailed), prom (read per window), "
     "skipped (.tmp, .gz, .parquet, a .prom NCCL did not name: not read).", ("source", "kind")),
    ("fabricmon_intake_series_dropped_total", "counter",
     "Series refused at the limit, expired, or timings dropped unsent.",
     ("source", "reason")),
    ("fabricmon_intake_connections_closed_total", "counter", "Rank intake connections closed at the limit or timeout.",
     ("listener", "reason")),
    # --- input validation and discovery (sources/bounds.py, sources/inventory.py) ---
    ("fabricmon_source_values_rejected_total", "counter",
     "Values from hardware files, dumps or NVML refused at the validation boundary, by reason.",
     ("collector", "reason")),
    ("fabricmon_devices_discovered", "gauge",
     "Devices found by discovery, by kind (rdma_device, ib_port, roce_port, roce_netdev, netdev, gpu).", ("kind",)),
    ("fabricmon_rail_assignment_info", "gauge",
     "1: which rule gave the rail labels (source: configured, pci_affinity, hca_type, pci_id, netdev, none) and "
     "the PCI pairing of rail NICs with GPUs (pci_affinity: paired, no_gpu, no_nic, no_shared_switch, "
     "not_one_to_one).", ("source", "pci_affinity")),
    ("fabricmon_devices_expected", "gauge",
     "Devices the config expects, by kind (rdma_port: sources.infiniband.expected_ports, IB and RoCE ports together).",
     ("kind",)),
)

# Self-instrumentation, emitted by the exporter for every source.
SELF_SPECS: dict[str, MetricSpec] = _specs(
    ("fabricmon_collector_up", "gauge", "1 when the collector's last poll succeeded.", ("collector",)),
    ("fabricmon_collector_duration_seconds", "gauge", "Duration of the collector's last poll.", ("collector",)),
    ("fabricmon_collector_errors_total", "counter", "Errors (bad files, vanished devices, timeouts) per collector.",
     ("collector",)),
    ("fabricmon_snapshot_timestamp_seconds", "gauge", "Sample time of the snapshot being served.", ()),
    ("fabricmon_snapshot_age_seconds", "gauge", "Age of the snapshot being served at scrape time.", ()),
)
