"""NCCL Inspector's Prometheus mode (NCCL_INSPECTOR_PROM_DUMP=1, NCCL 2.30, format v5.1), read per window.

The fixture tests/fixtures/realformat/nccl/inspector-prom-v5.1/ holds the four lines of NVIDIA/nccl
``plugins/profiler/inspector/README.md`` ("Current Metric Format Examples", v2.30.7) verbatim, under
the file name the writer gives them (``inspector_prom.cc`` inspectorPromGetFilename:
``nccl_inspector_metrics_<CUDA device UUID>.prom``).  Other lines below are built with the writer's
own format strings (inspectorPromGetLabelsColl / inspectorPromWriteCollBucket: ``%.6g`` values).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fabricmon.agent.nccl_inspector import PROM_MAX_AGE_S, PROM_MAX_BYTES, NcclInspectorSource
from fabricmon.agent.nccl_prom import parse_prom_line, uuid_of_file
from fabricmon.agent.nccl_records import NcclRecordError
from support.realformat import fixture

T0 = 1_764_000_000.0
README_FILE = "nccl_inspector_metrics_6f1c2a9e-3b7d-4c58-9e21-0a4d7b3c8e15.prom"
README_UUID = "GPU-6f1c2a9e-3b7d-4c58-9e21-0a4d7b3c8e15"


def coll_line(busbw: float, comm: str = "DP Group 0", coll: str = "AllReduce", size: str = "4-5GB",
              algo: str = "Ring_ll", gpu: str = "GPU0", nranks: int = 4, n_nodes: int = 1,
              metric: str = "nccl_bus_bandwidth_gbs") -> str:
    labels = (f'version="v5.1",slurm_job_id="unknown",node="nvl72004-T01",gpu="{gpu}",comm_name="{comm}",'
              f'n_nodes="{n_nodes}",nranks="{nranks}",collective="{coll}",message_size="{size}",algo_proto="{algo}"')
    return f"{metric}{{{labels}}} {busbw:.6g}\n"


class Dir:
    """A dump directory and a source over it whose wall clock the test sets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = T0
        self.src = NcclInspectorSource(str(path), wall_clock=lambda: self.now, timeout=5.0)

    def write(self, name: str, text: str, age: float = 10.0) -> Path:
        p = self.path / name
        p.write_text(text)
        os.utime(p, (self.now - age, self.now - age))
        return p

    def poll(self) -> dict:
        res = self.src.poll()
        self.last = res
        return {(r.family, tuple(sorted(r.labels))): r.value for r in res.readings}


def lab(**kw) -> tuple:
    return tuple(sorted(kw.items()))


def bw(uuid: str = README_UUID, comm: str = "DP Group 0", coll: str = "AllReduce") -> tuple:
    return ("fabricmon_nccl_window_bus_bandwidth_bytes_per_second", lab(uuid=uuid, comm_name=comm, collective=coll))


def lines_total(v: dict, result: str, reason: str) -> float:
    return v[("fabricmon_intake_lines_total", lab(source="nccl_inspector", result=result, reason=reason))]


def test_readme_lines_become_window_bandwidth_not_counts(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    shutil.copy(fixture("nccl", "inspector-prom-v5.1/" + README_FILE), tmp_path / README_FILE)
    os.utime(tmp_path / README_FILE, (T0 - 10, T0 - 10))
    v = d.poll()
    assert d.last.errors == 0, d.last.messages
    assert v[bw()] == pytest.approx(678.263e9)
    assert v[bw(coll="Send")] == pytest.approx(464.9e9)
    assert lines_total(v, "accepted", "ok") == 4
    assert v[("fabricmon_nccl_window_age_seconds", lab(uuid=README_UUID))] == pytest.approx(10.0)
    # nranks="4", n_nodes="1": four GPUs of this node belong to "DP Group 0"; one reports.
    assert v[("fabricmon_nccl_window_ranks", lab(comm_name="DP Group 0", nranks="4", state="expected"))] == 4
    assert v[("fabricmon_nccl_window_ranks", lab(comm_name="DP Group 0", nranks="4", state="reporting"))] == 1
    assert v[("fabricmon_intake_files", lab(source="nccl_inspector", kind="prom"))] == 1
    # Prom mode has no counts, ranks or comm ids: none of the JSON mode's per-rank series appear.
    assert not [k for k in v if k[0].startswith(("fabricmon_nccl_collective", "fabricmon_nccl_p2p",
                                                 "fabricmon_nccl_bus_bandwidth"))]


def test_a_window_is_read_once_settled_and_once_only(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    f = d.write(README_FILE, coll_line(100.0), age=0.5)  # NCCL may still be writing it
    v = d.poll()
    assert bw() not in v and lines_total(v, "accepted", "ok") == 0
    d.now += 2.0
    v = d.poll()
    assert v[bw()] == pytest.approx(100e9) and lines_total(v, "accepted", "ok") == 1
    d.now += 5.0
    v = d.poll()  # same window (an idle GPU's file is left alone): not read again
    assert lines_total(v, "accepted", "ok") == 1 and v[bw()] == pytest.approx(100e9)
    # The next window replaces the last one whole: the old bucket is gone, not averaged in.
    d.write(README_FILE, coll_line(300.0, coll="AllGather"), age=3.0)
    v = d.poll()
    assert bw() not in v and v[bw(coll="AllGather")] == pytest.approx(300e9)
    assert lines_total(v, "accepted", "ok") == 2
    f.unlink()  # NCCL unlinks its files at exit
    v = d.poll()
    assert not [k for k in v if k[0].startswith("fabricmon_nccl_window")]


def test_buckets_fold_into_one_series_per_collective(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    text = (coll_line(100.0, size="4-5GB", algo="Ring_ll") + coll_line(400.0, size="2-3KB", algo="Tree_ll128")
            + coll_line(0.0, size="1-2MB")  # NCCL writes 0 for a bucket without a bandwidth: no vote
            + coll_line(9498.47, metric="nccl_collective_exec_time_microseconds"))
    d.write(README_FILE, text)
    v = d.poll()
    series = [k for k in v if k[0] == "fabricmon_nccl_window_bus_bandwidth_bytes_per_second"]
    assert series == [bw()]  # no message_size, algo_proto, node, version or slurm_job_id labels
    assert v[bw()] == pytest.approx(200e9)  # geometric mean of 100 and 400, as NCCL means within a bucket


def test_stale_and_missing_ranks_are_data_quality_not_silence(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    uuids = ["6f1c2a9e-3b7d-4c58-9e21-0a4d7b3c8e1" + str(i) for i in range(4)]
    for i, u in enumerate(uuids):
        d.write(f"nccl_inspector_metrics_{u}.prom", coll_line(100.0 + i, gpu=f"GPU{i}"),
                age=PROM_MAX_AGE_S + 60 if i == 3 else 10.0)  # GPU3's rank stopped dumping
    v = d.poll()
    assert v[("fabricmon_nccl_window_ranks", lab(comm_name="DP Group 0", nranks="4", state="expected"))] == 4
    assert v[("fabricmon_nccl_window_ranks", lab(comm_name="DP Group 0", nranks="4", state="reporting"))] == 3
    stale = f"GPU-{uuids[3]}"
    assert bw(uuid=stale) not in v  # an old window is not shown as current ...
    assert v[("fabricmon_nccl_window_age_seconds",
              lab(uuid=stale))] == pytest.approx(PROM_MAX_AGE_S + 60)  # ... it says why
    assert v[bw(uuid=f"GPU-{uuids[0]}")] == pytest.approx(100e9)


def test_bad_lines_are_counted_and_cost_only_themselves(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    v229 = ('nccl_bus_bandwidth_gbs{comm_id="0xd152c00f111816",hostname="pool0-0002",rank="4",slurm_job="unknown",'
            'slurm_job_id="unknown",nranks="8",n_nodes="1",gpu_device_id="GPU4",collective="AllReduce",'
            'coll_sn="228924",timestamp="2025-10-17T03:31:47Z",message_size="2.00GB"} 366.1\n')
    text = (coll_line(100.0)
            + coll_line(100.0, comm='DP "Group"')  # the writer does not escape quotes
            + v229  # NCCL 2.29's per-collective format (labels from its README)
            + coll_line(float("inf")) + coll_line(-1.0) + coll_line(float("nan"))
            + coll_line(1.0, nranks=2**33)
            + "garbage line\n" + "nccl_bus_bandwidth_gbs{} 1\n"
            + coll_line(200.0, coll="ReduceScatter"))
    d.write(README_FILE, text)
    v = d.poll()
    assert v[bw()] == pytest.approx(100e9) and v[bw(coll="ReduceScatter")] == pytest.approx(200e9)
    assert lines_total(v, "accepted", "ok") == 2
    assert lines_total(v, "rejected", "not_prom") == 2  # the quoted comm name, the garbage
    assert lines_total(v, "rejected", "unknown_metric") == 1
    assert lines_total(v, "rejected", "out_of_range") == 4  # inf, -1, nan, nranks beyond uint32
    assert lines_total(v, "rejected", "missing_field") == 1
    assert d.last.errors >= 1 and any(README_FILE in m for m in d.last.messages)


def test_unknown_files_are_counted_not_silently_skipped(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    d.write(README_FILE, coll_line(1.0))
    d.write("node_exporter_own.prom", "node_load1 0.5\n")  # not NCCL's: not read
    d.write("host-pid1.log.gz", "x")
    d.write("host-pid1.log.tmp", "x")
    d.write("host-pid2.log", "")  # JSON mode, tailed
    v = d.poll()
    kinds = {dict(k[1])["kind"]: n for k, n in v.items() if k[0] == "fabricmon_intake_files"}
    assert kinds == {"json": 1, "prom": 1, "skipped": 3}


def test_oversized_prom_file_is_refused_once(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    d.write(README_FILE, coll_line(1.0) * (PROM_MAX_BYTES // 100))
    v = d.poll()
    assert lines_total(v, "rejected", "too_long") == 1 and bw() not in v
    d.now += 1
    v = d.poll()
    assert lines_total(v, "rejected", "too_long") == 1  # the same file is not refused every poll


def test_parse_prom_line_pure() -> None:
    s = parse_prom_line(coll_line(464.9, coll="Send", metric="nccl_p2p_bus_bandwidth_gbs")
                        .replace("collective=", "p2p_operation=").encode())
    assert (s.measure, s.op, s.comm_name, s.nranks, s.n_nodes, s.value) == ("busbw_gbs", "Send", "DP Group 0", 4, 1,
                                                                            464.9)
    assert parse_prom_line(b"") is None and parse_prom_line(b"# HELP x y") is None
    with pytest.raises(NcclRecordError) as info:
        parse_prom_line(coll_line(1.0, coll="Bcast").replace("collective=", "p2p_operation=")
                        .replace("nccl_bus", "nccl_p2p_bus").encode())
    assert info.value.reason == "bad_string"
    assert uuid_of_file(README_FILE) == README_UUID
    assert uuid_of_file("nccl_inspector_metrics_../../etc.prom") is None


def test_exposition_passes_promtool(tmp_path: Path) -> None:
    import subprocess

    from fabricmon.agent.exporter import exposition
    from fabricmon.agent.poller import Poller
    from fabricmon.sources.inventory import Inventory

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (CI installs the Debian package prometheus)")
    d = Dir(tmp_path / "dump")
    d.path.mkdir()
    d.write(README_FILE, coll_line(100.0) + coll_line(5.0, coll="Send", metric="nccl_p2p_bus_bandwidth_gbs")
            .replace("collective=", "p2p_operation="))
    poller = Poller("node-000", [d.src], lambda: Inventory(sysfs_root=""))
    try:
        text = exposition(poller.poll_once())
    finally:
        poller.close()
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    for name in (b"fabricmon_nccl_window_bus_bandwidth_bytes_per_second{", b"fabricmon_nccl_window_ranks{",
                 b"fabricmon_nccl_window_age_seconds{", b'fabricmon_intake_files{kind="prom"'):
        assert name in text


def test_prom_files_share_the_poll_byte_budget(tmp_path: Path) -> None:
    d = Dir(tmp_path)
    d.src = NcclInspectorSource(str(tmp_path), wall_clock=lambda: d.now, timeout=5.0, max_bytes_per_poll=1)
    uuids = ["6f1c2a9e-3b7d-4c58-9e21-0a4d7b3c8e1" + str(i) for i in range(3)]
    for u in uuids:
        d.write(f"nccl_inspector_metrics_{u}.prom", coll_line(100.0))
    reads = [lines_total(d.poll(), "accepted", "ok") for _ in range(4)]
    assert reads == [1, 2, 3, 3]  # one file per poll, the rest on the next ones, none twice
