"""Tailing NCCL Inspector JSON logs: offsets, partial lines, truncation, rotation, nan."""

from __future__ import annotations

import json
import os

from fabricmon.agent.nccl_inspector import NcclInspectorSource
from fabricmon.counters import CounterTracker
from fabricmon.model import Semantics
from support.nccllines import rec


def values(res) -> dict:
    return {(r.family, dict(r.labels)["rank"], dict(r.labels)["collective"]): r.value for r in nccl(res)}


def nccl(res) -> list:
    """The per-collective readings (the intake self-metrics ride along in every poll)."""
    return [r for r in res.readings if r.family.startswith("fabricmon_nccl_")]


def count(res, rank=0, coll="AllReduce"):
    return values(res).get(("fabricmon_nccl_collectives_total", str(rank), coll))


def append(path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_existing_files_from_end_new_files_from_beginning(tmp_path):
    old = tmp_path / "host-pid1.log"
    old.write_text(rec(sn=1) * 5)
    src = NcclInspectorSource(str(tmp_path))
    assert nccl(src.poll()) == []  # history before the agent started is not counted
    append(old, rec(sn=6))
    new = tmp_path / "host-pid2.log"
    new.write_text(rec(rank=1, sn=1) * 3)
    res = src.poll()
    assert count(res, 0) == 1 and count(res, 1) == 3
    assert nccl(src.poll()) and count(src.poll(), 0) == 1  # running sums stay, nothing re-read


def test_partial_last_line_kept_until_complete(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    f = tmp_path / "p.log"
    line = rec(us=250.0, size=4096, busbw=20.0)
    f.write_text(rec() + line[:40])
    res = src.poll()
    assert count(res) == 1 and src.bad_lines_total == 0
    append(f, line[40:])
    res = src.poll()
    v = values(res)
    assert count(res) == 2
    assert v[("fabricmon_nccl_collective_bytes_total", "0", "AllReduce")] == 1024 + 4096
    assert v[("fabricmon_nccl_collective_seconds_total", "0", "AllReduce")] == 350  # microseconds, scale 1e-6
    assert v[("fabricmon_nccl_bus_bandwidth_bytes_per_second", "0", "AllReduce")] == 20.0e9


def test_started_mid_line_skips_the_fragment(tmp_path):
    f = tmp_path / "p.log"
    f.write_text(rec() + rec()[:30])  # NCCL is mid-write when the agent starts
    src = NcclInspectorSource(str(tmp_path))
    append(f, rec()[30:] + rec(coll="AllGather"))
    res = src.poll()
    assert count(res, coll="AllGather") == 1 and count(res) is None and src.bad_lines_total == 0


def test_truncation_restarts_at_zero(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    f = tmp_path / "p.log"
    f.write_text(rec() * 4)
    assert count(src.poll()) == 4
    f.write_text(rec())  # truncated and rewritten: smaller than the offset
    assert count(src.poll()) == 5


def test_rotation_by_inode_change(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    f = tmp_path / "p.log"
    f.write_text(rec() * 3)
    assert count(src.poll()) == 3
    os.rename(f, tmp_path / ".p.log.1")
    f.write_text(rec() * 5)  # a new file under the old name, larger than the old offset
    assert count(src.poll()) == 8


def test_nan_strings_and_bad_lines(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    f = tmp_path / "p.log"
    nan = rec().replace('"coll_exec_time_us":100.0', '"coll_exec_time_us":"nan"').replace(
        '"coll_busbw_gbs":10.0', '"coll_busbw_gbs":"nan"')
    f.write_text(nan + "{not json\n" + json.dumps({"header": {}}) + "\n" + rec(busbw=30.0))
    res = src.poll()
    v = values(res)
    assert count(res) == 2
    assert v[("fabricmon_nccl_collective_seconds_total", "0", "AllReduce")] == 100
    assert v[("fabricmon_nccl_bus_bandwidth_bytes_per_second", "0", "AllReduce")] == 30.0e9
    assert src.bad_lines_total == 2 and res.errors == 2 and res.up


def test_large_file_is_read_in_bounded_pieces(tmp_path):
    src = NcclInspectorSource(str(tmp_path), max_bytes_per_poll=64 * 1024)
    f = tmp_path / "p.log"
    n = 2000
    f.write_text(rec() * n)
    seen = []
    for _ in range(100):
        c = count(src.poll())
        seen.append(c)
        if c == n:
            break
    assert seen[-1] == n and len(seen) > 3  # the backlog took several polls, nothing lost


def test_counters_feed_the_tracker_as_monotonic_deltas(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    f = tmp_path / "p.log"
    f.write_text(rec())
    tracker = CounterTracker()
    r1 = src.poll()
    assert {r.semantics for r in r1.readings if r.family.endswith("_total")} == {Semantics.MONOTONIC}
    tracker.process(r1.readings, 1.0)
    append(f, rec() * 2)
    _, deltas, _ = tracker.process(src.poll().readings, 2.0)
    d = {x.family: x.delta for x in deltas}
    assert d["fabricmon_nccl_collectives_total"] == 2
    assert abs(d["fabricmon_nccl_collective_seconds_total"] - 200e-6) < 1e-12


def test_missing_directory_is_not_an_error(tmp_path):
    src = NcclInspectorSource(str(tmp_path / "absent"))
    res = src.poll()
    assert res.up and not res.present and res.errors == 0
    (tmp_path / "absent" / "job1").mkdir(parents=True)
    (tmp_path / "absent" / "job1" / "p.log").write_text(rec())
    assert count(src.poll()) == 1  # per-job subdirectory, new file from its beginning


def test_lines_of_an_unknown_shape_are_refused_and_counted(tmp_path):
    """The Inspector writes a header on every operation line (format v4.0, the only one NVIDIA/nccl
    writes): a line of another shape is refused with a counted reason, never crashes the source and
    never lends its header to the lines after it."""
    src = NcclInspectorSource(str(tmp_path))
    header = {"id": "0x7f8c496ae9f661", "rank": 0, "n_ranks": 8, "nnodes": 1}
    unknown = [{"header": header, "dump_stats": {"coll_dropped_total": 5}},  # header, but no operation
               {"coll_perf": {"coll": "AllReduce", "coll_sn": 2}},  # an operation, but no header
               {"header": header, "metadata": {"inspector_output_format_version": "v4.0"}},
               {"proxy_trace": {"channel_id": 0}},  # no NVIDIA/nccl commit writes this key either
               [header], "coll_perf", None]
    (tmp_path / "p.log").write_text("".join(json.dumps(u) + "\n" for u in unknown) + rec())
    res = src.poll()
    assert count(res) == 1 and res.up
    assert src.rejected["missing_field"] == 4 and src.rejected["not_object"] == 3
    assert src.bad_lines_total == 7 and res.errors == 7
    refused = {dict(r.labels)["reason"]: r.value for r in res.readings
               if r.family == "fabricmon_intake_lines_total" and dict(r.labels)["result"] == "rejected"}
    assert refused["missing_field"] == 4 and refused["not_object"] == 3
    assert {r.family for r in nccl(res)} == {
        "fabricmon_nccl_collectives_total", "fabricmon_nccl_collective_seconds_total",
        "fabricmon_nccl_collective_bytes_total", "fabricmon_nccl_bus_bandwidth_bytes_per_second"}
