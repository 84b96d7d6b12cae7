"""ethtool source: text parsers, stat classification, the real SIOCETHTOOL ioctl, fixture trees."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.config import EthtoolConfig
from fabricmon.counters import CounterTracker
from fabricmon.metrics import SPECS
from fabricmon.model import Reading, Semantics
from fabricmon.sources.ethtool import (
    PAUSE_FRAMES,
    PAUSE_SECONDS,
    PAUSE_TRANSITIONS,
    PCI_STALLED,
    PHY_BITS,
    PHY_CORRECTED,
    PHY_ERRORS,
    STORM_EVENTS,
    EthtoolSource,
    classify_stat,
    parse_ethtool_stats,
    parse_pfc_summary,
    stat_readings,
)
from fabricmon.sources.inventory import discover
from support.fixturegen import gen_fixture
from support.netns import need_netns
from support.paths import REPO

# --- parsers ---------------------------------------------------------------------------------

ETHTOOL_S = """NIC statistics:
     rx_packets: 12
     tx_prio3_pause_duration: 1500000
     weird:name:with:colons: 7
     not_a_number: n/a
     rx_queue_0_xdp_packets: 0
"""


def test_parse_ethtool_stats_keeps_order_and_skips_noise() -> None:
    assert parse_ethtool_stats(ETHTOOL_S) == [
        ("rx_packets", 12),
        ("tx_prio3_pause_duration", 1500000),
        ("weird:name:with:colons", 7),
        ("rx_queue_0_xdp_packets", 0),
    ]
    assert parse_ethtool_stats("no stats available\n") == []


def test_parse_ethtool_stats_u64_max() -> None:
    assert parse_ethtool_stats(f"     x: {2**64 - 1}\n") == [("x", 2**64 - 1)]


def test_parse_pfc_summary_fixture_and_mlnx_qos_shapes() -> None:
    fixture = (
        "DCBX mode: OS controlled\nPriority trust state: dscp\nPFC configuration:\n"
        "\tpriority    0   1   2   3   4   5   6   7\n\tenabled     0   0   0   1   0   0   0   0\n"
        "\tbuffer      0   0   0   1   0   0   0   0\n"
    )
    info = parse_pfc_summary(fixture)
    assert info.trust == "dscp" and info.pfc_enabled == frozenset({3})
    # mlnx_qos prints more sections around the table; only the two rows matter.
    qos = (
        "DCBX mode: OS controlled\nPriority trust state: pcp\ndscp2prio mapping:\n  prio:0 dscp:07,06,\n"
        "Receive buffer size (bytes): 130944,0,\nCable len: 7\nPFC configuration:\n"
        "        priority    0   1   2   3   4   5   6   7\n        enabled     0   0   0   1   1   0   0   0   \n"
        "tc: 0 ratelimit: unlimited, tsa: vendor\n priority:  0\n"
    )
    info = parse_pfc_summary(qos)
    assert info.trust == "pcp" and info.pfc_enabled == frozenset({3, 4})
    assert parse_pfc_summary("garbage") == parse_pfc_summary("")
    assert parse_pfc_summary("").trust is None and parse_pfc_summary("").pfc_enabled is None


# --- classification --------------------------------------------------------------------------


def _labels(cls) -> dict[str, str]:
    return dict(cls.labels)


@pytest.mark.parametrize("direction", ["rx", "tx"])
@pytest.mark.parametrize("prio", range(8))
def test_pause_frames_and_duration_by_priority_and_direction(direction: str, prio: int) -> None:
    frames = classify_stat(f"{direction}_prio{prio}_pause")
    assert frames is not None and frames.family == PAUSE_FRAMES
    assert _labels(frames) == {"priority": str(prio), "direction": direction}
    assert frames.semantics is Semantics.MONOTONIC and frames.scale == 1.0
    dur = classify_stat(f"{direction}_prio{prio}_pause_duration")
    assert dur is not None and dur.family == PAUSE_SECONDS
    assert _labels(dur) == {"priority": str(prio), "direction": direction}
    assert dur.scale == 1e-6  # microseconds -> seconds


def test_transitions_storms_bits_and_pci() -> None:
    t = classify_stat("rx_prio5_pause_transition")
    assert t is not None and t.family == PAUSE_TRANSITIONS and _labels(t) == {"priority": "5"}
    assert classify_stat("tx_prio5_pause_transition") is None  # no such family; not allowlisted
    for level in ("warning", "error"):
        s = classify_stat(f"tx_pause_storm_{level}_events")
        assert s is not None and s.family == STORM_EVENTS and _labels(s) == {"level": level}
    assert classify_stat("rx_bits_phy").family == PHY_BITS
    assert classify_stat("rx_corrected_bits_phy").family == PHY_CORRECTED
    for d in ("rd", "wr"):
        g = classify_stat(f"outbound_pci_stalled_{d}")
        assert g is not None and g.family == PCI_STALLED and _labels(g) == {"direction": d}
        assert g.semantics is Semantics.GAUGE and g.scale == 0.01  # percent -> ratio
        ev = classify_stat(f"outbound_pci_stalled_{d}_events")
        assert ev is not None and ev.family == PHY_ERRORS  # the events are a counter, not the gauge


@pytest.mark.parametrize("name", [
    "rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy", "rx_discards_phy", "tx_discards_phy",
    "link_down_events_phy", "rx_buffer_passed_thres_phy",
    "rx_prio3_buf_discard", "rx_prio0_cong_discard", "module_unplug", "module_high_temp", "rx_err_lane_2_phy",
])
def test_phy_errors_keep_their_name_as_counter_label(name: str) -> None:
    c = classify_stat(name)
    assert c is not None and c.family == PHY_ERRORS and _labels(c) == {"counter": name}
    assert c.semantics is Semantics.MONOTONIC
    # rx_out_of_buffer and dev_internal_queue_oob (formerly dev_out_of_buffer) are 32-bit and
    # wrap: see tests/realformat/test_realformat_ethtool.py.


def test_allowlist_gates_everything_else() -> None:
    for name in ("rx_packets", "rx_vport_rdma_unicast_bytes", "rx_prio3_bytes", "peer_ifindex"):
        assert classify_stat(name) is None  # default allowlist is empty: cardinality
    allow = (re.compile(r"^rx_vport_rdma_"),)
    c = classify_stat("rx_vport_rdma_unicast_bytes", allow)
    assert c is not None and c.family == "fabricmon_ethtool_stat"
    assert _labels(c) == {"stat": "rx_vport_rdma_unicast_bytes"}
    assert classify_stat("tx_vport_rdma_unicast_bytes", allow) is None
    # curated families win over the allowlist
    assert classify_stat("rx_prio3_pause", (re.compile("."),)).family == PAUSE_FRAMES


def test_every_emitted_family_and_label_set_is_in_specs() -> None:
    names = ["rx_prio3_pause", "tx_prio3_pause_duration", "rx_prio3_pause_transition", "tx_pause_storm_error_events",
             "rx_crc_errors_phy", "rx_bits_phy", "rx_corrected_bits_phy", "outbound_pci_stalled_wr", "rx_packets"]
    stats = [(n, 1) for n in names]
    rs = stat_readings("eth9", stats, lambda n: classify_stat(n, (re.compile("rx_packets"),)))
    assert len(rs) == len(names)
    for r in rs:
        assert tuple(k for k, _ in r.labels) == SPECS[r.family].labels, r.family
        is_counter = SPECS[r.family].kind == "counter"
        assert (r.semantics is Semantics.MONOTONIC) == is_counter
        assert r.group == ("eth9" if is_counter else "")  # a driver reload resets the interface as one group


def test_microseconds_export_as_seconds_through_the_tracker() -> None:
    tracker = CounterTracker()
    classify = classify_stat
    r0 = stat_readings("eth0", [("tx_prio3_pause_duration", 1_500_000), ("outbound_pci_stalled_wr", 67)], classify)
    samples, deltas, _ = tracker.process(r0, 0.0)
    by = {s.family: s.value for s in samples}
    assert by[PAUSE_SECONDS] == pytest.approx(1.5)
    assert by[PCI_STALLED] == pytest.approx(0.67)
    r1 = stat_readings("eth0", [("tx_prio3_pause_duration", 14_250_000), ("outbound_pci_stalled_wr", 0)], classify)
    samples, deltas, _ = tracker.process(r1, 15.0)
    by = {s.family: s.value for s in samples}
    assert by[PAUSE_SECONDS] == pytest.approx(14.25)
    assert [d.delta for d in deltas if d.family == PAUSE_SECONDS] == [pytest.approx(12.75)]
    # driver reload: the counter restarts; the total keeps going in seconds
    r2 = stat_readings("eth0", [("tx_prio3_pause_duration", 250_000)], classify)
    samples, deltas, _ = tracker.process(r2, 16.0)
    assert samples[0].value == pytest.approx(14.5)
    assert deltas[0].reset and deltas[0].delta == pytest.approx(0.25)


def test_reading_scale_defaults_keep_old_behaviour() -> None:
    r = Reading("fabricmon_ib_port_receive_bytes_total", (("device", "d"), ("port", "1")), 7, Semantics.MONOTONIC)
    assert r.scale == 1.0
    samples, _, _ = CounterTracker().process([r], 0.0)
    assert samples[0].value == 7.0


# --- the source on fixture-like directories ---------------------------------------------------


class _Inv:
    """The one Inventory method the ethtool source uses."""

    def __init__(self, netdevs: list[str]) -> None:
        self._n = netdevs

    def netdevs(self) -> list[str]:
        return list(self._n)


def test_missing_file_is_skipped_and_a_bad_one_costs_one_error(tmp_path: Path) -> None:
    (tmp_path / "good0.txt").write_text("NIC statistics:\n     rx_prio3_pause: 5\n")
    (tmp_path / "bad0.txt").mkdir()  # unreadable as a file
    src = EthtoolSource(config=EthtoolConfig(interfaces=("extra0",)), ethtool_dir=str(tmp_path))
    res = src.poll(_Inv(["good0", "ib0", "bad0"]))  # type: ignore[arg-type]
    up = {dict(r.labels)["interface"]: r.value for r in res.readings if r.family == "fabricmon_ethtool_up"}
    assert up == {"good0": 1.0, "bad0": 0.0}  # ib0 and extra0 have no file: silently skipped
    assert res.errors == 1 and "bad0" in res.messages[0]
    assert res.up
    frames = [r for r in res.readings if r.family == PAUSE_FRAMES]
    assert [(dict(r.labels), r.value) for r in frames] == [
        ({"interface": "good0", "priority": "3", "direction": "rx"}, 5)
    ]


def _families(text: bytes) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))
            out.setdefault(s.name, {})[labels] = s.value
    return out


def test_pfc_storm_fixture_exposition(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "pfc_storm", "--snapshots", "2",
                       "--interval", "15", "--seed", "3")
    manifest = json.loads((root / "fixture.json").read_text())
    fault_dev = manifest["fault_device"]
    fault_if = next(d["ifname"] for d in manifest["devices"] if d["name"] == fault_dev)
    frontend_if = next(d["ifname"] for d in manifest["devices"] if d["name"] == "mlx5_8")

    src = EthtoolSource(ethtool_dir=str(root / "t0" / "ethtool"))
    state = {"t": "t0"}
    clock = {"now": 0.0}
    poller = Poller("node-000", [src], lambda: discover(str(root / state["t"] / "sys")), clock=lambda: clock["now"])
    try:
        snaps = []
        for t, now in (("t0", 0.0), ("t1", 15.0)):
            state["t"] = t
            clock["now"] = now
            src.ethtool_dir = str(root / t / "ethtool")
            snaps.append(poller.poll_once())
    finally:
        poller.close()
    fam0, fam1 = (_families(exposition(s)) for s in snaps)
    key = (("direction", "tx"), ("interface", fault_if), ("priority", "3"))
    paused0 = fam0["fabricmon_pfc_pause_seconds_total"][key]
    paused1 = fam1["fabricmon_pfc_pause_seconds_total"][key]
    assert paused1 - paused0 > 0.5 * 15  # the slow receiver pauses its peer most of the interval
    warn = (("interface", fault_if), ("level", "warning"))
    assert fam1["fabricmon_pfc_pause_storm_events_total"][warn] > fam0["fabricmon_pfc_pause_storm_events_total"][warn]
    for other in {d["ifname"] for d in manifest["devices"]} - {fault_if}:
        k = (("direction", "tx"), ("interface", other), ("priority", "3"))
        assert fam1["fabricmon_pfc_pause_seconds_total"][k] - fam0["fabricmon_pfc_pause_seconds_total"][k] < 1.0
    assert fam1["fabricmon_netdev_pci_stalled_ratio"][(("direction", "wr"), ("interface", fault_if))] > 0.3
    # every Ethernet netdev was read, the frontend included; nothing failed
    ups = fam1["fabricmon_ethtool_up"]
    assert ups[(("interface", frontend_if),)] == 1.0 and len(ups) == 9 and set(ups.values()) == {1.0}
    assert fam1["fabricmon_collector_errors_total"][(("collector", "ethtool"),)] == 0

    # exported values equal the .txt values (seconds = microseconds / 1e6)
    for snap_fams, t in ((fam0, "t0"), (fam1, "t1")):
        txt = dict(parse_ethtool_stats((root / t / "ethtool" / f"{fault_if}.txt").read_text()))
        for name, value in txt.items():
            cls = classify_stat(name)
            if cls is None:
                continue
            labels = tuple(sorted((("interface", fault_if), *cls.labels)))
            got = snap_fams[cls.family][labels]
            assert got == pytest.approx(value * cls.scale, rel=1e-12), (t, name)


def test_counter_reset_fixture_never_goes_backwards(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "counter_reset", "--snapshots", "3",
                       "--fault-start", "2", "--seed", "5")
    src = EthtoolSource()
    tracker = CounterTracker()
    prev: dict = {}
    resets = 0
    for i in range(3):
        src.ethtool_dir = str(root / f"t{i}" / "ethtool")
        res = src.poll(discover(str(root / f"t{i}" / "sys")))
        samples, deltas, _ = tracker.process(res.readings, float(i))
        resets += sum(d.reset for d in deltas)
        for s in samples:
            if SPECS[s.family].kind == "counter":
                assert s.value >= prev.get((s.family, s.labels), 0.0), s
                prev[(s.family, s.labels)] = s.value
    assert resets > 0


# --- the real ioctl against veth in a private network namespace -------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


@pytest.fixture
def veth_ns():
    need_netns("ip", "ethtool")
    ns = f"fm-test-{secrets.token_hex(4)}"
    _ip("netns", "add", ns)
    try:
        _ip("-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
        for dev in ("veth0", "veth1"):
            _ip("-n", ns, "link", "set", dev, "up")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def _in_ns(ns: str, code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                         check=True, capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO))
    return json.loads(out.stdout)


_NS_SCRIPT = r"""
import json, socket, sys
from fabricmon.logs import configure_logging
configure_logging("json", "warning", stream=sys.stderr)  # stdout carries the JSON result
from fabricmon.config import EthtoolConfig as C
from fabricmon.sources.ethtool import EthtoolIoctl, EthtoolError, EthtoolSource

# a few frames across the pair, so the link has carried traffic (AF_PACKET: no IP needed)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("veth0", 0))
for _ in range(5):
    s.send(b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x88\xb5" + b"fabricmon-test".ljust(46, b"\0"))
s.close()

out = {}
r = EthtoolIoctl()
out["veth0"] = r.read("veth0")
out["veth1"] = r.read("veth1")
out["count"] = r.stats_count("veth0")
out["drvinfo"] = r.drvinfo_n_stats("veth0")
r.read("veth0"); r.read("veth0")
out["refreshes"] = r.string_refreshes  # 2: one per interface, then cached
for name in ("nope0", "lo"):
    try:
        r.read(name)
        out[name] = None
    except EthtoolError as e:
        out[name] = [e.errno, str(e)]
r.close()
src = EthtoolSource(config=C(interfaces=("veth0", "nope0"), allow=(".",)))
class Inv:
    def netdevs(self): return ["veth1"]
res = src.poll(Inv())
src.close()
out["poll"] = {"errors": res.errors, "messages": res.messages,
               "readings": [[x.family, dict(x.labels), x.value] for x in res.readings]}
print(json.dumps(out))
"""


def _ethtool_s(ns: str, dev: str) -> list[tuple[str, int]]:
    out = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-S", dev],
                         check=True, capture_output=True, text=True, timeout=20)
    return parse_ethtool_stats(out.stdout)


@pytest.mark.netns
def test_ioctl_matches_ethtool_binary_on_veth(veth_ns: str) -> None:
    before = {d: _ethtool_s(veth_ns, d) for d in ("veth0", "veth1")}
    got = _in_ns(veth_ns, _NS_SCRIPT)
    after = {d: _ethtool_s(veth_ns, d) for d in ("veth0", "veth1")}
    for dev in ("veth0", "veth1"):
        ioctl = [tuple(p) for p in got[dev]]
        assert ioctl, "veth exposes a few stats"
        # names and order are the driver's; values must match a read taken while the link is quiet
        assert [n for n, _ in ioctl] == [n for n, _ in after[dev]]
        assert ioctl in (before[dev], after[dev])
    assert dict(got["veth0"])["peer_ifindex"] > 0  # a real, non-zero value came through
    assert got["count"] == got["drvinfo"] == len(got["veth0"])
    assert got["refreshes"] == 2
    assert got["nope0"][0] == 19 and "no such device" in got["nope0"][1]  # ENODEV
    assert got["lo"] is not None and got["lo"][0] == 95  # EOPNOTSUPP: loopback has no stats

    poll = got["poll"]
    assert poll["errors"] == 1 and "nope0" in poll["messages"][0]
    ups = {r[1]["interface"]: r[2] for r in poll["readings"] if r[0] == "fabricmon_ethtool_up"}
    assert ups == {"veth1": 1.0, "veth0": 1.0, "nope0": 0.0}
    stats = {(r[1]["interface"], r[1]["stat"]): r[2] for r in poll["readings"] if r[0] == "fabricmon_ethtool_stat"}
    assert stats[("veth0", "peer_ifindex")] == dict(got["veth0"])["peer_ifindex"]


def test_agent_config_supplies_allowlist_and_ethtool_dir(tmp_path: Path) -> None:
    from fabricmon.agent.runtime import source_context
    from fabricmon.config import AgentConfig, SourcesConfig
    from fabricmon.sources.ethtool import SOURCE

    (tmp_path / "eth0.txt").write_text("NIC statistics:\n     rx_vport_rdma_unicast_bytes: 42\n     rx_packets: 1\n")
    cfg = AgentConfig(ethtool_dir=str(tmp_path),
                      sources=SourcesConfig(ethtool=EthtoolConfig(interfaces=("eth0",), allow=("^rx_vport_",))))
    src = SOURCE.build(cfg.sources.ethtool, source_context(cfg))  # as agent/runtime.py builds it
    res = src.poll(_Inv([]))  # type: ignore[arg-type]
    stats = [(r.family, dict(r.labels), r.value) for r in res.readings if r.family == "fabricmon_ethtool_stat"]
    assert stats == [("fabricmon_ethtool_stat", {"interface": "eth0", "stat": "rx_vport_rdma_unicast_bytes"}, 42)]


# --- issue #10 case 4: values that are not u64 integers, dumps that are not dumps ---------------


def _poll_dir(tmp_path: Path, files: dict[str, bytes], polls: int = 1):
    for name, data in files.items():
        (tmp_path / f"{name}.txt").write_bytes(data)
    src = EthtoolSource(config=EthtoolConfig(allow=(".",)), ethtool_dir=str(tmp_path))
    for _ in range(polls):
        res = src.poll(_Inv(list(files)))  # type: ignore[arg-type]
    return res


def _by(res, family: str) -> dict[tuple, float]:
    return {r.labels: r.value for r in res.readings if r.family == family}


def test_values_beyond_u64_are_rejected_not_exported(tmp_path: Path) -> None:
    big = 10**38  # was exported as 1e38
    res = _poll_dir(tmp_path, {"eth0": (
        f"NIC statistics:\n     rx_prio3_pause: {big}\n     tx_prio3_pause: {2**64}\n"
        f"     rx_discards_phy: -1\n     rx_crc_errors_phy: 1e38\n     rx_prio0_pause: 7\n").encode()})
    assert _by(res, PAUSE_FRAMES) == {(("interface", "eth0"), ("priority", "0"), ("direction", "rx")): 7}
    assert not any(r.value > 2**64 for r in res.readings)
    rejected = _by(res, "fabricmon_source_values_rejected_total")
    assert rejected == {(("collector", "ethtool"), ("reason", "too_long")): 1,
                        (("collector", "ethtool"), ("reason", "out_of_range")): 1,
                        (("collector", "ethtool"), ("reason", "not_integer")): 2}
    assert res.errors == 1 and "eth0: 4 value(s) rejected" in res.messages[0]
    assert _by(res, "fabricmon_ethtool_up") == {(("interface", "eth0"),): 1.0}


@pytest.mark.parametrize("data", [
    bytes(range(256)) * 40,  # binary junk
    b"\xff\xfe\x00garbled" * 100,
    b"no stats available\n",
    b"",  # a truncated write
])
def test_garbled_or_empty_dump_makes_the_interface_down(tmp_path: Path, data: bytes) -> None:
    res = _poll_dir(tmp_path, {"eth0": data, "eth1": b"     rx_prio3_pause: 5\n"})
    assert _by(res, "fabricmon_ethtool_up") == {(("interface", "eth0"),): 0.0, (("interface", "eth1"),): 1.0}
    assert res.errors == 1 and "no statistics" in res.messages[0]
    assert _by(res,
               "fabricmon_source_values_rejected_total") == {(("collector", "ethtool"), ("reason", "malformed")): 1}


def test_huge_dump_is_read_bounded_and_refused(tmp_path: Path) -> None:
    from fabricmon.sources.ethtool import MAX_DUMP_BYTES

    res = _poll_dir(tmp_path, {"eth0": b"     rx_prio3_pause: 5\n" * (MAX_DUMP_BYTES // 20)})
    assert _by(res, "fabricmon_ethtool_up") == {(("interface", "eth0"),): 0.0}
    assert _by(res, "fabricmon_source_values_rejected_total") == {(("collector", "ethtool"), ("reason", "too_long")): 1}


def test_duplicate_stat_names_export_one_series(tmp_path: Path) -> None:
    res = _poll_dir(tmp_path, {"eth0": b"     rx_prio3_pause: 5\n     rx_prio3_pause: 9\n"})
    assert list(_by(res, PAUSE_FRAMES).values()) == [5]
    assert res.errors == 0  # drivers do repeat names: counted, not an error
    assert _by(res,
               "fabricmon_source_values_rejected_total") == {(("collector", "ethtool"), ("reason", "malformed")): 1}


def test_devices_discovered_counts_read_netdevs(tmp_path: Path) -> None:
    res = _poll_dir(tmp_path, {"eth0": b"     rx_prio3_pause: 5\n", "eth1": b"junk"})
    assert _by(res, "fabricmon_devices_discovered") == {(("kind", "netdev"),): 1}
