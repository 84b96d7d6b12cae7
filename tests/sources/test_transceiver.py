"""Module readings parsed from SFF-8636 and CMIS images built byte by byte from the specifications."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricmon.sources.transceiver import (
    ModuleFormatError,
    ModuleReader,
    parse_module,
    read_module_file,
    watts_to_dbm,
)
from support.paths import FIXTURES

FIX = str(FIXTURES / "transceiver")


def _load(name: str) -> bytes:
    with open(os.path.join(FIX, name), "rb") as f:
        return f.read()


def test_committed_images_equal_the_generator():
    spec = importlib.util.spec_from_file_location("make_images", os.path.join(FIX, "make_images.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, fn in mod.IMAGES.items():
        assert _load(name) == fn(), name


def test_sff8636_qsfp28_readings_and_flags():
    m = parse_module(_load("qsfp28_sff8636.bin"))
    assert m.spec == "sff8636" and m.identifier == 0x11
    assert m.temperature_c == pytest.approx(46.5)
    assert m.vcc_v == pytest.approx(3.3)
    assert len(m.lanes) == 4
    assert [ln.rx_power_w for ln in m.lanes] == pytest.approx([780e-6, 95.3e-6, 12e-6, 800e-6])
    assert [ln.tx_power_w for ln in m.lanes] == pytest.approx([810e-6, 800e-6, 790e-6, 805e-6])
    assert [ln.tx_bias_a for ln in m.lanes] == pytest.approx([7.5e-3, 7.6e-3, 7.4e-3, 7.5e-3])
    assert m.flags == ("temperature_high_warning",)
    assert m.lanes[0].flags == ()
    assert m.lanes[1].flags == ("tx_los", "rx_power_low_warning")
    assert m.lanes[2].flags == ("rx_los", "rx_power_low_alarm")
    assert m.alarm_count() == 3
    assert watts_to_dbm(m.lanes[0].rx_power_w) == pytest.approx(-1.079, abs=1e-3)


def test_sff8636_negative_temperature():
    m = parse_module(_load("qsfp28_negative_temp.bin"))
    assert m.temperature_c == pytest.approx(-5.5)
    assert set(m.flags) == {"temperature_low_alarm", "temperature_low_warning"}


def test_cmis_osfp_lanes_from_page_11h():
    m = parse_module(_load("osfp_cmis.bin"))
    assert m.spec == "cmis" and m.identifier == 0x19
    assert m.temperature_c == pytest.approx(61.25)
    assert m.vcc_v == pytest.approx(3.25)
    assert set(m.flags) == {"temperature_high_warning", "vcc_low_alarm"}
    assert len(m.lanes) == 8
    rx = [ln.rx_power_w for ln in m.lanes]
    assert rx == pytest.approx([1200e-6, 1150e-6, 140e-6, 1180e-6, 1210e-6, 1190e-6, 1175e-6, 0.0])
    assert m.lanes[4].tx_power_w == pytest.approx(300e-6)
    # bias multiplier x2 from page 01h byte 160
    assert [ln.tx_bias_a for ln in m.lanes] == pytest.approx([(40.0 + i) * 1e-3 for i in range(8)])
    assert m.lanes[7].flags == ("rx_los", "rx_power_low_alarm")
    assert m.lanes[2].flags == ("rx_power_low_warning",)
    assert m.lanes[4].flags == ("tx_power_low_warning",)
    assert watts_to_dbm(m.lanes[7].rx_power_w) is None


def test_cmis_flat_memory_has_no_lanes():
    m = parse_module(_load("qsfpdd_cmis_flat.bin"))
    assert m.spec == "cmis" and m.lanes == ()
    assert m.temperature_c == pytest.approx(30.0)


def test_cmis_truncated_to_the_ioctl_256_bytes_keeps_module_readings():
    m = parse_module(_load("osfp_cmis.bin")[:256])
    assert m.lanes == () and m.temperature_c == pytest.approx(61.25)


def test_unknown_identifier_and_short_image_are_errors():
    with pytest.raises(ModuleFormatError, match="identifier 0x03"):
        parse_module(bytes([0x03]) + bytes(255))
    with pytest.raises(ModuleFormatError, match="128 bytes"):
        parse_module(bytes([0x11]) + bytes(10))
    with pytest.raises(ModuleFormatError, match="empty"):
        parse_module(b"")


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=900))
def test_any_bytes_parse_or_raise_the_format_error(data):
    try:
        m = parse_module(data)
    except ModuleFormatError:
        return
    for ln in m.lanes:
        assert 0 <= ln.rx_power_w <= 6.5536e-3 + 1e-12


def test_reader_keeps_going_past_a_bad_module(tmp_path):
    (tmp_path / "eth0.module.bin").write_bytes(_load("qsfp28_sff8636.bin"))
    (tmp_path / "eth1.module.bin").write_bytes(b"\x03" * 256)
    reader = ModuleReader(lambda: ["eth0", "eth1", "eth2"], lambda i: read_module_file(str(tmp_path), i),
                          interval_s=60.0, clock=lambda: 123.0)
    snap = reader.read_once()
    assert snap.taken_at == 123.0
    assert set(snap.readings) == {"eth0"}
    assert "eth1" in snap.errors and "eth2" not in snap.errors
    assert reader.snapshot() is snap


def test_reader_thread_publishes_a_snapshot_and_stops(tmp_path):
    (tmp_path / "eth0.module.bin").write_bytes(_load("osfp_cmis.bin"))
    reader = ModuleReader(lambda: ["eth0"], lambda i: read_module_file(str(tmp_path), i), interval_s=30.0)
    reader.start()
    try:
        import time
        deadline = time.monotonic() + 10
        while "eth0" not in reader.snapshot().readings and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reader.snapshot().readings["eth0"].spec == "cmis"
    finally:
        reader.stop()


def test_agent_source_serves_module_gauges_from_fixture_files(tmp_path):
    from fabricmon.metrics import SPECS
    from fabricmon.sources.inventory import Inventory, PortInfo
    from fabricmon.sources.transceiver import TransceiverSource

    (tmp_path / "eth0.module.bin").write_bytes(_load("qsfp28_sff8636.bin"))
    (tmp_path / "eth1.module.bin").write_bytes(b"\x03" * 300)
    ports = tuple(PortInfo(dev, "1", "", "Ethernet", nd, "0") for dev, nd in
                  (("mlx5_0", "eth0"), ("mlx5_1", "eth1"), ("mlx5_2", "eth2")))
    src = TransceiverSource(ethtool_dir=str(tmp_path), clock=lambda: 5.0)
    res = src.poll(Inventory(str(tmp_path), (), ports))
    got = {(r.family, r.labels): r.value for r in res.readings}
    dp = (("device", "mlx5_0"), ("port", "1"))
    assert got[("fabricmon_transceiver_temperature_celsius", dp)] == 46.5
    assert got[("fabricmon_transceiver_rx_power_watts", dp + (("lane", "1"),))] == pytest.approx(95.3e-6)
    assert got[("fabricmon_transceiver_flag", dp + (("lane", "2"), ("flag", "rx_los")))] == 1.0
    assert got[("fabricmon_transceiver_flag", dp + (("lane", ""), ("flag", "temperature_high_warning")))] == 1.0
    assert not any(lab[0][1] != "mlx5_0" for _, lab in got)
    assert res.errors == 1 and res.messages[0].startswith("eth1: module:")  # a bad module costs only itself
    for fam, labels in got:
        assert tuple(k for k, _ in labels) == SPECS[fam].labels, fam


def test_module_ioctl_on_a_real_netdev_without_a_module():
    """The real SIOCETHTOOL path: loopback has no pluggable module, so the kernel answers EOPNOTSUPP
    (EPERM without CAP_NET_ADMIN); either way one clean EthtoolError, never a crash."""
    import errno

    from fabricmon.sources.ethtool import EthtoolError
    from fabricmon.sources.transceiver import ModuleEepromIoctl

    io = ModuleEepromIoctl()
    try:
        with pytest.raises(EthtoolError) as ei:
            io.read("lo")
        assert ei.value.errno in (errno.EOPNOTSUPP, errno.EPERM, errno.EINVAL)
        assert ei.value.op == "GMODULEINFO"
    finally:
        io.close()


def test_a_stuck_module_read_never_blocks_the_poll():
    import threading

    from fabricmon.sources.inventory import Inventory, PortInfo
    from fabricmon.sources.transceiver import TransceiverSource

    release = threading.Event()
    entered = threading.Event()

    class StuckIoctl:
        def read(self, ifname):
            entered.set()
            release.wait(30)
            return _load("qsfp28_sff8636.bin")

        def close(self):
            pass

    src = TransceiverSource(ioctl=StuckIoctl())
    inv = Inventory("", (), (PortInfo("mlx5_0", "1", "", "Ethernet", "eth0", "0"),))
    try:
        src.poll(inv)  # starts the reader thread
        assert entered.wait(10)  # the reader is now stuck inside the module read
        done = threading.Event()
        result = []
        t = threading.Thread(target=lambda: (result.append(src.poll(inv)), done.set()), daemon=True)
        t.start()
        assert done.wait(10), "poll blocked behind a stuck module read"
        assert result[0].readings == [] and result[0].errors == 0  # nothing read yet: no stale values
    finally:
        release.set()
        src.close()
