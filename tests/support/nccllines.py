"""NCCL Inspector v4.0 coll_perf lines, as the writer prints them, for the tests."""

from __future__ import annotations

import json


def rec(rank=0, comm="0x7f8c496ae9f661", coll="AllReduce", size=1024, us=100.0, busbw=10.0, sn=1) -> str:
    return json.dumps({
        "header": {"id": comm, "rank": rank, "n_ranks": 8, "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.0", "dump_timestamp_us": 1748030377748202,
                     "hostname": "node-017", "pid": 1639453},
        "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": us,
                      "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 1.0, "coll_busbw_gbs": busbw},
    }, separators=(",", ":")) + "\n"
