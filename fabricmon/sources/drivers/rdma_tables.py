"""``hw_counters`` names per RDMA driver family (mlx5, bnxt_re in both naming generations, irdma, efa).

Every counter exports ``fabricmon_rdma_hw_stat_total{counter=<file name>}``; ``also`` names the
curated families the detectors read (CNPs, ECN marks, transport retries), whose ``counter`` label
is the ``canonical`` name: bnxt_re's 2025 rename gave its counters the mlx5 names ("for
compatibility with open-source monitoring agents"), so its older names map to the same series.
Widths are per driver, never per name: ``rx_write_requests`` is a 32-bit Q counter on mlx5 and a
u64 on bnxt_re.  Gauges (resource levels) and high-water marks export as read.
"""

from __future__ import annotations

from . import DriverTable, Kind, StatRule, raw_only
from .families import (
    CNP_HANDLED,
    CNP_IGNORED,
    CNP_SENT,
    HW_GAUGE,
    HW_HIGH_WATER,
    HW_LIFESPAN,
    HW_STAT,
    RETRIES,
    ROCE_ECN_MARKED,
)

_C = (("counter", "{name}"),)


def _counters(*names: str, width: int = 64, also: tuple[str, ...] = ()) -> tuple[StatRule, ...]:
    return tuple(StatRule(n, HW_STAT, _C, width=width, also=also) for n in names)


def _retry(name: str, canonical: str | None = None, width: int = 64) -> StatRule:
    return StatRule(name, HW_STAT, _C, width=width, canonical=canonical, also=(RETRIES,))


def _cc(name: str, family: str, width: int = 64) -> StatRule:
    return StatRule(name, HW_STAT, _C, width=width, also=(family,))


_LIFESPAN = StatRule("lifespan", HW_LIFESPAN, (), Kind.GAUGE, unit="ms")

# --------------------------------------------------------------------------- mlx5
MLX5_SOURCE = ("torvalds/linux drivers/infiniband/hw/mlx5/counters.c (basic_q_cnts, out_of_seq_q_cnts, "
               "retrans_q_cnts, extended_err_cnts, roce_accl_cnts, cong_cnts, ext_ppcnt_cnts); "
               "Q counters are 32 bits in mlx5_ifc.h QUERY_Q_COUNTER")

#: mlx5 Q counters and RoCE accel counters: 32-bit in firmware, they wrap.
MLX5_WRAPPING_32 = (
    "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect",
    "out_of_buffer", "resp_local_length_error", "resp_cqe_error", "req_cqe_error",
    "req_remote_invalid_request", "req_remote_access_errors", "resp_remote_access_errors",
    "resp_cqe_flush_error", "req_cqe_flush_error", "req_rnr_retries_exceeded",
    "roce_adp_retrans_to", "roce_slow_restart_cnps", "roce_slow_restart_trans",
)
MLX5_RETRIES_32 = (
    "out_of_sequence", "duplicate_request", "rnr_nak_retry_err", "packet_seq_err", "implied_nak_seq_err",
    "local_ack_timeout_err", "req_transport_retries_exceeded", "roce_adp_retrans", "roce_slow_restart",
)

MLX5 = DriverTable("mlx5", MLX5_SOURCE, (
    _LIFESPAN,
    *_counters(*MLX5_WRAPPING_32, width=32),
    *(_retry(n, width=32) for n in MLX5_RETRIES_32),
    _cc("np_cnp_sent", CNP_SENT), _cc("rp_cnp_handled", CNP_HANDLED), _cc("rp_cnp_ignored", CNP_IGNORED),
    _cc("np_ecn_marked_roce_packets", ROCE_ECN_MARKED),
    *_counters("rx_icrc_encapsulated"),
))

# --------------------------------------------------------------------------- bnxt_re
BNXT_RE_SOURCE = (
    "torvalds/linux@063975feedb14386489619084fbb20792b87d21c drivers/infiniband/hw/bnxt_re/hw_counters.c "
    "(bnxt_re_stat_descs; tx_cnp_pkts/rx_cnp_pkts/rx_ecn_marked_pkts and pacing_*/db_fifo_register from the "
    "later upstream patches shown as context in the rename below); the 2025 rename: linux-rdma "
    "'[PATCH rdma-next 6/9] RDMA/bnxt_re: RoCE related hardware counters update' "
    "<20250814112555.221665-7-kalesh-anakkur.purayil@broadcom.com> (to_retransmits -> local_ack_timeout_err, "
    "..., tx_cnp_pkts -> np_cnp_pkts, later np_cnp_sent); bnxt_re_ib_get_hw_stats() fills active_* from "
    "atomic resource counts (levels, not counters)")

_ACTIVE = ("active_pds", "active_ahs", "active_qps", "active_rc_qps", "active_ud_qps", "active_srqs", "active_cqs",
           "active_mrs", "active_mws")
_WATERMARK = ("watermark_pds", "watermark_ahs", "watermark_qps", "watermark_rc_qps", "watermark_ud_qps",
              "watermark_srqs", "watermark_cqs", "watermark_mrs", "watermark_mws")

BNXT_RE = DriverTable("bnxt_re", BNXT_RE_SOURCE, (
    _LIFESPAN,
    *(StatRule(n, HW_GAUGE, _C, Kind.GAUGE) for n in _ACTIVE),
    *(StatRule(n, HW_HIGH_WATER, _C, Kind.HIGH_WATER) for n in _WATERMARK),
    # the doorbell FIFO register: a level the driver reads for pacing, not a count
    StatRule("db_fifo_register", HW_GAUGE, _C, Kind.GAUGE),
    # retries and congestion, first generation (to 2025) -> the names the same counters have since
    _retry("to_retransmits", "local_ack_timeout_err"),
    _retry("seq_err_naks_rcvd", "packet_seq_err"),
    _retry("rnr_naks_rcvd", "rnr_nak_retry_err"),
    _retry("missing_resp", "implied_nak_seq_err"),
    _retry("dup_req", "duplicate_request"),
    _retry("oos_drop_count", "out_of_sequence"),
    _cc("tx_cnp_pkts", CNP_SENT), _cc("rx_cnp_pkts", CNP_HANDLED), _cc("rx_ecn_marked_pkts", ROCE_ECN_MARKED),
    # second generation (2025 rename to the mlx5 names): still u64 (never the 32-bit mlx5 Q counters)
    _retry("local_ack_timeout_err"), _retry("packet_seq_err"), _retry("rnr_nak_retry_err"),
    _retry("implied_nak_seq_err"), _retry("duplicate_request"), _retry("out_of_sequence"),
    _retry("roce_adp_retrans"), _retry("roce_slow_restart"),
    _cc("np_cnp_pkts", CNP_SENT), _cc("np_cnp_sent", CNP_SENT), _cc("rp_cnp_handled", CNP_HANDLED),
    _cc("np_ecn_marked_roce_packets", ROCE_ECN_MARKED), _cc("rp_cnp_ignored", CNP_IGNORED),
    *_counters(
        "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "out_of_buffer", "req_remote_invalid_request",
        "req_remote_access_errors", "resp_local_length_error", "req_cqe_error", "req_cqe_flush_error",
        "resp_cqe_error", "resp_cqe_flush_error", "resp_remote_access_errors", "roce_adp_retrans_to",
        "roce_slow_restart_cnps", "roce_slow_restart_trans", "rx_icrc_encapsulated", "rx_good_pkts", "rx_good_bytes",
        # both generations
        "rx_pkts", "rx_bytes", "tx_pkts", "tx_bytes", "recoverable_errors", "tx_roce_errors", "tx_roce_discards",
        "rx_roce_errors", "rx_roce_discards", "max_retry_exceeded", "unrecoverable_err", "bad_resp_err",
        "local_qp_op_err", "local_protection_err", "mem_mgmt_op_err", "remote_op_err", "res_exceed_max",
        "res_exceeds_wqe", "res_opcode_err", "res_rx_invalid_rkey", "res_rx_domain_err", "res_rx_no_perm",
        "res_rx_range_err", "res_tx_invalid_rkey", "res_tx_domain_err", "res_tx_no_perm", "res_tx_range_err",
        "res_irrq_oflow", "res_unsup_opcode", "res_unaligned_atomic", "res_rem_inv_err", "res_mem_err",
        "res_srq_err", "res_cmp_err", "res_invalid_dup_rkey", "res_wqe_format_err", "res_cq_load_err",
        "res_srq_load_err", "res_tx_pci_err", "res_rx_pci_err", "tx_atomic_req", "tx_read_req", "tx_read_resp",
        "tx_write_req", "tx_send_req", "tx_roce_only_pkts", "tx_roce_only_bytes", "rx_read_resp", "rx_send_req",
        "rx_roce_only_pkts", "rx_roce_only_bytes", "rx_roce_good_pkts", "rx_roce_good_bytes",
        "pacing_reschedule", "pacing_complete", "pacing_alerts", "resize_cq_cnt",
        # first generation only
        "remote_invalid_req_err", "remote_access_err", "res_length_mismatch", "rx_atomic_req", "rx_read_req",
        "rx_write_req", "rx_out_of_buffer",
    ),
))

# --------------------------------------------------------------------------- irdma
IRDMA_SOURCE = ("torvalds/linux@d5dd580deb54483cce0cb5bbe3f1a132a28c767d drivers/infiniband/hw/irdma/verbs.c "
                "(irdma_hw_stat_descs; gen3 names from the 2025 upstream series adding RNR/NAK/RTO counters); "
                "ctrl.c irdma_update_stats() accumulates every register delta into a u64, so all are 64-bit")
IRDMA = DriverTable("irdma", IRDMA_SOURCE, (
    _LIFESPAN,
    _cc("cnpSent", CNP_SENT), _cc("cnpHandled", CNP_HANDLED), _cc("cnpIgnored", CNP_IGNORED),
    _cc("RxECNMrkd", ROCE_ECN_MARKED),
    _retry("tcpRetransSegs"), _retry("RetransSegs", "tcpRetransSegs"),
    _retry("RTO", "local_ack_timeout_err"), _retry("Nak Sequence Error", "packet_seq_err"),
    _retry("Nak Sequence Error Implied", "implied_nak_seq_err"),
    _retry("Rcvd Out of order packets", "out_of_sequence"),
    *_counters(
        "ip4InDiscards", "ip4InTruncatedPkts", "ip4OutNoRoutes", "ip6InDiscards", "ip6InTruncatedPkts",
        "ip6OutNoRoutes", "tcpInOptErrors", "tcpInProtoErrors", "rxVlanErrors", "ip4InOctets", "ip4InPkts",
        "ip4InReasmRqd", "ip4InMcastOctets", "ip4InMcastPkts", "ip4OutOctets", "ip4OutPkts", "ip4OutSegRqd",
        "ip4OutMcastOctets", "ip4OutMcastPkts", "ip6InOctets", "ip6InPkts", "ip6InReasmRqd", "ip6InMcastOctets",
        "ip6InMcastPkts", "ip6OutOctets", "ip6OutPkts", "ip6OutSegRqd", "ip6OutMcastOctets", "ip6OutMcastPkts",
        "tcpInSegs", "tcpOutSegs", "iwInRdmaReads", "iwInRdmaSends", "iwInRdmaWrites", "iwOutRdmaReads",
        "iwOutRdmaSends", "iwOutRdmaWrites", "iwRdmaBnd", "iwRdmaInv", "RxUDP", "TxUDP",
        "InOptErrors", "InProtoErrors", "InSegs", "OutSegs", "InRdmaReads", "InRdmaSends", "InRdmaWrites",
        "OutRdmaReads", "OutRdmaSends", "OutRdmaWrites", "RdmaBnd", "RdmaInv", "RNR sent", "RNR received",
        "ord limit count", "ird limit count", "Rx atomics", "Tx atomics", "CRC errors",
    ),
))

# --------------------------------------------------------------------------- efa
EFA_SOURCE = ("torvalds/linux@e51b3c59a782f567335c4618ca97901529451e4f drivers/infiniband/hw/efa/efa_verbs.c "
              "(EFA_DEFINE_PORT_STATS, EFA_DEFINE_DEVICE_STATS; efa_com_cmd.h efa_com_network_stats: u64)")
EFA = DriverTable("efa", EFA_SOURCE, (
    _LIFESPAN,
    # SRD retransmits and remote health: the transport retries of EFA (Nitro v4 and later)
    _retry("retrans_pkts"), _retry("retrans_timeout_events"), _retry("impaired_remote_conn_events"),
    _retry("unresponsive_remote_events"),
    *_counters(
        "tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
        "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes", "rdma_write_wrs",
        "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes", "retrans_bytes",
        "submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds", "keep_alive_rcvd", "alloc_pd_err",
        "create_qp_err", "create_cq_err", "reg_mr_err", "alloc_ucontext_err", "create_ah_err", "mmap_err",
    ),
))

TABLES: dict[str, DriverTable] = {t.driver: t for t in (MLX5, BNXT_RE, IRDMA, EFA)}

#: RDMA device name prefix -> driver, where the kernel's default name says it (the driver's own
#: ib_register_device format: "mlx5_%d", "bnxt_re%d", "irdma%d", "efa_%d").  Names rdma-core's udev
#: rules give (rdmap<pci>, ibp...) say nothing: the device's driver link decides, else mlx5.
DEVICE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("mlx5_", "mlx5"), ("bnxt_re", "bnxt_re"), ("irdma", "irdma"), ("efa_", "efa"),
)
#: kernel module name (the PCI function's driver link) -> table
MODULE_DRIVERS: dict[str, str] = {
    "mlx5_core": "mlx5", "bnxt_en": "bnxt_re", "ice": "irdma", "i40e": "irdma", "efa": "efa",
}

__all__ = ["BNXT_RE", "EFA", "IRDMA", "MLX5", "TABLES", "raw_only"]
