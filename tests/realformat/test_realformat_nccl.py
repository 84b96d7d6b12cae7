"""NCCL Inspector records as NCCL 2.30 writes them: p2p_perf, comm_name."""

from __future__ import annotations

import json
import shutil

import pytest

from fabricmon.agent.nccl_inspector import MAX_P2P_PEERS, NcclInspectorSource
from fabricmon.agent.nccl_records import Header, NcclRecordError, Op, parse_object
from support.realformat import fixture


def by_family(res) -> dict:
    out: dict = {}
    for r in res.readings:
        out[(r.family, tuple(sorted(r.labels)))] = r.value * (r.scale if r.scale != 1 else 1)
    return out


def run(tmp_path, name):
    src = NcclInspectorSource(str(tmp_path))  # empty dir: the file below appears later, read from 0
    shutil.copy(fixture("nccl", name), tmp_path / "node-017-1639453.log")
    return src, src.poll()


def lab(**kw) -> tuple:
    return tuple(sorted(kw.items()))


def test_p2p_records_are_exported_not_bad_lines(tmp_path):
    src, res = run(tmp_path, "inspector-v4.2-nccl2.30-pp.jsonl")
    assert src.bad_lines_total == 0 and res.errors == 0
    v = by_family(res)
    send = lab(rank="2", comm="0x7f8c496ae9f661", direction="tx", peer="3")
    recv = lab(rank="2", comm="0x7f8c496ae9f661", direction="rx", peer="1")
    assert v[("fabricmon_nccl_p2p_operations_total", send)] == 2
    assert v[("fabricmon_nccl_p2p_operations_total", recv)] == 1
    assert v[("fabricmon_nccl_p2p_bytes_total", send)] == 2 * 33554432
    assert v[("fabricmon_nccl_p2p_seconds_total", send)] == pytest.approx(0.0022)
    assert v[("fabricmon_nccl_p2p_bus_bandwidth_bytes_per_second", send)] == pytest.approx((27.96 + 32.04) / 2 * 1e9)
    # the collective beside them still counts, and comm_name is followed
    assert v[("fabricmon_nccl_collectives_total", lab(rank="2", comm="0xe62dedaa97644a", collective="AllReduce"))] == 1
    assert v[("fabricmon_nccl_comm_info", lab(rank="2", comm="0x7f8c496ae9f661", comm_name="PP Group 1"))] == 1
    assert v[("fabricmon_nccl_comm_info", lab(rank="2", comm="0xe62dedaa97644a", comm_name="DP Group 0"))] == 1


def test_p2p_peers_are_bounded(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    lines = [json.dumps({"header": {"id": "0xa", "comm_name": "EP", "rank": 0, "n_ranks": 64, "nnodes": 8},
                         "p2p_perf": {"p2p": "Send", "p2p_peer": p, "p2p_msg_size_bytes": 8192,
                                      "p2p_exec_time_us": 10, "p2p_busbw_gbs": 1.0}}) for p in range(1, 64)]
    (tmp_path / "a.log").write_text("\n".join(lines) + "\n")
    res = src.poll()
    peers = {dict(r.labels)["peer"] for r in res.readings if r.family == "fabricmon_nccl_p2p_operations_total"}
    assert len(peers) == MAX_P2P_PEERS + 1 and "other" in peers
    total = sum(r.value for r in res.readings if r.family == "fabricmon_nccl_p2p_operations_total")
    assert total == 63


def test_parse_object_pure():
    h = {"id": "0xa", "rank": 2}
    op = parse_object({"header": h, "p2p_perf": {"p2p": "Recv", "p2p_peer": 0, "p2p_exec_time_us": "nan"}})
    assert isinstance(op, Op) and op.header == Header("2", "0xa", "")
    assert op.name == "rx" and op.peer == "0" and op.exec_us is None
    with pytest.raises(NcclRecordError) as bad:
        parse_object({"header": h, "p2p_perf": {"p2p": "Bcast", "p2p_peer": 0}})
    assert bad.value.reason == "bad_string"
    # every operation line carries its own header; a header alone is no record
    for shape in ({"p2p_perf": {"p2p": "Recv", "p2p_peer": 0}}, {"header": h}, {"header": h, "dump_stats": {}}):
        with pytest.raises(NcclRecordError) as bad:
            parse_object(shape)
        assert bad.value.reason == "missing_field"
