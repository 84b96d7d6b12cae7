"""Issue #10: no input file can blind the agent or push an out-of-range number into its snapshot.

Every parser that takes a number from outside (sysfs counter text, port
state and rate lines, ``ethtool -S`` text, the SIOCETHTOOL buffers, the fake
NVML file) is driven with arbitrary input: the result is a value within its
declared bounds or a counted rejection, never an exception and never a
non-finite or out-of-width number in the snapshot.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.model import Semantics
from fabricmon.sources import bounds
from fabricmon.sources.bounds import U64_MAX, RejectCounts, Rejected
from fabricmon.sources.errorlog import ErrorLog
from fabricmon.sources.infiniband import InfinibandSource, parse_counter, parse_phys_state, parse_rate, parse_state
from fabricmon.sources.inventory import discover

REJECTED = "fabricmon_source_values_rejected_total"
REASONS = set(bounds.REASONS)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# --------------------------------------------------------------------------- a small sysfs tree


def make_port(root: Path, dev: str = "mlx5_0", port: str = "1", counters: dict[str, bytes] | None = None,
              hw: dict[str, bytes] | None = None, attrs: dict[str, bytes] | None = None) -> Path:
    d = root / "class" / "infiniband" / dev
    p = d / "ports" / port
    (p / "counters").mkdir(parents=True)
    (p / "hw_counters").mkdir()
    (d / "hca_type").write_text("MT4129\n")
    base = {"state": b"4: ACTIVE\n", "phys_state": b"5: LinkUp\n", "rate": b"400 Gb/sec (4X NDR)\n",
            "link_layer": b"InfiniBand\n"}
    base.update(attrs or {})
    for name, data in base.items():
        (p / name).write_bytes(data)
    for name, data in (counters or {"port_xmit_data": b"100\n"}).items():
        (p / "counters" / name).write_bytes(data)
    for name, data in (hw or {}).items():
        (p / "hw_counters" / name).write_bytes(data)
    return p


def poll_tree(root: Path, source: InfinibandSource | None = None, polls: int = 1):
    src = source or InfinibandSource(timeout=5.0)
    poller = Poller("node-000", [src], lambda: discover(str(root)), inline_all=True)
    try:
        for _ in range(polls):
            snap = poller.poll_once()
    finally:
        poller.close()
    return snap


def samples(snap) -> dict[tuple[str, tuple], float]:
    return {(s.family, s.labels): s.value for s in snap.samples}


def assert_snapshot_in_bounds(snap) -> None:
    for s in snap.samples:
        assert isinstance(s.value, (int, float)) and math.isfinite(s.value), s
        if s.family.endswith("_total"):
            # x4 for 4-octet data words is the largest scale a counter carries.
            assert 0 <= s.value <= 4 * U64_MAX * 1.0000001, s


# --------------------------------------------------------------------------- case 4: sysfs counters


def test_ten_megabyte_counter_file_is_rejected_not_exported(tmp_path: Path) -> None:
    port = make_port(tmp_path, counters={"port_xmit_data": b"7" * (10 * 1024 * 1024), "port_rcv_data": b"5\n"})
    snap = poll_tree(tmp_path)
    s = samples(snap)
    dp = (("device", "mlx5_0"), ("port", "1"))
    assert ("fabricmon_ib_port_transmit_bytes_total", dp) not in s  # was 3.1e128
    assert s[("fabricmon_ib_port_receive_bytes_total", dp)] == 20.0  # the rest of the port still counts
    assert s[(REJECTED, (("collector", "infiniband"), ("reason", "too_long")))] == 1.0
    (st_ib,) = [x for x in snap.sources if x.source == "infiniband"]
    assert st_ib.errors_total == 1
    assert any("counters/port_xmit_data" in m and "too_long" in m for m in st_ib.last_messages)
    assert os.path.getsize(port / "counters" / "port_xmit_data") == 10 * 1024 * 1024
    assert_snapshot_in_bounds(snap)


@pytest.mark.parametrize("name, text, reason", [
    ("port_xmit_data", str(2**70), "too_long"),  # 22 digits: refused before any conversion
    ("port_rcv_data", str(2**64), "out_of_range"),  # 20 digits, one past u64
    ("symbol_error", "70000", "out_of_range"),  # a 16-bit PMA error counter cannot hold this
    ("link_downed", "256", "out_of_range"),  # 8 bits
    ("port_rcv_packets", "-5", "not_integer"),
    ("port_xmit_packets", "1e38", "not_integer"),
    ("port_xmit_wait", "N/A (no PMA)", "not_integer"),
])
def test_counter_beyond_its_width_is_rejected_with_a_reason(tmp_path: Path, name: str, text: str, reason: str) -> None:
    make_port(tmp_path, counters={name: text.encode() + b"\n", "port_rcv_errors": b"3\n"})
    snap = poll_tree(tmp_path, polls=2)
    s = samples(snap)
    assert s[(REJECTED, (("collector", "infiniband"), ("reason", reason)))] == 2.0  # counted per poll
    assert not any(dict(lab).get("counter") == name or fam.endswith(name) for fam, lab in s)
    assert s[("fabricmon_ib_port_errors_total",
              (("device", "mlx5_0"), ("port", "1"), ("counter", "port_rcv_errors")))] == 3
    assert_snapshot_in_bounds(snap)


def test_widest_legal_values_still_pass(tmp_path: Path) -> None:
    make_port(tmp_path, counters={"port_rcv_data": str(U64_MAX).encode(), "symbol_error": b"65535\n"},
              hw={"out_of_sequence": str(2**32 - 1).encode()})
    snap = poll_tree(tmp_path)
    s = samples(snap)
    assert s[("fabricmon_ib_port_receive_bytes_total", (("device", "mlx5_0"), ("port", "1")))] == 4.0 * U64_MAX
    assert not any(fam == REJECTED for fam, _ in s)


def test_garbled_rate_and_state_are_counted_rejections(tmp_path: Path) -> None:
    make_port(tmp_path, attrs={"rate": b"9" * 40 + b" Gb/sec (4X NDR)\n", "state": b"9999: ACTIVE\n"})
    snap = poll_tree(tmp_path)
    s = samples(snap)
    dp = (("device", "mlx5_0"), ("port", "1"))
    assert ("fabricmon_ib_port_rate_bytes_per_second", dp) not in s
    assert ("fabricmon_ib_port_state", dp) not in s
    assert s[(REJECTED, (("collector", "infiniband"), ("reason", "out_of_range")))] == 2.0
    assert s[("fabricmon_ib_port_physical_state", dp)] == 5


# --------------------------------------------------------------------------- pure parsers, fuzzed


@FUZZ
@given(st.binary(max_size=64))
def test_parse_counter_any_bytes(data: bytes) -> None:
    for width in (4, 8, 16, 32, 64):
        try:
            v = parse_counter(data, width)
        except Rejected as exc:
            assert exc.reason in REASONS
        else:
            assert isinstance(v, int) and 0 <= v < (1 << width)


@FUZZ
@given(st.integers(min_value=-(2**80), max_value=2**80), st.sampled_from([4, 8, 16, 32, 64]))
def test_parse_counter_integers_exact_within_width(n: int, width: int) -> None:
    try:
        v = parse_counter(f"{n}\n".encode(), width)
    except Rejected as exc:
        assert not 0 <= n < (1 << width), n
        assert exc.reason in ("out_of_range", "not_integer", "too_long")
    else:
        assert v == n and 0 <= n < (1 << width)


@FUZZ
@given(st.one_of(st.text(max_size=60), st.from_regex(r"\d{1,30}(\.\d{1,10})? Gb/sec \(\d{1,4}X( [A-Z]{3,5})?\)",
                                                      fullmatch=True)))
def test_parse_rate_any_text(text: str) -> None:
    try:
        r = parse_rate(text)
    except ValueError as exc:
        assert isinstance(exc, Rejected) and exc.reason in REASONS
    else:
        assert math.isfinite(r.bytes_per_second) and 0 <= r.gbps <= 10_000
        assert r.width_lanes in (1, 2, 4, 8, 12)


@FUZZ
@given(st.one_of(st.text(max_size=40), st.from_regex(r"\d{1,12}: [A-Za-z ]{0,12}", fullmatch=True)))
def test_parse_state_any_text(text: str) -> None:
    for parse in (parse_state, parse_phys_state):
        try:
            sid, _ = parse(text)
        except ValueError as exc:
            assert isinstance(exc, Rejected) and exc.reason in REASONS
        else:
            assert 0 <= sid <= 255


_json_like = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**100), max_value=2**100) | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(_json_like, st.sampled_from([8, 32, 64]))
def test_counter_value_any_parsed_value(value: object, width: int) -> None:
    try:
        v = bounds.counter_value(value, width)
    except Rejected as exc:
        assert exc.reason in REASONS
    else:
        assert type(v) is int and 0 <= v < (1 << width)


@FUZZ
@given(_json_like)
def test_check_gauge_any_parsed_value(value: object) -> None:
    try:
        v = bounds.check_gauge(value, 0.0, 100.0)
    except Rejected as exc:
        assert exc.reason in REASONS
    else:
        assert math.isfinite(v) and 0.0 <= v <= 100.0


def test_read_bounded_reads_at_most_limit_plus_one(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert bounds.read_bounded(str(p), 100) == b"x" * 100
    with pytest.raises(Rejected) as exc:
        bounds.read_bounded(str(p), 99)
    assert exc.value.reason == "too_long"


def test_reject_counts_readings_are_reused_until_something_new() -> None:
    rc = RejectCounts("x")
    assert rc.readings() == ()
    rc.add("too_long")
    first = rc.readings()
    assert rc.readings() is first and first[0].semantics is Semantics.MONOTONIC
    rc.add("too_long")
    assert rc.readings() is not first and rc.readings()[0].value == 2


# --------------------------------------------------------------------------- whole source, fuzzed

_counter_bytes = st.one_of(
    st.binary(max_size=40),
    st.integers(min_value=0, max_value=2**90).map(lambda n: f"{n}\n".encode()),
    st.sampled_from([b"", b"\0\0\0", b"18446744073709551615\n", b"18446744073709551616\n", b"nan\n", b"inf\n"]),
)
_names = st.sampled_from(["port_xmit_data", "port_rcv_data", "symbol_error", "link_downed",
                          "local_link_integrity_errors", "port_xmit_wait", "VL15_dropped", "unknown_counter"])
_hw_names = st.sampled_from(["out_of_sequence", "np_cnp_sent", "lifespan", "rx_icrc_encapsulated", "mystery"])


@FUZZ
@given(counters=st.dictionaries(_names, _counter_bytes, min_size=1, max_size=5),
       hw=st.dictionaries(_hw_names, _counter_bytes, max_size=4),
       rate=st.one_of(st.binary(max_size=40), st.just(b"400 Gb/sec (4X NDR)")),
       state=st.one_of(st.binary(max_size=20), st.just(b"4: ACTIVE")))
def test_infiniband_source_any_file_content(tmp_path_factory, counters, hw, rate, state) -> None:
    root = tmp_path_factory.mktemp("ib")
    make_port(root, counters=counters, hw=hw, attrs={"rate": rate, "state": state})
    src = InfinibandSource(timeout=5.0)
    snap = poll_tree(root, src, polls=2)
    assert_snapshot_in_bounds(snap)
    (st_ib,) = [x for x in snap.sources if x.source == "infiniband"]
    assert st_ib.up  # bad files cost their own series, never the source
    rejected = sum(v for (fam, _), v in samples(snap).items() if fam == REJECTED)
    assert rejected <= st_ib.errors_total  # every rejection is also an error
    exposition(snap)  # renders


# --------------------------------------------------------------------------- case 8: which file failed


class _Capture:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def warning(self, event: str, **kw) -> None:
        self.events.append({"event": event, **kw})


def test_first_failing_file_is_logged_with_its_path_then_rate_limited(tmp_path: Path) -> None:
    port = make_port(tmp_path, counters={"port_xmit_data": b"garbage\n", "symbol_error": b"1\n"})
    now = [1000.0]
    cap = _Capture()
    src = InfinibandSource(timeout=5.0)
    src._errlog = ErrorLog("infiniband", every=300.0, clock=lambda: now[0], logger=cap)
    poller = Poller("n", [src], lambda: discover(str(tmp_path)), inline_all=True)
    try:
        for _ in range(5):
            poller.poll_once()
        assert [e["path"] for e in cap.events] == [str(port / "counters" / "port_xmit_data")]
        assert "not an integer" in cap.events[0]["error"] and cap.events[0]["collector"] == "infiniband"
        now[0] += 301
        poller.poll_once()
    finally:
        poller.close()
    assert len(cap.events) == 2 and cap.events[1]["suppressed_since_last"] == 4


def test_error_log_remembers_a_bounded_number_of_files() -> None:
    cap = _Capture()
    el = ErrorLog("x", every=60.0, max_subjects=10, clock=lambda: 0.0, logger=cap)
    el.report([f"f{i}: boom" for i in range(1000)])
    assert len(cap.events) == 10 and len(el._seen) == 10


def test_error_log_goes_through_structlog() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        ErrorLog("ethtool").report(["eth9: bad dump"])
    assert logs == [{"event": "source_file_error", "log_level": "warning", "collector": "ethtool", "path": "eth9",
                     "error": "bad dump", "suppressed_since_last": 0}]


# --------------------------------------------------------------------------- case 9: empty or wrong sysfs root


def test_wrong_sysfs_root_is_visible_in_metrics_and_inventory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    inv = discover(str(tmp_path / "empty"), expected_ports=1)
    assert "does not exist (is the sysfs root right?)" in inv.expected_but_missing
    assert discover(str(tmp_path / "empty")).expected_but_missing == ""  # nothing expected: nothing missing
    cap = _Capture()
    src = InfinibandSource(timeout=5.0)
    src._missing_log = ErrorLog("infiniband", every=600.0, clock=lambda: 0.0, logger=cap, event="missing")
    poller = Poller("n", [src], lambda: discover(str(tmp_path / "empty"), expected_ports=1), inline_all=True)
    try:
        for _ in range(3):
            snap = poller.poll_once()
    finally:
        poller.close()
    s = samples(snap)
    for kind in ("rdma_device", "ib_port", "roce_port", "roce_netdev"):
        assert s[("fabricmon_devices_discovered", (("kind", kind),))] == 0
    assert len(cap.events) == 1 and "expected at least 1 RDMA port(s), found 0" in cap.events[0]["error"]
    assert cap.events[0]["path"] == str(tmp_path / "empty") and cap.events[0]["event"] == "missing"


def test_devices_discovered_counts_a_real_tree(tmp_path: Path) -> None:
    make_port(tmp_path, dev="mlx5_0")
    make_port(tmp_path, dev="mlx5_1")
    inv = discover(str(tmp_path), expected_ports=3)
    assert inv.discovered_counts() == {"rdma_device": 2, "ib_port": 2, "roce_port": 0, "roce_netdev": 0}
    assert "expected at least 3 RDMA port(s), found 2: 2 RDMA device(s)" in inv.expected_but_missing
    assert discover(str(tmp_path), expected_ports=2).expected_but_missing == ""


def test_agent_config_expectation_reaches_discovery(tmp_path: Path) -> None:
    from fabricmon.agent.runtime import make_discover
    from fabricmon.config import load_agent_config

    cfg = load_agent_config(None, {"sysfs_root": str(tmp_path)})
    assert make_discover(cfg)().expected_but_missing  # infiniband enabled: at least one port expected
    (tmp_path / "a.yaml").write_text("sources:\n  infiniband:\n    expected_ports: 0\n")
    cfg = load_agent_config(tmp_path / "a.yaml", {"sysfs_root": str(tmp_path)})
    assert make_discover(cfg)().expected_but_missing == ""


# --------------------------------------------------------------------------- ethtool, fuzzed

from fabricmon.sources import ethtool as eth  # noqa: E402

_stat_line = st.tuples(
    st.one_of(st.sampled_from(["rx_prio3_pause", "tx_prio3_pause_duration", "rx_discards_phy", "rx_bits_phy",
                               "outbound_pci_stalled_rd", "tx_pause_storm_error_events", "x" * 80]),
              st.text(max_size=12)),
    st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str), st.text(max_size=12),
              st.sampled_from(["1e38", "nan", "inf", "18446744073709551615", "18446744073709551616", "0x10"])),
).map(lambda t: f"     {t[0]}: {t[1]}")


@FUZZ
@given(st.one_of(st.lists(_stat_line, max_size=20).map("\n".join), st.text(max_size=300)))
def test_parse_ethtool_dump_any_text(text: str) -> None:
    dump = eth.parse_ethtool_dump(text)
    names = [n for n, _ in dump.stats]
    assert len(names) == len(set(names))
    for name, v in dump.stats:
        assert type(v) is int and 0 <= v <= U64_MAX and len(name) <= eth.MAX_NAME_LEN
    for _, rej in dump.rejected:
        assert rej.reason in REASONS


@FUZZ
@given(st.binary(max_size=600), st.integers(min_value=0, max_value=40))
def test_parse_gstats_and_gstrings_any_buffer(raw: bytes, room: int) -> None:
    try:
        values = eth.parse_gstats(raw, room)
    except Rejected as exc:
        assert exc.reason == "too_long"
    else:
        assert len(values) <= room and all(0 <= v <= U64_MAX for v in values)
    try:
        names = eth.parse_gstrings(raw, room)
    except Rejected as exc:
        assert exc.reason == "too_long"
    else:
        assert len(names) <= room and all(len(n) < eth.ETH_GSTRING_LEN for n in names)


def test_gstats_round_trip() -> None:
    import struct

    vals = [0, 1, U64_MAX]
    raw = struct.pack("=II3Q", eth.ETHTOOL_GSTATS, 3, *vals) + b"\0" * 16
    assert eth.parse_gstats(raw, 5) == vals
    with pytest.raises(Rejected):
        eth.parse_gstats(raw, 2)  # the kernel wrote more than the room we gave it


def test_absurd_stat_count_from_the_driver_is_refused() -> None:
    class Fake(eth.EthtoolIoctl):
        def _ioctl(self, interface, op, buf):  # GSSET_INFO answers 2^32 - 1 stats
            import struct

            struct.pack_into("=IIQI", buf, 0, eth.ETHTOOL_GSSET_INFO, 0, 1 << eth.ETH_SS_STATS, 2**32 - 1)

    with pytest.raises(eth.EthtoolError) as exc:
        Fake().read("eth0")
    assert exc.value.errno == __import__("errno").E2BIG


@FUZZ
@given(files=st.dictionaries(st.sampled_from(["eth0", "eth1", "eth2"]),
                             st.one_of(st.binary(max_size=200),
                                       st.lists(_stat_line, max_size=10).map(lambda ls: "\n".join(ls).encode())),
                             min_size=1, max_size=3))
def test_ethtool_source_any_dump(tmp_path_factory, files) -> None:
    d = tmp_path_factory.mktemp("eth")
    for name, data in files.items():
        (d / f"{name}.txt").write_bytes(data)

    class Inv:
        def netdevs(self):
            return list(files)

    from fabricmon.config import EthtoolConfig as C

    src = eth.EthtoolSource(config=C(allow=(".",)), ethtool_dir=str(d))
    poller = Poller("n", [src], lambda: Inv(), inline_all=True)  # type: ignore[arg-type,return-value]
    try:
        poller.poll_once()
        snap = poller.poll_once()
    finally:
        poller.close()
    assert_snapshot_in_bounds(snap)
    keys = [(s.family, s.labels) for s in snap.samples]
    assert len(keys) == len(set(keys))  # no duplicate series in the exposition
    up = {dict(s.labels)["interface"]: s.value for s in snap.samples if s.family == "fabricmon_ethtool_up"}
    assert set(up) == set(files)
    exposition(snap)


@FUZZ
@given(st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats()),
       st.sampled_from(list(Semantics)), st.sampled_from([8, 32, 64]))
def test_screen_readings_passes_only_finite_in_width(value, sem: Semantics, width: int) -> None:
    from fabricmon.model import Reading

    rc = RejectCounts("x")
    errors: list[str] = []
    out = bounds.screen_readings([Reading("f", (), value, sem, width)], rc, errors)
    if out:
        assert math.isfinite(value)
        if sem is not Semantics.GAUGE:
            assert 0 <= value < 2**width
    else:
        assert rc.count() == 1 and len(errors) == 1


# --------------------------------------------------------------------------- discovery attributes


def test_junk_device_attributes_and_netdev_names_are_refused(tmp_path: Path) -> None:
    port = make_port(tmp_path, attrs={"link_layer": b"Ethernet\n"})
    dev = port.parent.parent
    (dev / "fw_ver").write_bytes(b"9" * 4000)
    (dev / "board_id").write_bytes(b"MT_0000000838\n")
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs" / "0").write_text("../../../etc/passwd\n")
    inv = discover(str(tmp_path))
    (d,) = inv.devices
    assert d.fw_ver == "" and d.board_id == "MT_0000000838"
    assert inv.ports[0].netdev == ""  # never joined onto --ethtool-dir
    assert len(inv.errors) == 2
    snap = poll_tree(tmp_path)
    s = samples(snap)
    assert s[(REJECTED, (("collector", "infiniband"), ("reason", "too_long")))] == 1
    assert s[(REJECTED, (("collector", "infiniband"), ("reason", "malformed")))] == 1


@FUZZ
@given(st.text(max_size=40))
def test_valid_ifname_never_lets_a_path_through(name: str) -> None:
    if bounds.valid_ifname(name):
        assert os.path.basename(os.path.join("/d", f"{name}.txt")) == f"{name}.txt"
        assert len(name.encode()) < 16


# --------------------------------------------------------------------------- end to end: the agent command


def test_agent_once_over_a_hostile_tree_exports_only_bounded_values(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    from prometheus_client.parser import text_string_to_metric_families

    sysfs = tmp_path / "sys"
    make_port(sysfs, counters={"port_xmit_data": b"7" * (10 * 1024 * 1024), "port_rcv_data": str(2**70).encode(),
                               "symbol_error": b"70000\n", "port_xmit_packets": b"12\n"},
              attrs={"rate": b"1" * 60 + b" Gb/sec (4X NDR)\n", "link_layer": b"Ethernet\n"})
    ndevs = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gid_attrs" / "ndevs"
    ndevs.mkdir(parents=True)
    (ndevs / "0").write_text("eth0\n")
    eth = tmp_path / "ethtool"
    eth.mkdir()
    (eth / "eth0.txt").write_bytes(b"     rx_prio3_pause: " + b"1" * 39 + b"\n     rx_prio0_pause: 4\n")
    proc = subprocess.run([sys.executable, "-m", "fabricmon", "--log-format", "json", "agent", "--sysfs-root",
                           str(sysfs), "--ethtool-dir", str(eth), "--nvml", "off", "--node-name", "n", "--once"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    values = {}
    for fam in text_string_to_metric_families(proc.stdout.decode()):
        for s in fam.samples:
            assert math.isfinite(s.value) and abs(s.value) < 4 * 2.0**64, s
            values[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node")))] = s.value
    rej = {(dict(k[1])["collector"], dict(k[1])["reason"]): v for k, v in values.items() if k[0] == REJECTED}
    assert rej == {("infiniband", "too_long"): 2.0,  # the 10 MB file and 2^70 (22 digits)
                   ("infiniband", "out_of_range"): 2.0,  # symbol_error beyond 16 bits and the 60-digit rate
                   ("ethtool", "too_long"): 1.0}  # a 39-digit (1e38) ethtool value
    assert values[("fabricmon_pfc_pause_frames_total",
                   (("direction", "rx"), ("interface", "eth0"), ("priority", "0")))] == 4
    assert values[("fabricmon_ib_port_transmit_packets_total", (("device", "mlx5_0"), ("port", "1")))] == 12
    assert values[("fabricmon_collector_errors_total", (("collector", "infiniband"),))] == 4
    logged = [line for line in proc.stderr.decode().splitlines() if "source_file_error" in line]
    assert any("port_xmit_data" in line for line in logged), proc.stderr.decode()[-2000:]
    promtool = shutil.which("promtool")
    if promtool:
        lint = subprocess.run([promtool, "check", "metrics"], input=proc.stdout, capture_output=True, timeout=60)
        assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()


def test_readyz_says_when_the_expected_rdma_ports_are_missing(tmp_path: Path) -> None:
    from fabricmon.agent.runtime import build_agent
    from fabricmon.config import load_agent_config

    (tmp_path / "empty").mkdir()
    cfg = load_agent_config(None, {"sysfs_root": str(tmp_path / "empty"), "nvml": "off", "listen": "127.0.0.1:0"})
    agent = build_agent(cfg, inline_sources=True)
    try:
        agent.poller.poll_once()
        reasons = agent.not_ready()
        assert any("is the sysfs root right?" in r for r in reasons), reasons
    finally:
        agent.stop()
    (tmp_path / "a.yaml").write_text("sources:\n  infiniband:\n    expected_ports: 0\n")
    cfg = load_agent_config(tmp_path / "a.yaml", {"sysfs_root": str(tmp_path / "empty"), "nvml": "off",
                                                  "listen": "127.0.0.1:0"})
    agent = build_agent(cfg, inline_sources=True)
    try:
        agent.poller.poll_once()
        assert agent.not_ready() == []  # a node without RDMA, said so in the config: ready
    finally:
        agent.stop()
