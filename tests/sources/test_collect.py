"""``fabricmon collect``: a node captured into an archive exports, through the agent, what the node exported."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fabricmon.collect import Limits, collect, ethtool_text, extract_capture, pfc_text
from fabricmon.configload import ConfigError
from fabricmon.sim.fixture import write_fixture
from fabricmon.sources.ethtool import parse_ethtool_stats, parse_pfc_summary
from support.golden_cases import NodeInput, agent_exposition


def capture_of(root: Path, out: Path, **kw) -> dict:
    return collect(str(root / "sys"), str(out), ethtool_dir=str(root / "ethtool"), nvml=f"fake:{root / 'nvml.json'}",
                   **kw)


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.mark.parametrize("options", [
    {"layout": "ib", "fault": "nvlink_errors"},
    {"layout": "roce", "fault": "pfc_storm"},
    {"layout": "roce", "fault": "link_down", "legacy_ext": True},
    {"layout": "ib", "dual_port": True},
], ids=["ib-nvlink", "roce-pfc", "roce-down-legacy", "ib-dual-port"])
def test_capture_exports_what_the_node_exported(tmp_path: Path, options: dict) -> None:
    write_fixture(tmp_path / "node", **options)
    want = agent_exposition(NodeInput(tmp_path / "node"), tmp_path / "w1")
    summary = capture_of(tmp_path / "node", tmp_path / "node.tar.gz")
    assert summary["devices"] == [f"mlx5_{i}" for i in range(9)] and summary["skipped_count"] == 0
    found = extract_capture(str(tmp_path / "node.tar.gz"), str(tmp_path / "x"))
    assert found["nvml"].startswith("fake:") and found["ethtool_dir"]
    got = agent_exposition(NodeInput(tmp_path / "x" / "node"), tmp_path / "w2")
    assert got.count("\n") > 500
    assert got == want


@pytest.mark.integration
def test_cli_collect_then_agent_once_capture(tmp_path: Path) -> None:
    root = tmp_path / "node"
    write_fixture(root, layout="roce", fault="rdma_retransmits", node_name="node-042")
    fm = [sys.executable, "-m", "fabricmon", "--log-level", "info", "--log-format", "json"]
    out = tmp_path / "node.tar.gz"
    proc = subprocess.run([*fm, "collect", "--sysfs-root", str(root / "sys"), "--ethtool-dir", str(root / "ethtool"),
                           "--nvml", f"fake:{root / 'nvml.json'}", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line)["event"] for line in proc.stderr.splitlines() if line.startswith("{")]
    assert events.count("capture_device") == 9 and events[-1] == "capture_written"  # progress, then the result
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]

    def once(*args: str) -> str:
        p = subprocess.run([*fm, "agent", "--once", *args], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return "".join(ln for ln in p.stdout.splitlines(keepends=True) if not ln.startswith((
            "fabricmon_collector_duration_seconds{", "fabricmon_snapshot_timestamp_seconds{",
            "fabricmon_snapshot_age_seconds{")))

    from_capture = once("--capture", str(out))
    assert 'node="node-042"' in from_capture  # the node name travels in the capture
    assert from_capture == once("--sysfs-root", str(root / "sys"), "--ethtool-dir", str(root / "ethtool"),
                                "--nvml", f"fake:{root / 'nvml.json'}")


def test_symlink_loops_are_recorded_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "node"
    write_fixture(root, layout="ib")
    ibdev = (root / "sys/class/infiniband/mlx5_0").resolve()
    # As in real sysfs: subsystem points back at the class directory, and a link to itself's parent.
    os.symlink("../../../../../class/infiniband", ibdev / "subsystem")
    os.symlink("..", ibdev / "ports" / "1" / "up")
    capture_of(root, tmp_path / "n.tar.gz")
    m = members(tmp_path / "n.tar.gz")
    rel = "node/" + os.path.relpath(ibdev, root).replace(os.sep, "/")
    assert m[rel + "/subsystem"].issym() and m[rel + "/ports/1/up"].issym()
    assert not [n for n in m if "/subsystem/" in n or "/up/" in n]


def test_links_leaving_sysfs_and_unreadable_files_are_left_out_and_listed(tmp_path: Path) -> None:
    root = tmp_path / "node"
    write_fixture(root, layout="ib")
    ibdev = (root / "sys/class/infiniband/mlx5_1").resolve()
    os.symlink("/etc", ibdev / "escape")
    os.symlink("../../../../../../../..", ibdev / "escape_up")
    wo = ibdev / "ports/1/counters/write_only_reset"
    wo.write_text("0\n")
    wo.chmod(0o200)
    summary = capture_of(root, tmp_path / "n.tar.gz")
    skipped = {os.path.basename(s["path"]): s["reason"] for s in summary["skipped"]}
    assert set(skipped) == {"escape", "escape_up", "write_only_reset"}, skipped
    m = members(tmp_path / "n.tar.gz")
    assert not [n for n in m if n.endswith(("/escape", "/escape_up", "/write_only_reset"))]
    assert json.loads(extract_capture_json(tmp_path / "n.tar.gz"))["skipped_count"] == 3


def extract_capture_json(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        return tar.extractfile("node/capture.json").read().decode()


def test_bounds_stop_the_capture_with_one_line_and_leave_no_file(tmp_path: Path) -> None:
    root = tmp_path / "node"
    write_fixture(root, layout="ib")
    out = tmp_path / "n.tar.gz"
    with pytest.raises(ConfigError, match=r"more than 100 files \(raise --max-files\)"):
        capture_of(root, out, limits=Limits(max_files=100))
    with pytest.raises(ConfigError, match="more than 5000 bytes"):
        capture_of(root, out, limits=Limits(max_total_bytes=5000))
    assert os.listdir(tmp_path) == ["node"]  # nothing half-written
    # A file over the per-file bound costs only that file.
    summary = capture_of(root, out, limits=Limits(max_file_bytes=100))
    assert summary["skipped_count"] >= 1 and all("larger than 100 bytes" in s["reason"] for s in summary["skipped"])


@pytest.mark.parametrize("args,message", [
    (["--sysfs-root", "{tmp}/none"], "collect: --sysfs-root {tmp}/none: not a directory"),
    (["--sysfs-root", "{tmp}"], "collect: --sysfs-root {tmp}: no class/infiniband directory"),
    (["--sysfs-root", "{tmp}/node/sys", "--nvml", "fake:{tmp}/nope.json"],
     "collect: --nvml fake:{tmp}/nope.json: no such file"),
    (["--sysfs-root", "{tmp}/node/sys", "--ethtool-dir", "{tmp}/nope"],
     "collect: --ethtool-dir {tmp}/nope: not a directory"),
])
def test_bad_collect_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    write_fixture(tmp_path / "node", layout="ib")
    argv = [a.format(tmp=tmp_path) for a in args]
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "collect", *argv, "--nvml", "off", "--out",
                           str(tmp_path / "o.tar.gz")] if "--nvml" not in args else
                          [sys.executable, "-m", "fabricmon", "collect", *argv, "--out", str(tmp_path / "o.tar.gz")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith("fabricmon: error: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "o.tar.gz").exists()


def _tar_with(tmp_path: Path, *entries: tarfile.TarInfo) -> Path:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def _info(name: str, *, link: str | None = None, size: int = 1) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    else:
        info.size = size
    return info


@pytest.mark.parametrize("entries,message", [
    ([_info("etc/passwd")], "outside node/"),
    ([_info("node/sys/x"), _info("node/sys/evil", link="/etc/passwd")], "cannot extract"),
    ([_info("node/sys/y"), _info("node/sys/up", link="../../../outside")], "cannot extract"),
    ([_info("node/sys/big", size=2 << 20)], "exceeds the size limits"),
    ([_info("node/hostname")], "no node/sys"),
])
def test_bad_capture_archives_are_refused(tmp_path: Path, entries, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        extract_capture(str(_tar_with(tmp_path, *entries)), str(tmp_path / "x"))


def test_agent_capture_of_a_non_archive_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "node.tar.gz"
    bad.write_text("not an archive\n")
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "agent", "--once", "--capture", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"fabricmon: error: --capture {bad}: not a readable capture archive")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_without_ethtool_dir_the_ioctl_is_used_and_a_missing_netdev_costs_only_its_file(tmp_path: Path) -> None:
    """The fixture's netdevs do not exist on this host: the ioctl fails for each, the capture still completes."""
    root = tmp_path / "node"
    write_fixture(root, layout="roce")
    summary = collect(str(root / "sys"), str(tmp_path / "n.tar.gz"), nvml="off")
    assert summary["ethtool"] == "ioctl" and summary["nvml"] == "off"
    assert {s["path"] for s in summary["skipped"]} >= {f"ethtool -S {n}" for n in summary["netdevs"]}
    assert not [n for n in members(tmp_path / "n.tar.gz") if n.startswith("node/ethtool/")]


def test_ethtool_and_pfc_text_parse_back() -> None:
    stats = [("rx_prio3_pause", 12), ("tx_pause_storm_warning_events", 0), ("rx_bits_phy", 2 ** 63)]
    assert parse_ethtool_stats(ethtool_text(stats)) == stats
    info = parse_pfc_summary(pfc_text("dscp", frozenset({3})))
    assert info.trust == "dscp" and info.pfc_enabled == frozenset({3})
    assert parse_pfc_summary(pfc_text(None, None)).pfc_enabled is None


def test_truncated_capture_is_refused(tmp_path: Path) -> None:
    write_fixture(tmp_path / "node", layout="ib")
    out = tmp_path / "n.tar.gz"
    capture_of(tmp_path / "node", out)
    data = out.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="damaged archive|cannot extract"):
        extract_capture(str(out), str(tmp_path / "x"))


@pytest.mark.skipif(not os.path.isdir("/sys/class/net/lo"), reason="no sysfs mounted at /sys")
def test_walker_on_this_hosts_real_sysfs_netdev(tmp_path: Path) -> None:
    """Real sysfs, not a fixture: attributes that answer EINVAL/EOPNOTSUPP, the subsystem loop, queues/."""
    from fabricmon.collect import _Archive, _SysfsCapture

    ar = _Archive(Limits())
    cap = _SysfsCapture("/sys", ar)
    cap.netdev_entry("lo")
    names = set(ar.members)
    assert {"node/sys/class/net/lo", "node/sys/devices/virtual/net/lo/mtu",
            "node/sys/devices/virtual/net/lo/statistics/rx_bytes"} <= names
    assert ar.members["node/sys/class/net/lo"][0].issym()
    assert ar.members["node/sys/devices/virtual/net/lo/subsystem"][0].issym()  # the loop back to class/net
    assert not [n for n in names if "/queues/" in n or "/power/" in n or "/subsystem/" in n]
    assert len(names) < 500
    assert ar.members["node/sys/devices/virtual/net/lo/mtu"][1].strip().isdigit()
