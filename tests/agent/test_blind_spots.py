"""What the agent cannot see, it says in /metrics (issue 25, "blind without a word").

- a stream the aggregator refuses (wrong token, a token naming another node), and how long the
  stream has been down, against the real gRPC server on 127.0.0.1;
- NVIDIA GPUs on the PCI bus that NVML does not report (the real nvidia-ml-py, which finds no
  libnvidia-ml here: NVML absent, exactly the case that was silent), from a sysfs tree in the
  kernel's format;
- the RDMA ports the config expects beside those found;
- fatal XIDs as one counter per GPU from 0, so ``increase()`` sees the first.

The alerts over these series are in deploy/prometheus (promtool unit tests there).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import exposition
from fabricmon.agent.runtime import build_agent
from fabricmon.agent.selfmetrics import AgentSelfCollector, self_exposition
from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NodeHello
from fabricmon.config import load_agent_config
from fabricmon.sources.nvml.xid import FATAL_XIDS
from fabricmon.sources.pci_gpus import PciGpuSource, is_nvidia_gpu
from fabricmon.topology import generate_topology
from support.waiting import wait_until


def _samples(text: bytes | str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode() if isinstance(text, bytes) else text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float | None:
    for (n, labs), v in samples.items():
        if n == name and all((k, val) in labs for k, val in labels.items()):
            return v
    return None


# ---------------------------------------------------------------- stream refused / down

def _client(target: str, node: str, token: str) -> StreamClient:
    hello = NodeHello(node, "test", 1.0, boot_id="b1")
    return StreamClient(target, node, lambda: hello, MemorySpool(), token=token, backoff_min=0.05,
                        backoff_max=0.2, hello_timeout=3.0)


@pytest.mark.integration
def test_a_refused_stream_is_counted_by_reason_and_its_downtime_grows() -> None:
    engine = Engine(generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test"))
    srv = start_grpc_server(engine, "127.0.0.1:0", node_tokens={"node-001": "tok-one", "node-002": "tok-two"})
    clients = {"wrong": _client(srv.address, "node-001", "not-a-token"),      # unauthenticated
               "other": _client(srv.address, "node-003", "tok-one"),          # node-001's token: identity
               "good": _client(srv.address, "node-002", "tok-two")}
    try:
        for c in clients.values():
            c.start()
        assert wait_until(lambda: clients["wrong"].state.refused["unauthenticated"] >= 2
                          and clients["other"].state.refused["permission_denied"] >= 2
                          and clients["good"].connected, 20)
        wrong = _samples(self_exposition(AgentSelfCollector("node-001", clients["wrong"].stats, None))())
        assert _value(wrong, "fabricmon_stream_refused_total", reason="unauthenticated") >= 2
        assert _value(wrong, "fabricmon_stream_refused_total", reason="permission_denied") == 0
        assert _value(wrong, "fabricmon_stream_connected") == 0
        down = _value(wrong, "fabricmon_stream_disconnected_seconds")
        assert down > 0
        assert _value(wrong, "fabricmon_stream_interval_seconds") == 1.0
        assert wait_until(lambda: clients["wrong"].state.disconnected_for() > down + 0.2, 5)
        other = _samples(self_exposition(AgentSelfCollector("node-003", clients["other"].stats, None))())
        assert _value(other, "fabricmon_stream_refused_total", reason="permission_denied") >= 2
        good = _samples(self_exposition(AgentSelfCollector("node-002", clients["good"].stats, None))())
        assert _value(good, "fabricmon_stream_disconnected_seconds") == 0
        assert _value(good, "fabricmon_stream_refused_total", reason="unauthenticated") == 0
        # Lost after being up: counts from the loss, not from the start.
        srv.stop(0)
        assert wait_until(lambda: not clients["good"].connected, 10)
        assert 0 < clients["good"].state.disconnected_for() < 5
    finally:
        for c in clients.values():
            c.stop(2.0)
        srv.stop(0)


# ---------------------------------------------------------------- GPUs on the PCI bus, NVML absent

# One DGX H100-like node as `lspci -nn` names it (IDs from the PCI ID database, pci-ids.ucw.cz):
# (BDF, vendor, device, class).  8 x 10de:2330 "GH100 [H100 SXM5 80GB]", 3D controller 0302;
# 10de:22a3 "GH100 [H100 NVSwitch]", bridge 0680 (NVIDIA, but not a GPU); 15b3:1021 "MT2910 Family
# [ConnectX-7]", InfiniBand controller 0207; 1a03:2000 ASPEED BMC graphics, VGA 0300 (a GPU class,
# not NVIDIA); 8086:09a2 Intel Ice Lake memory map/VT-d, 0880.
_H100_BDFS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
              "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")
PCI_FUNCTIONS = (
    [(bdf, "0x10de", "0x2330", "0x030200") for bdf in _H100_BDFS]
    + [(f"0000:0{i}:00.0", "0x10de", "0x22a3", "0x068000") for i in range(5, 9)]
    + [(f"0000:{b}:00.0", "0x15b3", "0x1021", "0x020700") for b in ("19", "2b", "3b", "5e", "9b", "ac", "bb", "dc")]
    + [("0000:03:00.0", "0x1a03", "0x2000", "0x030000"), ("0000:00:00.1", "0x8086", "0x09a2", "0x088000")]
)


def _pci_tree(sysfs: Path, functions=PCI_FUNCTIONS) -> None:
    """/sys/bus/pci/devices/<BDF> are links into /sys/devices/pciDDDD:BB/..., as the kernel lays them out."""
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    for bdf, vendor, device, cls in functions:
        real = sysfs / "devices" / f"pci{bdf[:7]}" / bdf
        real.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            (real / name).write_text(value + "\n")
        os.symlink(os.path.relpath(real, sysfs / "bus" / "pci" / "devices"), sysfs / "bus" / "pci" / "devices" / bdf)


def test_is_nvidia_gpu_reads_vendor_and_base_class() -> None:
    assert is_nvidia_gpu("0x10de", "0x030200") and is_nvidia_gpu("0x10de", "0x030000")
    assert not is_nvidia_gpu("0x10de", "0x068000")  # NVSwitch
    assert not is_nvidia_gpu("0x1a03", "0x030000")  # BMC VGA
    assert not is_nvidia_gpu("0x10de", "garbage") and not is_nvidia_gpu("", "")


def test_pci_count_follows_hot_plug_without_rereading_an_unchanged_bus(tmp_path) -> None:
    _pci_tree(tmp_path)
    src = PciGpuSource(str(tmp_path))
    from fabricmon.sources.inventory import Inventory

    res = src.poll(Inventory(str(tmp_path)))
    assert [(r.family, r.value) for r in res.readings] == [("fabricmon_pci_nvidia_gpus", 8.0)] and res.errors == 0
    # A GPU falls off the bus (XID 79's usual sequel): its function goes away.
    os.unlink(tmp_path / "bus" / "pci" / "devices" / _H100_BDFS[3])
    assert src.poll(Inventory(str(tmp_path))).readings[0].value == 7.0
    # No sysfs at all (a fixture root): 0, not an error.
    assert PciGpuSource(str(tmp_path / "none")).poll(Inventory("")).readings[0].value == 0.0


def test_gpu_node_without_nvml_says_so_in_metrics(tmp_path) -> None:
    """The real nvidia-ml-py on a machine without libnvidia-ml: NVML absent.  Before, /metrics
    said nothing about GPUs at all; now the PCI count stands beside no NVML GPU count."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML: the absent case cannot be shown here")
    except pynvml.NVMLError:
        pass
    sysfs = tmp_path / "sys"
    _pci_tree(sysfs)
    (tmp_path / "a.yaml").write_text("sources:\n  infiniband:\n    expected_ports: 8\n")
    cfg = load_agent_config(tmp_path / "a.yaml", {"sysfs_root": str(sysfs), "nvml": "auto", "listen": "127.0.0.1:0"})
    agent = build_agent(cfg, inline_sources=True)
    try:
        snap = agent.poller.poll_once()
        snap = agent.poller.poll_once()
    finally:
        agent.stop()
    m = _samples(exposition(snap, now=snap.ts))
    assert _value(m, "fabricmon_pci_nvidia_gpus") == 8
    assert _value(m, "fabricmon_devices_discovered", kind="gpu") is None  # NVML absent: no GPU count
    assert _value(m, "fabricmon_gpu_info") is None
    # The RDMA ports the config expects, beside the zero found (no class/infiniband in this tree).
    assert _value(m, "fabricmon_devices_expected", kind="rdma_port") == 8
    assert _value(m, "fabricmon_devices_discovered", kind="ib_port") == 0


# ---------------------------------------------------------------- fatal XIDs

def _nvml_file(path: Path, xids: dict[int, list[int]]) -> None:
    doc = {"gpus": [{"index": i, "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
                     "pci_bus_id": f"00000000:{_H100_BDFS[i][5:]}".upper(), "xid": xids.get(i, []), "links": []}
                    for i in range(8)]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def test_fatal_xid_counter_exists_at_zero_for_every_gpu_and_counts_only_fatal_codes(tmp_path) -> None:
    assert FATAL_XIDS == frozenset(DetectionSettings().xid_fatal)
    nvml = tmp_path / "nvml.json"
    _nvml_file(nvml, {})
    (tmp_path / "empty").mkdir()
    cfg = load_agent_config(None, {"sysfs_root": str(tmp_path / "empty"), "nvml": f"fake:{nvml}",
                                   "listen": "127.0.0.1:0"})
    agent = build_agent(cfg, inline_sources=True)
    try:
        snap = agent.poller.poll_once()
        m = _samples(exposition(snap, now=snap.ts))
        fatal = {dict(labs)["gpu"]: v for (n, labs), v in m.items() if n == "fabricmon_gpu_xid_fatal_errors_total"}
        assert fatal == {str(i): 0.0 for i in range(8)}
        # XID 13 (graphics exception) is not fatal; 79 (fallen off the bus) is, twice on GPU 1.
        _nvml_file(nvml, {1: [13, 79, 79], 4: [13]})
        time.sleep(0.01)
        snap = agent.poller.poll_once()
        m = _samples(exposition(snap, now=snap.ts))
    finally:
        agent.stop()
    fatal = {dict(labs)["gpu"]: v for (n, labs), v in m.items() if n == "fabricmon_gpu_xid_fatal_errors_total"}
    assert fatal == {**{str(i): 0.0 for i in range(8)}, "1": 2.0}
    assert _value(m, "fabricmon_gpu_xid_errors_total", gpu="4", xid="13") == 1.0
