"""Issue #10: the fake NVML file cannot blind the nvml source or push non-finite numbers into the snapshot.

The file is written by the simulator or by whoever can write the fixture
directory; every value in it passes the bounds of ``sources/bounds.py``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.sources.bounds import REASONS, U64_MAX
from fabricmon.sources.inventory import Inventory
from fabricmon.sources.nvml.backend_fake import FakeNvmlBackend
from fabricmon.sources.nvml.source import NvmlSource

REJECTED = "fabricmon_source_values_rejected_total"


def gpu(index: int = 0, **over) -> dict:
    g = {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100", "pci_bus_id": f"0000:{index:02x}:00.0",
         "utilization": 50, "throttle_reasons": 0, "xid": [],
         "links": [{"state": 1, "tx_kib": 10, "rx_kib": 20, "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
                   for _ in range(2)]}
    g.update(over)
    return g


def poll_file(path: Path, polls: int = 1):
    src = NvmlSource(FakeNvmlBackend(path), timeout=5.0)
    poller = Poller("node-000", [src], lambda: Inventory(sysfs_root=""))
    try:
        for _ in range(polls):
            snap = poller.poll_once()
    finally:
        poller.close()
    return snap


def write(path: Path, gpus: list) -> Path:
    path.write_text(json.dumps({"gpus": gpus}))  # json writes NaN/Infinity, and reads them back
    return path


def samples(snap) -> dict[tuple[str, tuple], float]:
    return {(s.family, s.labels): s.value for s in snap.samples}


def status(snap):
    return next(s for s in snap.sources if s.source == "nvml")


def assert_in_bounds(snap) -> None:
    for s in snap.samples:
        assert math.isfinite(s.value), s
        if s.family.endswith("_total"):
            assert 0 <= s.value <= 1024 * U64_MAX, s
        if s.family == "fabricmon_gpu_utilization_ratio":
            assert 0 <= s.value <= 1, s


@pytest.mark.parametrize("field, value, reason", [
    ("tx_kib", float("nan"), "not_finite"),
    ("tx_kib", float("inf"), "not_finite"),  # int(inf) raised OverflowError out of the backend
    ("tx_kib", 1e30, "out_of_range"),  # was exported as 1e33 bytes
    ("replay", -5, "out_of_range"),
    ("crc_flit", 2**70, "out_of_range"),
    ("recovery", "lots", "not_integer"),
])
def test_bad_link_value_costs_only_its_series(tmp_path: Path, field: str, value, reason: str) -> None:
    g = gpu()
    g["links"][1][field] = value
    snap = poll_file(write(tmp_path / "nvml.json", [g, gpu(1)]))
    s = samples(snap)
    assert s[("fabricmon_gpu_up", (("gpu", "0"),))] == 1.0  # the GPU was reported lost for one NaN
    assert s[("fabricmon_nvlink_transmit_bytes_total", (("gpu", "0"), ("link", "0")))] == 10 * 1024
    assert s[(REJECTED, (("collector", "nvml"), ("reason", reason)))] == 1
    assert status(snap).up and status(snap).errors_total == 1
    assert any(f"links[1].{field}" in m for m in status(snap).last_messages)
    assert_in_bounds(snap)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -3, 250])
def test_utilization_outside_0_100_is_refused(tmp_path: Path, value) -> None:
    snap = poll_file(write(tmp_path / "nvml.json", [gpu(utilization=value)]))
    s = samples(snap)
    assert ("fabricmon_gpu_utilization_ratio", (("gpu", "0"),)) not in s  # was exported as NaN
    assert sum(v for (f, _), v in s.items() if f == REJECTED) == 1
    assert_in_bounds(snap)


def test_yaml_nan_in_fake_file(tmp_path: Path) -> None:
    p = tmp_path / "nvml.yaml"
    p.write_text("gpus:\n  - {index: 0, uuid: GPU-0, utilization: .nan, pcie_replay: .inf,"
                 " links: [{state: 1, tx_kib: .nan}]}\n")
    snap = poll_file(p)
    s = samples(snap)
    assert s[("fabricmon_gpu_up", (("gpu", "0"),))] == 1.0
    assert s[(REJECTED, (("collector", "nvml"), ("reason", "not_finite")))] == 3
    assert_in_bounds(snap)


def test_huge_gpu_index_is_refused_not_looped_over(tmp_path: Path) -> None:
    snap_t0 = time.monotonic()
    snap = poll_file(write(tmp_path / "nvml.json", [gpu(0), gpu(10**9)]))
    assert time.monotonic() - snap_t0 < 5.0
    st_ = status(snap)
    assert not st_.up and any("beyond 255" in m for m in st_.last_messages)


def test_too_many_links_and_long_labels_are_bounded(tmp_path: Path) -> None:
    g = gpu(links=[{"state": 1, "tx_kib": 1}] * 1000, name="x" * 10_000)
    snap = poll_file(write(tmp_path / "nvml.json", [g]))
    s = samples(snap)
    links = {dict(lab)["link"] for f, lab in s if f == "fabricmon_nvlink_up"}
    assert len(links) == 64
    assert s[(REJECTED, (("collector", "nvml"), ("reason", "too_long")))] == 2
    assert ("fabricmon_gpu_info", (("gpu", "0"), ("uuid", "GPU-0"), ("name", ""), ("pci_bus_id", "0000:00:00.0"),
                                   ("nvlink_counters", "legacy"))) in s


def test_oversized_fake_file_is_an_error_not_a_read(tmp_path: Path) -> None:
    p = tmp_path / "nvml.json"
    p.write_text(json.dumps({"gpus": [gpu()], "pad": "x" * (17 << 20)}))
    snap = poll_file(p)
    assert not status(snap).up and any("larger than" in m for m in status(snap).last_messages)


def test_devices_discovered_counts_gpus(tmp_path: Path) -> None:
    snap = poll_file(write(tmp_path / "nvml.json", [gpu(0), gpu(1), gpu(2)]))
    assert samples(snap)[("fabricmon_devices_discovered", (("kind", "gpu"),))] == 3


_value = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(), st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=2**20), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(min_value=-5, max_value=100), max_size=2),
)
_link = st.dictionaries(st.sampled_from(["state", "tx_kib", "rx_kib", "replay", "recovery", "crc_flit", "crc_data",
                                         "remote_pci_bus_id"]), _value, max_size=8)
_gpu = st.fixed_dictionaries(
    {"index": st.integers(min_value=0, max_value=3)},
    optional={k: _value for k in ("uuid", "name", "pci_bus_id", "utilization", "throttle_reasons", "xid",
                                  "pcie_replay", "ecc_corrected", "lost")}
    | {"links": st.one_of(_value, st.lists(st.one_of(_link, _value), max_size=4))},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpus=st.lists(_gpu, max_size=3, unique_by=lambda g: g["index"]))
def test_fake_nvml_any_values(tmp_path_factory, gpus) -> None:
    p = tmp_path_factory.mktemp("nvml") / "nvml.json"
    p.write_text(json.dumps({"gpus": gpus}))
    snap = poll_file(p, polls=2)
    assert_in_bounds(snap)
    for fam, lab in samples(snap):
        if fam == REJECTED:
            assert dict(lab)["reason"] in REASONS
    exposition(snap)


def test_refused_values_are_logged_once_per_gpu(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    g = gpu()
    g["links"][0]["tx_kib"] = -1
    g["links"][1]["rx_kib"] = -1
    with capture_logs() as logs:
        poll_file(write(tmp_path / "nvml.json", [g]), polls=3)
    events = [e for e in logs if e["event"] == "source_file_error"]
    assert len(events) == 1 and events[0]["path"] == "gpu 0" and "links[0].tx_kib" in events[0]["error"]
