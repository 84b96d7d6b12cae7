"""Floods the rank intake and the NCCL Inspector tail with distinct names; reports what the agent holds.

150,000 rank lines of distinct jobs and 300,000 NCCL Inspector records of
distinct communicators go through the same code paths a live agent runs
(``RankIntake.submit_lines``, ``NcclInspectorSource.poll``, the poller and the
exposition renderer); the run prints the RSS growth of this process, the
series held and the exposition size.  The limits come from the defaults
unless flags override them.

    .venv/bin/python benchmarks/bench_intake_flood.py [--jobs 150000] [--comms 300000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil

from fabricmon.agent.exporter import exposition
from fabricmon.agent.intake import RankIntake
from fabricmon.agent.nccl_inspector import NcclInspectorSource
from fabricmon.agent.poller import Poller
from fabricmon.sources.inventory import Inventory


def nccl_line(comm: int) -> str:
    return json.dumps({"header": {"id": f"0x{comm:x}", "rank": 0, "n_ranks": 8, "nnodes": 1},
                       "coll_perf": {"coll": "AllReduce", "coll_sn": 1, "coll_msg_size_bytes": 1024,
                                     "coll_exec_time_us": 10.0, "coll_busbw_gbs": 1.0}},
                      separators=(",", ":")) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=150_000)
    ap.add_argument("--comms", type=int, default=300_000)
    args = ap.parse_args()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    with tempfile.TemporaryDirectory() as d:
        intake = RankIntake("node-0")
        nccl = NcclInspectorSource(d, timeout=60.0)
        poller = Poller("node-0", [intake, nccl], discover=lambda: Inventory(sysfs_root=""))
        t0 = time.perf_counter()
        for start in range(0, args.jobs, 10_000):
            body = "\n".join(json.dumps({"job": f"job-{i}", "rank": 0, "step": 1, "step_seconds": 1.0})
                             for i in range(start, min(args.jobs, start + 10_000)))
            intake.submit_lines(body)
        with open(Path(d) / "r0.log", "w") as fh:
            for c in range(args.comms):
                fh.write(nccl_line(c))
        snap = poller.poll_once()
        body = exposition(snap)
        elapsed = time.perf_counter() - t0
        stats = intake.stats()
        print(f"rank lines: {args.jobs}, accepted {stats['accepted_total']}, rejected {stats['rejected_total']},"
              f" series held {stats['series']}")
        print(f"NCCL records: {args.comms}, accepted {nccl.records_total}, refused at the series limit"
              f" {nccl.rejected['series_limit']}")
        print(f"exposition: {len(body) / 1024:.0f} KiB, RSS growth {(proc.memory_info().rss - rss0) / 2**20:.0f} MiB,"
              f" {elapsed:.1f} s")


if __name__ == "__main__":
    main()
