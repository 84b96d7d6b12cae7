"""NVML source: fake backend on fixture files, lost GPUs, absent NVML, hung calls, and the
real pynvml backend driven through a stub module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.sources.nvml.backend import THROTTLE_REASONS, GpuLost, GpuReading, NvmlLibraryMissing
from fabricmon.sources.nvml.backend_fake import FakeNvmlBackend
from fabricmon.sources.nvml.backend_pynvml import PynvmlBackend
from fabricmon.sources.nvml.source import NvmlSource, make_nvml_source
from support.nvmlstub import StubPynvml, no_inventory, series, source_status, val

FAULT_GPU, FAULT_LINK = 2, 5  # the fixture tool's defaults


FAULTS = ("none", "nvlink_errors", "nvlink_down", "slow_gpu")


def make_nvml_fixture(make_fixture: Any, root: Path, fault: str) -> Path:
    """``nvml.json`` of a fixture node with ``fault``, as a private copy under ``root``.

    ``make_fixture`` (tests/conftest.py) caches trees per session; tests edit
    their copy, never the shared tree.
    """
    make_fixture.prefetch([{"fault": f} for f in FAULTS])
    src = make_fixture(fault=fault) / "nvml.json"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "nvml.json"
    shutil.copyfile(src, path)
    return path


def write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- fake backend on fixtures


@pytest.mark.parametrize("fault", FAULTS)
def test_fake_backend_exposition_matches_file(make_fixture: Any, tmp_path: Path, fault: str) -> None:
    path = make_nvml_fixture(make_fixture, tmp_path / "fx", fault)
    data = json.loads(path.read_text())
    src = NvmlSource(FakeNvmlBackend(path), timeout=2.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        snap = poller.poll_once()
    finally:
        poller.close()
    st = source_status(snap)
    assert st.up and st.present and st.errors_total == 0
    ser = series(snap)
    assert len(data["gpus"]) == 8
    for g in data["gpus"]:
        gpu = str(g["index"])
        assert val(ser, "fabricmon_gpu_up", gpu=gpu) == 1
        assert val(ser, "fabricmon_gpu_info", gpu=gpu, uuid=g["uuid"], name=g["name"],
                   pci_bus_id=g["pci_bus_id"], nvlink_counters="legacy") == 1
        assert val(ser, "fabricmon_gpu_utilization_ratio", gpu=gpu) == pytest.approx(g["utilization"] / 100)
        assert len(g["links"]) == 18
        for j, lk in enumerate(g["links"]):
            link = str(j)
            assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu=gpu, link=link) == lk["tx_kib"] * 1024
            assert val(ser, "fabricmon_nvlink_receive_bytes_total", gpu=gpu, link=link) == lk["rx_kib"] * 1024
            for etype in ("replay", "recovery", "crc_flit", "crc_data"):
                assert val(ser, "fabricmon_nvlink_errors_total", gpu=gpu, link=link, type=etype) == lk[etype]
            down = fault == "nvlink_down" and (g["index"], j) == (FAULT_GPU, FAULT_LINK)
            assert val(ser, "fabricmon_nvlink_up", gpu=gpu, link=link) == (0 if down else 1)
        for reason, _bit in THROTTLE_REASONS:
            expected = 1 if (fault == "slow_gpu" and g["index"] == FAULT_GPU
                             and reason in ("HwThermalSlowdown", "SwThermalSlowdown")) else 0
            assert val(ser, "fabricmon_gpu_throttle_reason", gpu=gpu, reason=reason) == expected

    facts = snap.facts["gpus"]
    assert set(facts) == set(range(8))
    assert facts[FAULT_GPU]["links_down"] == ([FAULT_LINK] if fault == "nvlink_down" else [])
    assert facts[FAULT_GPU]["throttle_reasons"] == (0x60 if fault == "slow_gpu" else 0)
    assert facts[0]["uuid"] == data["gpus"][0]["uuid"]
    if fault == "nvlink_errors":
        lk = data["gpus"][FAULT_GPU]["links"][FAULT_LINK]
        assert lk["replay"] > 0 and lk["crc_flit"] > 0  # the fixture really carries evidence
    # Every NVML family emitted is in the spec table the exporter serves.
    names = {n for n, _ in ser}
    assert {"fabricmon_nvlink_up", "fabricmon_nvlink_errors_total", "fabricmon_gpu_throttle_reason"} <= names


def test_counters_advance_between_polls_and_xids_counted(make_fixture: Any, tmp_path: Path) -> None:
    path = make_nvml_fixture(make_fixture, tmp_path / "fx", "none")
    data = json.loads(path.read_text())
    src = NvmlSource(FakeNvmlBackend(path), timeout=2.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        poller.poll_once()
        data["gpus"][1]["links"][0]["tx_kib"] += 10
        data["gpus"][1]["xid"] = [79, 79, 48]
        data["gpus"][1]["throttle_reasons"] = "0x8"  # hex strings accepted too
        write_atomic(path, data)
        snap = poller.poll_once()
    finally:
        poller.close()
    ser = series(snap)
    assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu="1", link="0") == \
        data["gpus"][1]["links"][0]["tx_kib"] * 1024
    assert val(ser, "fabricmon_gpu_xid_errors_total", gpu="1", xid="79") == 2
    assert val(ser, "fabricmon_gpu_xid_errors_total", gpu="1", xid="48") == 1
    assert val(ser, "fabricmon_gpu_throttle_reason", gpu="1", reason="HwSlowdown") == 1
    tx = next(d for d in snap.deltas if d.family == "fabricmon_nvlink_transmit_bytes_total"
              and dict(d.labels) == {"gpu": "1", "link": "0"})
    assert tx.delta == 10 * 1024


@pytest.mark.parametrize("how", ["marked_lost", "removed"])
def test_lost_gpu_between_polls(make_fixture: Any, tmp_path: Path, how: str) -> None:
    path = make_nvml_fixture(make_fixture, tmp_path / "fx", "none")
    src = NvmlSource(FakeNvmlBackend(path), timeout=2.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        first = poller.poll_once()
        assert val(series(first), "fabricmon_gpu_up", gpu="3") == 1
        data = json.loads(path.read_text())
        if how == "marked_lost":
            data["gpus"][3]["lost"] = True
        else:
            del data["gpus"][3]
        write_atomic(path, data)
        snap = poller.poll_once()
    finally:
        poller.close()
    ser = series(snap)
    assert val(ser, "fabricmon_gpu_up", gpu="3") == 0
    assert not [k for k in ser if k[0] == "fabricmon_nvlink_up" and ("gpu", "3") in k[1]]
    for gpu in ("0", "1", "2", "4", "5", "6", "7"):
        assert val(ser, "fabricmon_gpu_up", gpu=gpu) == 1
        assert val(ser, "fabricmon_nvlink_up", gpu=gpu, link="17") == 1
    st = source_status(snap)
    assert st.up and st.errors_total == 1
    assert "lost" in st.last_messages[-1]
    assert val(ser, "fabricmon_collector_errors_total", collector="nvml") == 1
    assert val(ser, "fabricmon_collector_up", collector="nvml") == 1
    assert snap.facts["gpus"][3] == {"up": False, "lost": True}


def test_fake_backend_errors() -> None:
    with pytest.raises(NvmlLibraryMissing):
        FakeNvmlBackend("does-not-exist/nvml.json").init()


def test_fake_backend_yaml(tmp_path: Path) -> None:
    path = tmp_path / "nvml.yaml"
    path.write_text(
        "gpus:\n"
        "  - {index: 0, uuid: GPU-x, name: H100, pci_bus_id: '00000000:1B:00.0', utilization: 50,\n"
        "     throttle_reasons: 0, xid: [], links: [{state: 1, tx_kib: 1, rx_kib: 2, replay: 0,\n"
        "     recovery: 0, crc_flit: 0, crc_data: 0}]}\n"
    )
    be = FakeNvmlBackend(path)
    be.init()
    be.begin_poll()
    g = be.read_gpu(0)
    assert (g.uuid, g.links[0].tx_kib, g.links[0].rx_kib, g.utilization) == ("GPU-x", 1, 2, 50.0)
    with pytest.raises(GpuLost):
        be.read_gpu(1)


# --------------------------------------------------------------------------- factory and absent NVML


def test_make_nvml_source_modes(tmp_path: Path) -> None:
    from fabricmon.config import AgentConfig, NvmlConfig

    assert make_nvml_source("off") is None
    fake = make_nvml_source(f"fake:{tmp_path / 'nvml.json'}")
    assert isinstance(fake, NvmlSource) and isinstance(fake.backend, FakeNvmlBackend)
    auto = make_nvml_source("auto")
    assert isinstance(auto, NvmlSource) and isinstance(auto.backend, PynvmlBackend)
    assert auto.name == "nvml" and auto.timeout == AgentConfig().sources.nvml.timeout
    assert make_nvml_source("auto", NvmlConfig(timeout=0.7)).timeout == 0.7  # type: ignore[union-attr]


class _NoLibraryStub:
    """pynvml as it behaves without libnvidia-ml.so.1: nvmlInit raises LibraryNotFound."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def __init__(self) -> None:
        self.init_calls = 0

    def nvmlInit(self) -> None:  # pynvml API
        self.init_calls += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_auto_mode_without_library_is_absent() -> None:
    stub = _NoLibraryStub()
    src = NvmlSource(PynvmlBackend(module=stub), timeout=2.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        snaps = [poller.poll_once(), poller.poll_once()]
    finally:
        poller.close()
    for snap in snaps:
        st = source_status(snap)
        assert not st.present and st.errors_total == 0
        ser = series(snap)
        assert not [k for k in ser if ("collector", "nvml") in k[1]]  # absent is not a failing collector
        assert not [k for k in ser if k[0].startswith(("fabricmon_gpu", "fabricmon_nvlink"))]
    assert stub.init_calls == 1  # absent is final: no dlopen attempt every second


def test_auto_mode_without_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # "import pynvml" raises ImportError
    src = NvmlSource(PynvmlBackend(), timeout=2.0)
    try:
        res = src.poll(no_inventory())
    finally:
        src.close()
    assert not res.present and res.errors == 0


def test_real_nvml_here_is_absent_or_works() -> None:
    """The real library on this machine: absent without a driver, readable with one."""
    src = NvmlSource(PynvmlBackend(), timeout=10.0)
    try:
        res = src.poll(no_inventory())
    finally:
        src.close()
    if not res.present:
        return
    assert res.up, res.messages
    ups = [r for r in res.readings if r.family == "fabricmon_gpu_up"]
    assert ups and all(r.value == 1 for r in ups), res.messages


# --------------------------------------------------------------------------- hung backend


class _HungBackend:
    """Hangs in read_gpu until released, like an NVML call on a GPU that fell off the bus."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.read_calls = 0
        self.init_threads: list[str] = []
        self.shutdowns = 0

    def init(self) -> None:
        self.init_threads.append(threading.current_thread().name)

    def shutdown(self) -> None:
        self.shutdowns += 1

    def begin_poll(self) -> None:
        pass

    def device_count(self) -> int:
        return 1

    def read_gpu(self, index: int) -> GpuReading:
        self.read_calls += 1
        self.release.wait(30)
        return GpuReading(index, "GPU-hung", "H100", "00000000:1B:00.0", utilization=10.0)


def test_hung_call_marks_source_down_without_piling_up() -> None:
    be = _HungBackend()
    src = NvmlSource(be, timeout=0.4)
    assert be.init_threads == []  # nothing in the constructor
    poller = Poller("node-000", [src], no_inventory)
    try:
        t0 = time.monotonic()
        first = poller.poll_once()
        assert time.monotonic() - t0 < 2.0
        assert not source_status(first).up
        assert be.init_threads == ["nvml"]  # lazily, on the NVML worker thread
        second = poller.poll_once()
        st = source_status(second)
        assert not st.up and be.read_calls == 1  # no second call behind the hung one
        assert "still running" in st.last_messages[-1]
        assert val(series(second), "fabricmon_collector_up", collector="nvml") == 0

        be.release.set()  # the call returns: the next poll works again
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and src._inflight is not None and not src._inflight.done():
            time.sleep(0.01)
        third = poller.poll_once()
        assert source_status(third).up
        assert val(series(third), "fabricmon_gpu_up", gpu="0") == 1
    finally:
        be.release.set()
        poller.close()


def test_close_does_not_wait_on_hung_call() -> None:
    be = _HungBackend()
    src = NvmlSource(be, timeout=0.2)
    res = src.poll(no_inventory())
    assert not res.up
    t0 = time.monotonic()
    src.close()
    assert time.monotonic() - t0 < 0.1
    assert be.shutdowns == 0  # the hung call still holds NVML
    be.release.set()
    deadline = time.monotonic() + 5
    while be.shutdowns == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert be.shutdowns == 1  # shut down once the call came back
    assert not src.poll(no_inventory()).up  # closed: no NVML call any more
    assert be.read_calls == 1


# --------------------------------------------------------------------------- real backend, stub module


def test_pynvml_backend_with_stub_module() -> None:
    nv = StubPynvml()
    src = NvmlSource(PynvmlBackend(module=nv), timeout=5.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        nv.pending_xids = [(0, 79), (0, 79), (1, 48)]
        first = poller.poll_once()
        assert sorted(g for g, _ in nv.field_calls) == [0, 0, 1, 1]  # link count once, then the batch
        nv.field_calls.clear()
        counter_calls = nv.calls["nvmlDeviceGetNvLinkErrorCounter"]
        remote_calls = nv.calls["nvmlDeviceGetNvLinkRemotePciInfo"]
        nv.pending_xids = [(0, 79)]
        snap = poller.poll_once()
    finally:
        poller.close()
    assert source_status(first).up and source_status(first).errors_total == 0
    st = source_status(snap)
    assert st.up and st.errors_total == 0, st.last_messages

    # Exactly ONE GetFieldValues per GPU per poll, batching TX/RX with scopeId=link.
    assert [g for g, _ in nv.field_calls] == [0, 1]
    batch = nv.field_calls[0][1]
    for link in range(nv.links):
        assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) in batch
        assert (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) in batch
    assert pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L11 in batch
    # CRC-data fields answered NotSupported once: no longer asked in the batch,
    # and the per-link call (also NotSupported) is not retried either.
    assert pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 not in batch
    assert nv.calls["nvmlDeviceGetNvLinkErrorCounter"] - counter_calls == 2 * 2 * 3  # links 12,13 x 3 kinds
    assert nv.calls["nvmlDeviceGetNvLinkRemotePciInfo"] == remote_calls  # static: read once
    assert nv.registered == [0, 1]

    ser = series(snap)
    for gpu in (0, 1):
        g = str(gpu)
        assert val(ser, "fabricmon_gpu_info", gpu=g, uuid=f"GPU-stub-{gpu}", name="NVIDIA H100 80GB HBM3",
                   pci_bus_id=f"00000000:{0x1B + gpu:02X}:00.0", nvlink_counters="legacy") == 1
        assert val(ser, "fabricmon_nvlink_nvml_path", gpu=g, counters="traffic", path="throughput_fields") == 1
        assert val(ser, "fabricmon_nvlink_nvml_path", gpu=g, counters="errors", path="legacy") == 1
        assert val(ser, "fabricmon_nvlink_nvml_path", gpu=g, counters="errors", path="none") == 0
        assert val(ser, "fabricmon_gpu_utilization_ratio", gpu=g) == pytest.approx((40 + gpu) / 100)
        assert val(ser, "fabricmon_gpu_pcie_replay_total", gpu=g) == 3 + gpu
        assert val(ser, "fabricmon_gpu_ecc_errors_total", gpu=g, type="corrected") == 7 + gpu
        assert ("fabricmon_gpu_ecc_errors_total", frozenset({("gpu", g), ("type", "uncorrected")})) not in ser
        for link in range(nv.links):
            lk = str(link)
            assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu=g, link=lk) == \
                (1_000_000 * (gpu + 1) + link) * 1024
            assert val(ser, "fabricmon_nvlink_receive_bytes_total", gpu=g, link=lk) == \
                (2_000_000 * (gpu + 1) + link) * 1024
            for etype, kind in (("replay", "REPLAY"), ("recovery", "RECOVERY"), ("crc_flit", "CRC_FLIT")):
                assert val(ser, "fabricmon_nvlink_errors_total", gpu=g, link=lk, type=etype) == \
                    StubPynvml.err_value(gpu, link, kind)
            key = ("fabricmon_nvlink_errors_total", frozenset({("gpu", g), ("link", lk), ("type", "crc_data")}))
            assert key not in ser  # NotSupported: series skipped, not an error
            down = (gpu, link) == (1, 3)
            assert val(ser, "fabricmon_nvlink_up", gpu=g, link=lk) == (0 if down else 1)
            remote = [k for k in ser if k[0] == "fabricmon_nvlink_remote_info"
                      and ("gpu", g) in k[1] and ("link", lk) in k[1]]
            assert len(remote) == (0 if down else 1)
    assert val(ser, "fabricmon_gpu_xid_errors_total", gpu="0", xid="79") == 3
    assert val(ser, "fabricmon_gpu_xid_errors_total", gpu="1", xid="48") == 1
    assert val(ser, "fabricmon_gpu_throttle_reason", gpu="1", reason="HwThermalSlowdown") == 1
    assert val(ser, "fabricmon_gpu_throttle_reason", gpu="0", reason="HwThermalSlowdown") == 0
    assert snap.facts["gpus"][1]["links_down"] == [3]
    # poller.close() only queues the shutdown on the NVML thread: wait for it, with a deadline.
    assert src.close(wait=10.0), "NVML shutdown did not run within 10 s of close()"
    assert nv.calls["nvmlShutdown"] == 1 and nv.calls["nvmlEventSetFree"] == 1


def test_pynvml_backend_maps_gpu_is_lost() -> None:
    nv = StubPynvml()
    be = PynvmlBackend(module=nv)
    be.init()
    be.begin_poll()
    assert be.read_gpu(1).index == 1
    nv.lost.add(1)
    with pytest.raises(GpuLost) as info:
        be.read_gpu(1)
    assert info.value.index == 1
    assert be.read_gpu(0).index == 0  # the other GPU is unaffected
    be.shutdown()


def test_pynvml_backend_lost_gpu_in_source() -> None:
    nv = StubPynvml()
    src = NvmlSource(PynvmlBackend(module=nv), timeout=5.0)
    try:
        src.poll(no_inventory())
        nv.lost.add(0)
        res = src.poll(no_inventory())
    finally:
        src.close()
    assert res.up and res.errors == 1 and "lost" in res.messages[0]
    ups = {dict(r.labels)["gpu"]: r.value for r in res.readings if r.family == "fabricmon_gpu_up"}
    assert ups == {"0": 0.0, "1": 1.0}


def test_exposition_passes_promtool(make_fixture: Any, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (CI installs the Debian package prometheus)")
    path = make_nvml_fixture(make_fixture, tmp_path / "fx", "nvlink_errors")
    data = json.loads(path.read_text())
    data["gpus"][0]["xid"] = [79]
    data["gpus"][0]["ecc"] = {"corrected": 4, "uncorrected": 0}
    data["gpus"][0]["pcie_replay"] = 2
    data["gpus"][0]["links"][0]["remote_pci_bus_id"] = "00000000:C0:00.0"
    write_atomic(path, data)
    poller = Poller("node-000", [NvmlSource(FakeNvmlBackend(path))], no_inventory)
    try:
        text = exposition(poller.poll_once())
    finally:
        poller.close()
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    for name in (b"fabricmon_gpu_xid_errors_total{", b"fabricmon_gpu_ecc_errors_total{",
                 b"fabricmon_gpu_pcie_replay_total{", b"fabricmon_nvlink_remote_info{"):
        assert name in text


def test_pynvml_backend_old_driver_and_no_event_permission() -> None:
    """A driver without ClocksEventReasons falls back to ClocksThrottleReasons; XID
    registration refused (not root) costs the XID series only."""
    nv = StubPynvml(gpus=1, links=2)

    def no_symbol(h: int) -> int:
        nv.calls["events"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def throttle(h: int) -> int:
        return 0x40

    def refuse(h: int, types: int, es: str) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    nv.nvmlDeviceGetCurrentClocksEventReasons = no_symbol  # type: ignore[method-assign]
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = throttle  # type: ignore[attr-defined]
    nv.nvmlDeviceRegisterEvents = refuse  # type: ignore[method-assign]
    be = PynvmlBackend(module=nv)
    be.init()
    for _ in range(2):
        be.begin_poll()
        g = be.read_gpu(0)
    assert g.throttle_reasons == 0x40 and not g.problems
    assert nv.calls["events"] == 1  # not asked again once known missing
    assert g.xid_counts == {} and len(g.links) == 2 and g.links[0].tx_kib == 1_000_000
    be.shutdown()
