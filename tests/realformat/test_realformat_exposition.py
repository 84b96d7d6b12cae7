"""Every family the real-format corpus produces passes `promtool check metrics`."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fabricmon.agent.exporter import exposition
from fabricmon.agent.nccl_inspector import NcclInspectorSource
from fabricmon.config import ProfileConfig
from fabricmon.counters import CounterTracker
from fabricmon.model import Snapshot
from fabricmon.sources.ethtool import EthtoolSource, PfcInfo
from fabricmon.sources.fabric_config import TRUST_UNKNOWN, FabricConfigSource
from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import Inventory, PortInfo
from support.realformat import fixture

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_realformat_exposition_is_promtool_clean(tmp_path):
    readings = []
    mlx4 = fixture("sysfs", "mlx4-ofed-counters-ext")
    ib = PortInfo("mlx4_0", "1", str(mlx4 / "class/infiniband/mlx4_0/ports/1"), "InfiniBand", "", "0")
    readings += InfinibandSource(timeout=1.0).poll(Inventory(str(mlx4), ports=(ib,))).readings
    eth = tmp_path / "ethtool"
    eth.mkdir()
    for name, iface in (("mlx5-cx4lx-global-pause.txt", "eth3"), ("mlx5-inbox-roce-prio3.txt", "ens1np0"),
                        ("mlx5-kernel-4.7-pport-names.txt", "eth4")):
        shutil.copy(fixture("ethtool", name), eth / f"{iface}.txt")
    src = EthtoolSource(ethtool_dir=str(eth))
    readings += src.poll(Inventory(str(tmp_path), extra_netdevs=("eth3", "ens1np0", "eth4"))).readings
    roce = fixture("sysfs", "mlx5-roce-400gaui8")
    port = PortInfo("mlx5_0", "1", str(roce / "class/infiniband/mlx5_0/ports/1"), "Ethernet", "ens1np0", "0")
    vf = PfcInfo(TRUST_UNKNOWN, frozenset({3}))
    cfg = FabricConfigSource(dcb_reader=lambda _i: vf, profile=ProfileConfig(rate_gbps=400.0))
    readings += cfg.poll(Inventory(str(tmp_path), ports=(port,))).readings
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    inspector = NcclInspectorSource(str(nccl))
    shutil.copy(fixture("nccl", "inspector-v4.2-nccl2.30-pp.jsonl"), nccl / "a.log")
    readings += inspector.poll().readings
    samples, _, _ = CounterTracker().process(readings, 1.0)
    snap = Snapshot("node-017", 1.0, 1, tuple(samples), (), 0.0, ())
    body = exposition(snap, now=1.0)
    families = {ln.split()[2] for ln in body.decode().splitlines() if ln.startswith("# TYPE")}
    for want in ("fabricmon_global_pause_frames_total", "fabricmon_nccl_p2p_operations_total",
                 "fabricmon_nccl_comm_info",
                 "fabricmon_fabric_config_unknown", "fabricmon_ib_port_data_rate_bytes_per_second",
                 "fabricmon_netdev_ecn_marked_packets_total", "fabricmon_netdev_pause_control_frames_total"):
        assert want in families, want
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), (proc.stdout + proc.stderr).decode()
