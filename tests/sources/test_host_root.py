"""--host-root / host_root: the host source reads the host's /proc where the host's / is mounted.

The DaemonSet mounts the node's / at /host and passes --sysfs-root /host/sys --host-root /host; the
host source must then read /host/proc, not the container's /proc, and must not be silently off
because sysfs_root is not /sys (node_exporter's --path.rootfs does the same).  The proc tree here is
this machine's own /proc/{stat,meminfo,loadavg,net/dev}, copied at test time (the kernel's real
formats) with a few values rewritten so the readings can only have come from the copy.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabricmon.agent.runtime import build_sources
from fabricmon.cli import build_parser
from fabricmon.config import load_agent_config
from fabricmon.configload import ConfigError
from fabricmon.sources.host import HostSource
from fabricmon.sources.inventory import Inventory

MEM_TOTAL_KB = 1_234_567_890
MEM_AVAILABLE_KB = 987_654_321
LOAD1 = 123.5
IB0 = (11_111_111_111, 222_222_222, 3, 4, 0, 0, 0, 0, 55_555_555_555, 666_666_666, 7, 8, 0, 0, 0, 0)


def _host_root(tmp: Path) -> Path:
    root = tmp / "host"
    proc = root / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text(Path("/proc/stat").read_text())
    meminfo = Path("/proc/meminfo").read_text()
    meminfo = re.sub(r"^MemTotal:\s+\d+ kB", f"MemTotal:       {MEM_TOTAL_KB} kB", meminfo, flags=re.M)
    meminfo = re.sub(r"^MemAvailable:\s+\d+ kB", f"MemAvailable:   {MEM_AVAILABLE_KB} kB", meminfo, flags=re.M)
    (proc / "meminfo").write_text(meminfo)
    fields = Path("/proc/loadavg").read_text().split()
    (proc / "loadavg").write_text(" ".join([f"{LOAD1:.2f}", *fields[1:]]) + "\n")
    # /proc/net/dev: its two header lines, then one line per netdev in the kernel's layout
    # (net/core/net-procfs.c dev_seq_printf_stats: "%6s: %7llu %7llu %4llu ...").
    head = Path("/proc/net/dev").read_text().splitlines()[:2]
    line = "%6s: %7d %7d %4d %4d %4d %5d %10d %9d %8d %7d %4d %4d %4d %5d %7d %10d" % ("ib0", *IB0)  # noqa: UP031 - the kernel's own format
    (proc / "net" / "dev").write_text("\n".join([*head, line]) + "\n")
    return root


def _values(res) -> dict:
    return {(r.family, tuple(r.labels)): r.value for r in res.readings}


def test_host_source_reads_the_given_root(tmp_path) -> None:
    root = _host_root(tmp_path)
    src = HostSource(host_root=str(root))
    res = src.poll(Inventory(sysfs_root=""))
    assert res.up and res.errors == 0
    v = _values(res)
    assert v[("fabricmon_host_memory_total_bytes", ())] == MEM_TOTAL_KB * 1024
    assert v[("fabricmon_host_memory_available_bytes", ())] == MEM_AVAILABLE_KB * 1024
    assert v[("fabricmon_host_load1", ())] == LOAD1
    ib0 = (("interface", "ib0"),)
    assert v[("fabricmon_host_network_receive_bytes_total", ib0)] == IB0[0]
    assert v[("fabricmon_host_network_transmit_bytes_total", ib0)] == IB0[8]
    assert v[("fabricmon_host_network_errors_total", (*ib0, ("direction", "rx")))] == IB0[2]
    assert v[("fabricmon_host_network_drops_total", (*ib0, ("direction", "tx")))] == IB0[11]
    # Only the root's netdevs: this machine's (lo excluded anyway, but eth0 and the like) are absent.
    assert {dict(lab).get("interface") for fam, lab in v if "network" in fam} == {"ib0"}
    # The global psutil state is back to the default for anyone else in the process.
    import psutil

    assert psutil.PROCFS_PATH == "/proc"


def test_a_root_without_proc_is_an_error_not_a_crash(tmp_path) -> None:
    res = HostSource(host_root=str(tmp_path)).poll(Inventory(sysfs_root=""))
    assert not res.up and res.errors >= 3
    assert not [r for r in res.readings if r.family == "fabricmon_host_memory_total_bytes"]


def test_flag_and_key(tmp_path) -> None:
    ns = build_parser().parse_args(["agent", "--sysfs-root", "/host/sys", "--host-root", "/host"])
    assert ns.host_root == "/host"
    from fabricmon.cli import _agent_overrides

    cfg = load_agent_config(None, _agent_overrides(ns))
    assert cfg.host_root == "/host" and cfg.sysfs_root == "/host/sys"
    (tmp_path / "a.yaml").write_text("host_root: /host\n")
    assert load_agent_config(tmp_path / "a.yaml").host_root == "/host"
    (tmp_path / "b.yaml").write_text("host_root: host\n")
    with pytest.raises(ConfigError, match=r"b.yaml: host_root: must be an absolute path"):
        load_agent_config(tmp_path / "b.yaml")
    # Flags win over the file.
    assert load_agent_config(tmp_path / "a.yaml", {"host_root": "/elsewhere"}).host_root == "/elsewhere"


def _host_sources(cfg) -> list[HostSource]:
    return [s for s in build_sources(cfg) if isinstance(s, HostSource)]


def test_host_source_on_in_a_container(tmp_path) -> None:
    """sysfs_root /host/sys (never /sys in the DaemonSet) with host_root: on, reading HOST_ROOT/proc."""
    root = _host_root(tmp_path)
    cfg = load_agent_config(None, {"sysfs_root": str(root / "sys"), "host_root": str(root), "nvml": "off"})
    (src,) = _host_sources(cfg)
    assert src.procfs == str(root / "proc")
    # Bare metal: /sys and / as before.
    (src,) = _host_sources(load_agent_config(None, {"nvml": "off"}))
    assert src.procfs == "/proc"
    # A fixture tree without a host root: off (this machine's /proc would be another host's data), said in a log.
    assert _host_sources(load_agent_config(None, {"sysfs_root": str(tmp_path / "sys"), "nvml": "off"})) == []
