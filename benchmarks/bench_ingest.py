"""Aggregator ingest throughput on one core: synthetic agent batches, 8 NICs x 8 GPUs per node.

Each node batch carries what a real agent sends every interval (~1,600 deltas:
per NIC the PMA data/packet/wait/error counters, hw_counters, transport
retries, CNP/ECN, PFC frames and pause time per priority and direction, phy
errors; per GPU 18 NVLinks x (tx, rx, 4 error types), XID and ECC), most of
them zero as on a healthy cluster, plus 8 rank timings.  The batches are
built once and re-stamped every simulated second, so the measurement is the
engine's ingest (and tick) cost, not the generator's.

    .venv/bin/python benchmarks/bench_ingest.py [--nodes 1024] [--seconds 10] [--out FILE]

Prints node-batches/s (ingest only, and ingest + one tick per second) and the
cluster size one core sustains at a 1 s agent interval.  It skips the wire (gRPC,
protobuf, the stream codec): bench_freshness.py measures the aggregator with real
streams beside a real Prometheus, and that is the number to size a deployment by.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fabricmon.aggregator.engine import Engine
from fabricmon.batch import NodeBatch
from fabricmon.model import CounterDelta, Sample
from fabricmon.rank_timing import RankTiming
from fabricmon.topology import generate_topology

PMA = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
       "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
       "port_rcv_constraint_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors", "VL15_dropped")
HW = ("rx_write_requests", "rx_read_requests", "rx_atomic_requests", "out_of_buffer", "req_cqe_error",
      "resp_cqe_error", "req_cqe_flush_error", "resp_cqe_flush_error", "resp_local_length_error",
      "resp_remote_access_errors", "req_remote_access_errors", "req_remote_invalid_request", "rnr_nak_retry_err",
      "roce_adp_retrans_to", "rx_icrc_encapsulated", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored",
      "np_ecn_marked_roce_packets", "lifespan_ms", "implied_nak_seq_err", "duplicate_request")
RETRY = ("local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "rnr_nak_retry_err",
         "req_transport_retries_exceeded", "roce_adp_retrans", "roce_slow_restart", "duplicate_request")
PHY = ("rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy", "rx_discards_phy", "tx_discards_phy",
       "rx_out_of_buffer", "link_down_events_phy")


def node_deltas(rng: random.Random, nics: int = 8, gpus: int = 8) -> tuple[CounterDelta, ...]:
    out: list[CounterDelta] = []
    for n in range(nics):
        port = (("device", f"mlx5_{n}"), ("port", "1"))
        iface = f"eth{n}"
        for fam in ("fabricmon_ib_port_receive_bytes_total", "fabricmon_ib_port_transmit_bytes_total",
                    "fabricmon_ib_port_receive_packets_total", "fabricmon_ib_port_transmit_packets_total"):
            out.append(CounterDelta(fam, port, rng.uniform(1e9, 2e10)))
        out.append(CounterDelta("fabricmon_ib_port_transmit_wait_total", port, float(rng.randint(0, 2000))))
        out += [CounterDelta("fabricmon_ib_port_errors_total", port + (("counter", c),), 0.0) for c in PMA]
        out += [CounterDelta("fabricmon_rdma_hw_stat_total", port + (("counter", c),),
                             float(rng.randint(0, 10**6)) if i < 3 else 0.0) for i, c in enumerate(HW)]
        out += [CounterDelta("fabricmon_rdma_transport_retries_total", port + (("counter", c),),
                             float(rng.choice((0, 0, 0, 1)))) for c in RETRY]
        for fam in ("fabricmon_roce_cnp_sent_total", "fabricmon_roce_cnp_handled_total",
                    "fabricmon_roce_ecn_marked_packets_total"):
            out.append(CounterDelta(fam, port, 0.0))
        for prio in range(8):
            for d in ("rx", "tx"):
                lab = (("interface", iface), ("priority", str(prio)), ("direction", d))
                bg = prio == 3
                out.append(CounterDelta("fabricmon_pfc_pause_frames_total", lab, float(rng.randint(0, 2)) if bg else 0))
                out.append(CounterDelta("fabricmon_pfc_pause_seconds_total", lab,
                                        rng.randint(0, 20) * 1e-6 if bg else 0))
        out += [CounterDelta("fabricmon_netdev_phy_errors_total", (("interface", iface), ("counter", c)), 0.0)
                for c in PHY]
        out.append(CounterDelta("fabricmon_netdev_phy_received_bit_total", (("interface", iface),), 1e11))
        out.append(CounterDelta("fabricmon_netdev_phy_corrected_bit_total", (("interface", iface),),
                                float(rng.randint(0, 3))))
    for g in range(gpus):
        for link in range(18):
            lab = (("gpu", str(g)), ("link", str(link)))
            out.append(CounterDelta("fabricmon_nvlink_transmit_bytes_total", lab, rng.uniform(1e9, 5e10)))
            out.append(CounterDelta("fabricmon_nvlink_receive_bytes_total", lab, rng.uniform(1e9, 5e10)))
            for t in ("replay", "recovery", "crc_flit", "crc_data"):
                out.append(CounterDelta("fabricmon_nvlink_errors_total", lab + (("type", t),), 0.0))
        for t in ("corrected", "uncorrected"):
            out.append(CounterDelta("fabricmon_gpu_ecc_errors_total", (("gpu", str(g)), ("type", t)), 0.0))
        out.append(CounterDelta("fabricmon_gpu_pcie_replay_total", (("gpu", str(g)),), 0.0))
    return tuple(out)


def node_gauges(rng: random.Random, gpus: int = 8) -> tuple[Sample, ...]:
    """Gauges that changed this interval: utilization and PCIe stall ratios move every second."""
    out = [Sample("fabricmon_gpu_utilization_ratio", (("gpu", str(g)),), rng.uniform(0.85, 0.99)) for g in range(gpus)]
    out += [Sample("fabricmon_host_cpu_utilization_ratio", (), rng.random())]
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--out", help="append a markdown table row to this file")
    a = ap.parse_args(argv)
    topo = generate_topology(a.nodes, layout="roce", nodes_per_unit=32, cluster="bench")
    engine = Engine(topo)
    rng = random.Random(1)
    names = list(topo.nodes)
    templates = {n: (node_deltas(rng), node_gauges(rng)) for n in names}
    n_deltas = len(next(iter(templates.values()))[0])
    t0 = 1_764_000_000.0
    ingest_s = tick_s = 0.0
    batches = 0
    for sec in range(1, a.seconds + 1):
        ts = t0 + sec
        step_batches = []
        for i, n in enumerate(names):
            d, g = templates[n]
            ranks = tuple(RankTiming("bench", i * 8 + k, k, sec, 2.0 + rng.gauss(0, 0.01), 0.5, ts, node=n)
                          for k in range(8))
            step_batches.append(NodeBatch(n, sec, ts, 1.0, d, g, ranks))
        c0 = time.process_time()
        for b in step_batches:
            engine.ingest(b)
        c1 = time.process_time()
        engine.tick(ts)
        c2 = time.process_time()
        ingest_s += c1 - c0
        tick_s += c2 - c1
        batches += len(step_batches)
    per_s_ingest = batches / ingest_s
    per_s_total = batches / (ingest_s + tick_s)
    incidents = engine.incidents()
    lines = [
        "engine only: batches are handed to Engine.ingest in-process, skipping gRPC, protobuf and the stream "
        "codec (benchmarks/bench_freshness.py measures the real path)",
        f"nodes {a.nodes} x (8 NICs + 8 GPUs), {n_deltas} deltas + 8 rank timings per batch, {a.seconds} s",
        f"ingest only:   {per_s_ingest:,.0f} node-batches/s on one core "
        f"({per_s_ingest * n_deltas / 1e6:.2f} M deltas/s; {1e6 / per_s_ingest:.0f} us per batch)",
        f"ingest + tick: {per_s_total:,.0f} node-batches/s (tick {tick_s / a.seconds * 1000:.1f} ms per second "
        f"for {a.nodes} nodes)",
        f"=> one core sustains about {per_s_total:,.0f} nodes at a 1 s interval "
        f"({per_s_total / a.nodes:.1f}x the {a.nodes}-node target); incidents raised: {len(incidents)}",
    ]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "a") as f:
            f.write(f"| {a.nodes} | {n_deltas} | {per_s_ingest:,.0f} | {per_s_total:,.0f} | "
                    f"{tick_s / a.seconds * 1000:.1f} ms |\n")
    return 0 if not incidents else 1


if __name__ == "__main__":
    raise SystemExit(main())
