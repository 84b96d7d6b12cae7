"""InfinibandSource against generated sysfs trees, plus its pure parsers.

Expected values are always derived from the files of the generated tree, with
tables written out here from DESIGN.md ("Sources") rather than imported from
the module under test, so a wrong table in the module fails these tests.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.metrics import SELF_SPECS, SPECS
from fabricmon.model import Semantics, Snapshot
from fabricmon.sources import infiniband as ib
from fabricmon.sources.infiniband import (
    InfinibandSource,
    classify,
    hw_counter_semantics,
    parse_counter,
    parse_phys_state,
    parse_rate,
    parse_state,
)
from fabricmon.sources.inventory import Inventory, PortInfo, discover

# --------------------------------------------------------------------------
# Independent expectations (DESIGN.md "Sources")
# --------------------------------------------------------------------------

ERROR_WIDTHS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
}
OWN_FAMILY = {  # counters/ name -> (family, multiplier)
    "port_rcv_data": ("fabricmon_ib_port_receive_bytes_total", 4),
    "port_xmit_data": ("fabricmon_ib_port_transmit_bytes_total", 4),
    "port_rcv_packets": ("fabricmon_ib_port_receive_packets_total", 1),
    "port_xmit_packets": ("fabricmon_ib_port_transmit_packets_total", 1),
    "port_xmit_wait": ("fabricmon_ib_port_transmit_wait_total", 1),
}
EXT_TO_MODERN = {
    "port_xmit_data_64": "port_xmit_data", "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets", "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets", "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets", "port_multicast_rcv_packets": "multicast_rcv_packets",
}
HW_32 = {
    "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect", "out_of_buffer",
    "out_of_sequence", "duplicate_request", "rnr_nak_retry_err", "packet_seq_err", "implied_nak_seq_err",
    "local_ack_timeout_err", "resp_local_length_error", "resp_cqe_error", "req_cqe_error",
    "req_remote_invalid_request", "req_remote_access_errors", "resp_remote_access_errors",
    "resp_cqe_flush_error", "req_cqe_flush_error", "req_transport_retries_exceeded", "req_rnr_retries_exceeded",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
}
HW_64 = {"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored", "rx_icrc_encapsulated"}
CURATED = {
    "np_cnp_sent": "fabricmon_roce_cnp_sent_total",
    "rp_cnp_handled": "fabricmon_roce_cnp_handled_total",
    "rp_cnp_ignored": "fabricmon_roce_cnp_ignored_total",
    "np_ecn_marked_roce_packets": "fabricmon_roce_ecn_marked_packets_total",
}
RETRIES = {
    "local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "rnr_nak_retry_err",
    "req_transport_retries_exceeded", "roce_adp_retrans", "roce_slow_restart", "duplicate_request",
}
IB_PREFIXES = ("fabricmon_ib_", "fabricmon_rdma_", "fabricmon_roce_")

# Every fault kind of make-sysfs-fixture (canonical names), and the layouts each
# applies to.  config_drift needs a RoCE rail NIC: on --layout ib the tool exits
# 2 by design, so that pair is left out of the matrix here (and
# test_fixture_tool_matrix_is_current checks that this is still true).
FAULTS = (
    "none", "flaky_cable", "link_down", "link_flap", "link_degraded", "pfc_storm", "ecn_congestion",
    "rdma_retransmits", "config_drift", "hot_unplug", "counter_saturation", "nvlink_errors", "nvlink_down",
    "slow_gpu", "counter_reset",
)
NOT_APPLICABLE = {("ib", "config_drift")}
CASES = [(layout, fault) for layout in ("ib", "roce") for fault in FAULTS if (layout, fault) not in NOT_APPLICABLE]

Key = tuple[str, frozenset]  # (sample name, labels without node)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def scrape(snap: Snapshot) -> dict[Key, float]:
    """Parse the exposition of ``snap`` back, as Prometheus would see it."""
    out: dict[Key, float] = {}
    for fam in text_string_to_metric_families(exposition(snap).decode()):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = {k: v for k, v in s.labels.items() if k != "node"}
            key = (s.name, frozenset(labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def ib_series(m: dict[Key, float]) -> dict[Key, float]:
    return {k: v for k, v in m.items() if k[0].startswith(IB_PREFIXES)}


def key(name: str, **labels: str) -> Key:
    return (name, frozenset(labels.items()))


def collector(m: dict[Key, float], family: str) -> float:
    return m[key(family, collector="infiniband")]


class TreePoller:
    """A Poller over one InfinibandSource whose discovery follows ``self.sys``.

    Discovery is a callable, so pointing it at the next snapshot of a tree
    (``t0`` -> ``t1``) is how a test ages the node under one running agent.
    """

    def __init__(self, sys_root: Path, discover_fn: Callable[[], Inventory] | None = None) -> None:
        self.sys = sys_root
        self.source = InfinibandSource(timeout=5.0)  # generous: CI machines can be slow
        rail_memory: dict[str, str] = {}  # sticky rails across polls, as the agent keeps them
        self.poller = Poller("node-000", [self.source],
                             discover_fn or (lambda: discover(str(self.sys), rail_memory=rail_memory)))

    def poll(self) -> tuple[Snapshot, dict[Key, float]]:
        snap = self.poller.poll_once()
        return snap, scrape(snap)

    def close(self) -> None:
        self.poller.close()


def _read(path: Path) -> str:
    return path.read_text(errors="replace").strip()


def ports_of(sys_root: Path) -> dict[tuple[str, str], Path]:
    base = sys_root / "class" / "infiniband"
    return {
        (dev, port): base / dev / "ports" / port
        for dev in sorted(os.listdir(base))
        for port in sorted(os.listdir(base / dev / "ports"))
    }


def counter_files(port: Path, legacy_aware: bool = True) -> dict[tuple[str, str], tuple[str, int]]:
    """(family, counter label or "") -> (file it came from, exported raw value) for one port's counter files.

    The raw value includes the x4 of the data counters, before any wrap/reset
    handling, i.e. what a first poll must export.
    """
    out: dict[tuple[str, str], tuple[str, int]] = {}
    ext_dir = port / "counters_ext"
    ext = {n: int(_read(ext_dir / n)) for n in os.listdir(ext_dir)} if ext_dir.is_dir() else {}
    values: dict[str, tuple[str, int]] = {}
    cdir = port / "counters"
    if cdir.is_dir():
        for n in os.listdir(cdir):
            values[n] = (f"counters/{n}", int(_read(cdir / n)))
    for n, v in ext.items():  # the larger of a counters_ext file and its counters/ twin
        modern = EXT_TO_MODERN.get(n, n)
        if modern in values:
            values[modern] = (values[modern][0], max(values[modern][1], v))
        else:
            values[modern] = (f"counters_ext/{n}", v)
    for n, (src, v) in values.items():
        if n in OWN_FAMILY:
            fam, mult = OWN_FAMILY[n]
            out[(fam, "")] = (src, v * mult)
        elif n in ERROR_WIDTHS:
            out[("fabricmon_ib_port_errors_total", n)] = (src, v)
        else:
            out[("fabricmon_ib_port_pma_total", n)] = (src, v)
    hdir = port / "hw_counters"
    if hdir.is_dir():
        for n in os.listdir(hdir):
            if n == "lifespan":
                continue
            v = int(_read(hdir / n))
            out[("fabricmon_rdma_hw_stat_total", n)] = (f"hw_counters/{n}", v)
            if n in CURATED:
                out[(CURATED[n], "")] = (f"hw_counters/{n}", v)
            if n in RETRIES:
                out[("fabricmon_rdma_transport_retries_total", n)] = (f"hw_counters/{n}", v)
    return out


def counter_key(dev: str, port: str, family: str, counter: str) -> Key:
    return key(family, device=dev, port=port, counter=counter) if counter else key(family, device=dev, port=port)


def manifest_rails(manifest: dict) -> dict[str, str]:
    return {d["name"]: "" if d["rail"] is None else str(d["rail"]) for d in manifest["devices"]}


def expected_series(sys_root: Path, manifest: dict, rails: dict[str, str] | None = None) -> dict[Key, float]:
    """Every InfiniBand series a first poll of ``sys_root`` must export, from its files alone."""
    mdev = {d["name"]: d for d in manifest["devices"]}
    rails = rails or manifest_rails(manifest)
    out: dict[Key, float] = {}
    for (dev, port), p in ports_of(sys_root).items():
        dp = {"device": dev, "port": port}
        ddir = p.parent.parent
        link_layer = _read(p / "link_layer")
        info = dict(
            dp, rail=rails[dev], link_layer=link_layer,
            interface=mdev[dev]["ifname"] if link_layer == "Ethernet" else "",
            hca_type=_read(ddir / "hca_type"), fw_ver=_read(ddir / "fw_ver"),
            node_guid=_read(ddir / "node_guid"), board_id=_read(ddir / "board_id"),
        )
        out[key("fabricmon_ib_port_info", **info)] = 1.0
        out[key("fabricmon_ib_port_up", **dp)] = 1.0
        out[key("fabricmon_ib_port_state", **dp)] = float(_read(p / "state").split(":")[0])
        out[key("fabricmon_ib_port_physical_state", **dp)] = float(_read(p / "phys_state").split(":")[0])
        m = re.fullmatch(r"([\d.]+) Gb/sec \((\d+)X (\w+)\)", _read(p / "rate"))
        assert m, _read(p / "rate")
        out[key("fabricmon_ib_port_rate_bytes_per_second", **dp)] = float(m[1]) * 1e9 / 8
        coding = 1.0 if link_layer == "Ethernet" else {"SDR": 0.8, "DDR": 0.8, "QDR": 0.8,
                                                       "FDR": 64 / 66 * 14.0625 / 14}.get(m[3], 1.0)
        out[key("fabricmon_ib_port_data_rate_bytes_per_second", **dp)] = float(m[1]) * coding * 1e9 / 8
        out[key("fabricmon_ib_port_width_lanes", **dp)] = float(m[2])
        if (p / "hw_counters").is_dir():  # the simulator writes mlx5 names only: every one is in the table
            out[key("fabricmon_rdma_hw_stat_unclassified", device=dev)] = 0.0
        if (p / "hw_counters" / "lifespan").exists():
            lifespan_ms = int(_read(p / "hw_counters" / "lifespan"))
            out[key("fabricmon_rdma_hw_stat_lifespan_seconds", **dp)] = lifespan_ms / 1000
        for (fam, counter), (src, v) in counter_files(p).items():
            out[counter_key(dev, port, fam, counter)] = float(v)
            if fam == "fabricmon_ib_port_errors_total":
                pinned = v >= (1 << ERROR_WIDTHS[counter]) - 1
                out[key("fabricmon_ib_port_error_saturated", **dp, counter=counter)] = 1.0 if pinned else 0.0
            elif src.startswith("counters/") and (p / "counters_ext").is_dir():
                # legacy kernel: a 32-bit PortCounter read from counters/ can pin
                out[key("fabricmon_ib_port_error_saturated", **dp, counter=src.split("/")[1])] = (
                    1.0 if v // OWN_FAMILY.get(src.split("/")[1], ("", 1))[1] == (1 << 32) - 1 else 0.0)
    return out


def assert_series_equal(got: dict[Key, float], want: dict[Key, float]) -> None:
    missing = sorted(set(want) - set(got), key=str)[:10]
    extra = sorted(set(got) - set(want), key=str)[:10]
    assert not missing and not extra, f"missing {missing}\nextra {extra}"
    wrong = [(k, got[k], want[k]) for k in want if got[k] != pytest.approx(want[k], rel=1e-12, abs=1e-9)]
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:5]}"


def manifest_of(root: Path) -> dict:
    return json.loads((root / "fixture.json").read_text())


def devices_in(m: dict[Key, float]) -> set[str]:
    return {dict(labels)["device"] for name, labels in m if "device" in dict(labels) and name.startswith(IB_PREFIXES)}


# --------------------------------------------------------------------------
# Pure parsers and tables
# --------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("4: ACTIVE", (4, "ACTIVE")), ("1: DOWN\n", (1, "DOWN")), ("5: ACTIVE_DEFER", (5, "ACTIVE_DEFER")),
])
def test_parse_state(text: str, expected: tuple[int, str]) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("5: LinkUp", (5, "LinkUp")), ("2: Polling", (2, "Polling")), ("7: Phy Test", (7, "Phy Test")),
    ("4: PortConfigurationTraining", (4, "PortConfigurationTraining")),
])
def test_parse_phys_state(text: str, expected: tuple[int, str]) -> None:
    assert parse_phys_state(text) == expected


@pytest.mark.parametrize("text", ["", "ACTIVE", "x: ACTIVE", ": ACTIVE", "N/A (no PMA)", "-1: DOWN"])
def test_parse_state_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_state(text)
    with pytest.raises(ValueError):
        parse_phys_state(text)


@pytest.mark.parametrize("text,gbps,lanes,speed", [
    ("400 Gb/sec (4X NDR)", 400, 4, "NDR"),
    ("56 Gb/sec (4X FDR)", 56, 4, "FDR"),
    ("2.5 Gb/sec (1X SDR)", 2.5, 1, "SDR"),
    ("200 Gb/sec (2X NDR)", 200, 2, "NDR"),
    ("200 Gb/sec (4X HDR)\n", 200, 4, "HDR"),
    ("40 Gb/sec (4X FDR10)", 40, 4, "FDR10"),
    ("10 Gb/sec (4X)", 10, 4, "SDR"),  # old kernels printed SDR without a name
    ("800 Gb/sec (4X XDR)", 800, 4, "XDR"),
])
def test_parse_rate(text: str, gbps: float, lanes: int, speed: str) -> None:
    r = parse_rate(text)
    assert r.bytes_per_second == gbps * 1e9 / 8
    assert r.width_lanes == lanes
    assert r.speed == speed
    assert r.gbps == gbps


@pytest.mark.parametrize("text", [
    "", "fast", "400 Gb/sec", "400 Mb/sec (4X NDR)", "400 Gb/sec (0X NDR)", "400 Gb/sec (-1X NDR)",
    "Gb/sec (4X NDR)", "N/A (no PMA)", "400 Gb/sec (4X NDR) extra", "\x00garbage",
])
def test_parse_rate_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_parse_counter() -> None:
    assert parse_counter(b"123\n") == 123
    assert parse_counter(b"18446744073709551615\n") == (1 << 64) - 1
    for bad in (b"", b"\n", b"N/A (no PMA)\n", b"\x00garbage", b"-1", b"+1", b"1_000", b"0x10", b"12 34"):
        with pytest.raises(ValueError):
            parse_counter(bad)


def test_pma_error_widths_match_design() -> None:
    assert ib.PMA_ERROR_WIDTHS == ERROR_WIDTHS
    for name, width in ERROR_WIDTHS.items():
        plan = classify("counters", name)
        assert (plan.semantics, plan.width) == (Semantics.SATURATING, width)
        assert plan.families == (("fabricmon_ib_port_errors_total", True),)


def test_hw_counter_semantics() -> None:
    for name in HW_32:
        assert hw_counter_semantics(name) == (Semantics.WRAPPING, 32), name
    for name in HW_64 | {"some_future_counter"}:
        assert hw_counter_semantics(name) == (Semantics.MONOTONIC, 64), name
    assert hw_counter_semantics("lifespan")[0] is Semantics.GAUGE
    lifespan = classify("hw_counters", "lifespan")
    assert lifespan.families == (("fabricmon_rdma_hw_stat_lifespan_seconds", False),)


def test_classifier() -> None:
    rcv = classify("counters", "port_rcv_data")
    assert (rcv.semantics, rcv.scale, rcv.families) == (
        Semantics.MONOTONIC, 4, (("fabricmon_ib_port_receive_bytes_total", False),))
    assert classify("counters", "port_xmit_wait").semantics is Semantics.MONOTONIC
    assert classify("counters", "unicast_xmit_packets").families == (("fabricmon_ib_port_pma_total", True),)
    ext = classify("counters_ext", "port_xmit_data_64")
    assert (ext.counter, ext.scale, ext.families) == (
        "port_xmit_data", 4, (("fabricmon_ib_port_transmit_bytes_total", False),))
    assert classify("counters_ext", "port_unicast_rcv_packets").counter == "unicast_rcv_packets"
    for name, fam in CURATED.items():
        fams = dict(classify("hw_counters", name).families)
        assert fams == {"fabricmon_rdma_hw_stat_total": True, fam: False}
    for name in RETRIES:
        plan = classify("hw_counters", name)
        assert ("fabricmon_rdma_transport_retries_total", True) in plan.families
        assert (plan.semantics, plan.width) == (Semantics.WRAPPING, 32)
    assert classify("hw_counters", "out_of_buffer").families == (("fabricmon_rdma_hw_stat_total", True),)
    with pytest.raises(ValueError):
        classify("stats", "x")


# --------------------------------------------------------------------------
# Every layout x fault kind: every counter file equals its exported series
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fault_trees(make_fixture) -> Callable[[str, str], Path]:
    make_fixture.prefetch([{"layout": lay, "fault": f, "snapshots": 1} for lay, f in CASES])
    return lambda layout, fault: make_fixture(layout=layout, fault=fault, snapshots=1)


@pytest.mark.parametrize("layout,fault", CASES)
def test_every_counter_file_is_exported(fault_trees, layout: str, fault: str) -> None:
    root = fault_trees(layout, fault)
    manifest = manifest_of(root)
    tp = TreePoller(root / "sys")
    try:
        snap, m = tp.poll()
    finally:
        tp.close()

    assert collector(m, "fabricmon_collector_up") == 1.0
    assert collector(m, "fabricmon_collector_errors_total") == 0.0, snap.sources
    rails = manifest_rails(manifest)
    if fault == "hot_unplug":
        # An agent that starts with mlx5_3 already gone cannot know its rail
        # (no config): derived rails then number the NICs present.  This test
        # checks the source, so it takes discovery's rails as given.
        rails = {p.device: p.rail for p in snap.facts["inventory"].ports}
    want = expected_series(root / "sys", manifest, rails)
    assert len(want) > 400  # 9 NICs, every file: guards against an empty tree
    assert_series_equal(ib_series(m), want)

    # Labels in spec order (the exporter zips them positionally).
    for s in snap.samples:
        spec = SPECS.get(s.family) or SELF_SPECS[s.family]
        assert tuple(k for k, _ in s.labels) == spec.labels, s

    saturated = {k: v for k, v in m.items() if k[0] == "fabricmon_ib_port_error_saturated"}
    if fault == "counter_saturation":
        pinned = {dict(k[1])["counter"] for k, v in saturated.items() if v == 1.0}
        assert {"symbol_error", "port_rcv_errors", "link_error_recovery"} <= pinned
    else:
        assert set(saturated.values()) == {0.0}

    exported = devices_in(m)
    if fault == "hot_unplug":
        assert manifest["fault_device"] not in exported
        assert exported == {d["name"] for d in manifest["devices"]} - {manifest["fault_device"]}
    else:
        assert exported == {d["name"] for d in manifest["devices"]}

    facts = snap.facts["ports"]
    assert set(facts) == {f"{d}/{p}" for d, p in ports_of(root / "sys")}
    for (dev, port), p in ports_of(root / "sys").items():
        f = facts[f"{dev}/{port}"]
        assert (f["state_id"], f["state"]) == parse_state(_read(p / "state"))
        assert f["phys_state"] == _read(p / "phys_state").split(": ", 1)[1]
        assert f"{f['rate_gbps']:g} Gb/sec ({f['width']}X {f['speed']})" == _read(p / "rate")
        assert f["link_layer"] == _read(p / "link_layer")
        assert f["rail"] == rails[dev]
        if f["link_layer"] == "Ethernet":
            assert f["netdev"] == next(d["ifname"] for d in manifest["devices"] if d["name"] == dev)


def test_rails_survive_hot_unplug(make_fixture) -> None:
    """Derived rails are sticky: unplugging mlx5_3 must not renumber mlx5_4..7, and its re-probe gets rail 3 back."""
    root = make_fixture(layout="ib", fault="hot_unplug", snapshots=3, fault_start=1, fault_end=2)
    manifest = manifest_of(root)
    memory: dict[str, str] = {}
    before = {p.device: p.rail for p in discover(str(root / "t0" / "sys"), rail_memory=memory).ports}
    during = {p.device: p.rail for p in discover(str(root / "t1" / "sys"), rail_memory=memory).ports}
    after = {p.device: p.rail for p in discover(str(root / "t2" / "sys"), rail_memory=memory).ports}
    assert before == manifest_rails(manifest)
    assert manifest["fault_device"] not in during
    assert during == {k: v for k, v in before.items() if k != manifest["fault_device"]}
    assert after == before


def test_fixture_tool_matrix_is_current(make_fixture, tmp_path: Path) -> None:
    """The fault list above is the tool's, and the left-out pairs really are rejected by it."""
    if not make_fixture.tool.exists():
        pytest.skip(f"fixture tool not found at {make_fixture.tool}")
    help_text = subprocess.run([sys.executable, str(make_fixture.tool), "--help"],
                               capture_output=True, text=True, check=True).stdout
    choices = set(re.search(r"--fault \{([^}]*)\}", help_text)[1].split(","))
    assert choices - {"symbol_errors", "rdma_retries"} == set(FAULTS)  # old aliases
    for layout, fault in NOT_APPLICABLE:
        proc = subprocess.run([sys.executable, str(make_fixture.tool), "--root", str(tmp_path / "x"),
                               "--layout", layout, "--fault", fault], capture_output=True, text=True)
        assert proc.returncode == 2, (layout, fault, proc.stderr)


# --------------------------------------------------------------------------
# Legacy kernels, wraps, resets, hot unplug
# --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["ib", "roce"])
def test_legacy_kernel_prefers_counters_ext(make_fixture, layout: str) -> None:
    root = make_fixture(layout=layout, legacy_ext=True)
    tp = TreePoller(root / "sys")
    try:
        _, m = tp.poll()
    finally:
        tp.close()
    assert collector(m, "fabricmon_collector_errors_total") == 0.0
    assert_series_equal(ib_series(m), expected_series(root / "sys", manifest_of(root)))
    p = ports_of(root / "sys")[("mlx5_3", "1")]
    ext = int(_read(p / "counters_ext" / "port_rcv_data_64"))
    legacy32 = int(_read(p / "counters" / "port_rcv_data"))
    assert ext != legacy32  # the fixture pins the 32-bit twin, so the choice is visible
    assert m[key("fabricmon_ib_port_receive_bytes_total", device="mlx5_3", port="1")] == float(ext * 4)
    ext_name = key("fabricmon_ib_port_pma_total", device="mlx5_3", port="1", counter="port_unicast_rcv_packets")
    assert ext_name not in m  # exported under the modern name unicast_rcv_packets


def _poll_snapshots(root: Path, n: int) -> list[dict[Key, float]]:
    tp = TreePoller(root / "t0" / "sys")
    out = []
    try:
        for i in range(n):
            tp.sys = root / f"t{i}" / "sys"
            out.append(tp.poll()[1])
    finally:
        tp.close()
    return out


def _raw_series(sys_root: Path) -> dict[Key, int]:
    """Counter series -> raw exported value (x4 applied) from one snapshot's files."""
    out: dict[Key, int] = {}
    for (dev, port), p in ports_of(sys_root).items():
        for (fam, counter), (_, v) in counter_files(p).items():
            out[counter_key(dev, port, fam, counter)] = v
    return out


def test_32bit_hw_counter_wrap_is_unwrapped(make_fixture) -> None:
    root = make_fixture(layout="roce", wrap=True, snapshots=3)
    scrapes = _poll_snapshots(root, 3)
    raws = [_raw_series(root / f"t{i}" / "sys") for i in range(3)]
    wrapped = 0
    for k, v0 in raws[0].items():
        counter = dict(k[1]).get("counter", "")
        if k[0] not in ("fabricmon_rdma_hw_stat_total", "fabricmon_rdma_transport_retries_total"):
            continue
        total = v0
        for i in (1, 2):
            old, new = raws[i - 1][k], raws[i][k]
            if counter in HW_32:
                assert new < 1 << 32
                wrapped += new < old
                total += (new - old) % (1 << 32)
            else:
                total += new - old
            assert scrapes[i][k] == float(total), (k, i)
    assert wrapped > 0, "the --wrap fixture should wrap at least one 32-bit counter"
    assert collector(scrapes[-1], "fabricmon_collector_errors_total") == 0.0


def _assert_totals_follow(
    scrapes: list[dict[Key, float]], raws: list[dict[Key, int]], steps: list[tuple[int, int]],
) -> int:
    """Totals move by new-old, or by new after a decrease (reset); never back, never a spike.

    Returns how many series were reset, so callers can check the reset happened.
    """
    resets = 0
    for k, v0 in raws[0].items():
        total = v0
        for a, b in steps:
            old, new = raws[a][k], raws[b][k]
            delta = new - old if new >= old else new
            resets += new < old
            assert 0 <= delta < 1 << 31 or k[0].startswith("fabricmon_ib_port_") and delta < 1 << 60, (k, delta)
            assert scrapes[b][k] >= scrapes[a][k], (k, "went backwards")
            total += delta
            assert scrapes[b][k] == float(total), (k, b, scrapes[b][k], total)
    return resets


@pytest.mark.parametrize("layout", ["ib", "roce"])
def test_counter_reset_gives_no_decrease_and_no_spike(make_fixture, layout: str) -> None:
    root = make_fixture(layout=layout, fault="counter_reset", snapshots=3)
    assert manifest_of(root)["fault_start"] == 1
    scrapes = _poll_snapshots(root, 3)
    raws = [_raw_series(root / f"t{i}" / "sys") for i in range(3)]
    resets = _assert_totals_follow(scrapes, raws, [(0, 1), (1, 2)])
    assert resets > 100  # every counter of every device restarted at t1
    for m in scrapes:
        assert collector(m, "fabricmon_collector_errors_total") == 0.0


def test_hot_unplug_and_reprobe_with_one_poller(make_fixture) -> None:
    root = make_fixture(layout="roce", fault="hot_unplug", snapshots=3, fault_end=2)
    gone = manifest_of(root)["fault_device"]
    all_devices = {d["name"] for d in manifest_of(root)["devices"]}
    scrapes = _poll_snapshots(root, 3)
    assert devices_in(scrapes[0]) == all_devices
    # Absent from class/infiniband: not an error, its series simply go away.
    assert devices_in(scrapes[1]) == all_devices - {gone}
    assert collector(scrapes[1], "fabricmon_collector_up") == 1.0
    assert collector(scrapes[1], "fabricmon_collector_errors_total") == 0.0
    # Rails are sticky, so even port_info keeps its labels (see test_rails_survive_hot_unplug).
    others = {k for k in scrapes[0] if k[0].startswith(IB_PREFIXES) and dict(k[1]).get("device") != gone}
    assert others <= set(scrapes[1])
    # Re-probed with restarted counters: totals continue from before the unplug.
    assert devices_in(scrapes[2]) == all_devices
    raws = [_raw_series(root / f"t{i}" / "sys") for i in range(3)]
    mine = [{k: v for k, v in r.items() if dict(k[1])["device"] == gone} for r in raws]
    resets = _assert_totals_follow(scrapes, mine, [(0, 2)])
    assert resets > 10


# --------------------------------------------------------------------------
# Isolation: vanished ports, garbage files
# --------------------------------------------------------------------------


def _device_dir(sys_root: Path, dev: str) -> Path:
    return Path(os.path.realpath(sys_root / "class" / "infiniband" / dev))


def test_device_vanishing_between_discovery_and_read(make_fixture) -> None:
    root = make_fixture(layout="ib", fresh=True)
    sys_root = root / "sys"
    inventory = discover(str(sys_root))
    tp = TreePoller(sys_root, discover_fn=lambda: inventory)  # stale inventory: still lists mlx5_3
    try:
        _, before = tp.poll()
        shutil.rmtree(_device_dir(sys_root, "mlx5_3"))
        snap, after = tp.poll()
    finally:
        tp.close()
    assert collector(after, "fabricmon_collector_errors_total") == 1.0
    assert collector(after, "fabricmon_collector_up") == 1.0
    assert any("mlx5_3/1" in msg for st in snap.sources for msg in st.last_messages)
    assert "mlx5_3" not in devices_in(after)
    kept = {k: v for k, v in ib_series(before).items() if dict(k[1]).get("device") != "mlx5_3"}
    assert_series_equal(ib_series(after), kept)


def test_port_vanishing_mid_poll_costs_one_error(make_fixture, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_fixture(layout="roce", fresh=True)
    sys_root = root / "sys"
    victim = _device_dir(sys_root, "mlx5_5")
    real_read_at = ib._read_at

    def read_at(dfd: int, name: str) -> bytes:
        # The device is unplugged after the port dir was opened and its first file read.
        if name == "phys_state" and victim.exists() and os.readlink(f"/proc/self/fd/{dfd}").startswith(str(victim)):
            shutil.rmtree(victim)
        return real_read_at(dfd, name)

    tp = TreePoller(sys_root)
    try:
        _, before = tp.poll()
        monkeypatch.setattr(ib, "_read_at", read_at)  # discovery of this poll still sees mlx5_5
        snap, after = tp.poll()
    finally:
        tp.close()
    assert collector(after, "fabricmon_collector_errors_total") == 1.0
    msgs = [msg for st in snap.sources for msg in st.last_messages]
    assert msgs == ["mlx5_5/1: port vanished during the poll"]
    assert "mlx5_5" not in devices_in(after)
    assert "mlx5_5/1" not in snap.facts["ports"]
    kept = {k: v for k, v in ib_series(before).items() if dict(k[1]).get("device") != "mlx5_5"}
    assert_series_equal(ib_series(after), kept)


def test_counters_dir_vanishing_costs_its_series_only(make_fixture) -> None:
    root = make_fixture(layout="ib", fresh=True)
    sys_root = root / "sys"
    tp = TreePoller(sys_root)
    try:
        _, before = tp.poll()
        shutil.rmtree(ports_of(sys_root)[("mlx5_3", "1")] / "counters")
        snap, after = tp.poll()
    finally:
        tp.close()
    assert collector(after, "fabricmon_collector_errors_total") == 1.0
    assert any("mlx5_3/1/counters" in msg for st in snap.sources for msg in st.last_messages)
    lost = {k for k in ib_series(before) if dict(k[1]).get("device") == "mlx5_3" and k[0] in (
        "fabricmon_ib_port_errors_total", "fabricmon_ib_port_error_saturated", "fabricmon_ib_port_pma_total",
        "fabricmon_ib_port_receive_bytes_total", "fabricmon_ib_port_transmit_bytes_total",
        "fabricmon_ib_port_receive_packets_total", "fabricmon_ib_port_transmit_packets_total",
        "fabricmon_ib_port_transmit_wait_total")}
    assert len(lost) > 20
    assert_series_equal(ib_series(after), {k: v for k, v in ib_series(before).items() if k not in lost})


def test_garbage_and_unreadable_files_cost_only_their_series(make_fixture, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_fixture(layout="roce", fresh=True)
    sys_root = root / "sys"
    ports = ports_of(sys_root)
    tp = TreePoller(sys_root)
    try:
        _, before = tp.poll()
        (ports[("mlx5_3", "1")] / "counters" / "symbol_error").write_text("N/A (no PMA)\n")
        (ports[("mlx5_4", "1")] / "hw_counters" / "out_of_sequence").write_text("\x00garbage\n")
        # As root chmod 000 does not stop a read; a directory in the file's place does (EISDIR).
        xmit = ports[("mlx5_5", "1")] / "counters" / "port_xmit_data"
        xmit.unlink()
        xmit.mkdir()
        (ports[("mlx5_7", "1")] / "rate").write_text("fast\n")
        einval = os.path.realpath(ports[("mlx5_6", "1")] / "hw_counters" / "np_cnp_sent")
        real_read = os.read

        def read(fd: int, n: int) -> bytes:
            # A CX-7 port in switch mode answers EINVAL to the read, not to the open.
            if os.readlink(f"/proc/self/fd/{fd}") == einval:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_read(fd, n)

        monkeypatch.setattr(os, "read", read)
        snap, after = tp.poll()
        monkeypatch.undo()
    finally:
        tp.close()

    lost = {
        key("fabricmon_ib_port_errors_total", device="mlx5_3", port="1", counter="symbol_error"),
        key("fabricmon_ib_port_error_saturated", device="mlx5_3", port="1", counter="symbol_error"),
        key("fabricmon_rdma_hw_stat_total", device="mlx5_4", port="1", counter="out_of_sequence"),
        key("fabricmon_rdma_transport_retries_total", device="mlx5_4", port="1", counter="out_of_sequence"),
        key("fabricmon_ib_port_transmit_bytes_total", device="mlx5_5", port="1"),
        key("fabricmon_rdma_hw_stat_total", device="mlx5_6", port="1", counter="np_cnp_sent"),
        key("fabricmon_roce_cnp_sent_total", device="mlx5_6", port="1"),
        # a RoCE port keeps its rate (the netdev's speed is the authority), only the lanes are lost
        key("fabricmon_ib_port_width_lanes", device="mlx5_7", port="1"),
    }
    assert lost <= set(before)
    assert_series_equal(ib_series(after), {k: v for k, v in ib_series(before).items() if k not in lost})
    assert collector(after, "fabricmon_collector_errors_total") == 5.0
    assert collector(after, "fabricmon_collector_up") == 1.0
    msgs = " | ".join(msg for st in snap.sources for msg in st.last_messages)
    for where in ("mlx5_3/1/counters/symbol_error", "mlx5_4/1/hw_counters/out_of_sequence",
                  "mlx5_5/1/counters/port_xmit_data", "mlx5_6/1/hw_counters/np_cnp_sent", "mlx5_7/1/rate"):
        assert where in msgs
    assert "IsADirectoryError" in msgs
    assert "Invalid argument" in msgs  # EINVAL


def test_symlink_loop_in_counters_is_not_followed(make_fixture) -> None:
    root = make_fixture(layout="ib", fresh=True)
    port = ports_of(root / "sys")[("mlx5_2", "1")]
    os.symlink("..", port / "counters" / "loop")  # real sysfs has such links
    tp = TreePoller(root / "sys")
    try:
        snap, m = tp.poll()
    finally:
        tp.close()
    assert collector(m, "fabricmon_collector_errors_total") == 1.0  # the link is reported, not walked
    assert any("counters/loop" in msg for st in snap.sources for msg in st.last_messages)
    assert key("fabricmon_ib_port_receive_bytes_total", device="mlx5_2", port="1") in m


def test_poll_never_raises_on_a_broken_inventory(tmp_path: Path) -> None:
    inv = Inventory(str(tmp_path), (), (PortInfo("mlx5_9", "1", str(tmp_path / "nope"), "", "", ""),))
    res = InfinibandSource().poll(inv)
    port_readings = [r for r in res.readings if r.family not in ("fabricmon_devices_discovered",
                                                                 "fabricmon_devices_expected")]
    assert res.errors == 1 and port_readings == [] and res.facts["ports"] == {}


# --------------------------------------------------------------------------
# Exposition lint and cost
# --------------------------------------------------------------------------


PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus; scripts/test.sh installs it)")

# Contract names (DESIGN.md / metrics.SPECS) that promtool's linter flags with
# "metric name should not include type 'counter'": a conflict inside the
# contract ("every name passes promtool check metrics"), left to its owner.

def _promtool_problems(layout: str, fault: str, legacy: bool, make_fixture) -> list[str]:
    root = make_fixture(layout=layout, fault=fault, legacy_ext=legacy)
    tp = TreePoller(root / "sys")
    try:
        snap, _ = tp.poll()
    finally:
        tp.close()
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition(snap), capture_output=True, timeout=60)
    problems = (proc.stdout + proc.stderr).decode().strip().splitlines()
    assert proc.returncode in (0, 3), problems  # 3: lint problems only; 1: unparsable exposition
    return problems


@needs_promtool
@pytest.mark.parametrize("layout,fault,legacy", [("roce", "counter_saturation", False), ("ib", "none", True)])
def test_promtool_check_metrics(make_fixture, layout: str, fault: str, legacy: bool) -> None:
    assert not _promtool_problems(layout, fault, legacy, make_fixture)


def test_poll_cpu_cost_of_a_9_nic_node(make_fixture) -> None:
    """A full poll is syscall-bound (~500 files); catch accidental per-file overhead, not machine speed."""
    root = make_fixture(layout="roce", snapshots=1)
    inventory = discover(str(root / "sys"))
    source = InfinibandSource()
    assert len(source.poll(inventory).readings) > 500
    times = []
    for _ in range(30):
        t0 = time.process_time()
        source.poll(inventory)
        times.append(time.process_time() - t0)
    median = statistics.median(times)
    print(f"infiniband poll of {len(inventory.ports)} ports: median CPU {median * 1e3:.2f} ms")
    assert median < 0.05
