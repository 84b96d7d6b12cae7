"""ethtool -S as mlx5 drivers really name things (en_stats.c, en_rep.c, counters.rst, captures).

Each test fails on a parser that knows only the names our own simulator writes.
"""

from __future__ import annotations

import pytest

from fabricmon.counters import CounterTracker
from fabricmon.sources.ethtool import (
    LEGACY_NAMES,
    classify_stat,
    parse_ethtool_stats,
    stat_readings,
)
from support.realformat import text


def readings(name: str, iface: str = "eth0") -> dict:
    rs = stat_readings(iface, parse_ethtool_stats(text("ethtool", name)), classify_stat)
    return {(r.family, tuple(kv for kv in r.labels if kv[0] != "interface")): r for r in rs}


def value(rs: dict, family: str, **labels) -> float:
    r = rs[(family, tuple(labels.items()))]
    return r.value * r.scale


def test_global_pause_port_exports_its_pause():
    # A CX4-Lx with 802.3x pause on: no prioN_pause counter exists, everything is in *_global_pause*.
    rs = readings("mlx5-cx4lx-global-pause.txt")
    assert value(rs, "fabricmon_global_pause_frames_total", direction="tx") == 1266552
    assert value(rs, "fabricmon_global_pause_seconds_total", direction="tx") == pytest.approx(555.665182)
    assert value(rs, "fabricmon_global_pause_frames_total", direction="rx") == 0
    assert ("fabricmon_global_pause_transitions_total", ()) in rs
    assert value(rs, "fabricmon_netdev_pause_control_frames_total", direction="tx") == 1266552


def test_current_inbox_names():
    rs = readings("mlx5-inbox-roce-prio3.txt")
    assert value(rs, "fabricmon_netdev_ecn_marked_packets_total", priority="3") == 9876
    assert value(rs, "fabricmon_netdev_phy_errors_total", counter="dev_internal_queue_oob") == 3
    assert value(rs, "fabricmon_netdev_phy_errors_total", counter="total_success_recovery_phy") == 2
    assert value(rs, "fabricmon_netdev_pause_control_frames_total", direction="rx") == 5100
    assert value(rs, "fabricmon_pfc_pause_seconds_total", priority="3", direction="tx") == pytest.approx(0.0657)
    # the inbox driver has no rx_bits_phy: no received-bits series is invented
    assert not any(f == "fabricmon_netdev_phy_received_bit_total" for f, _ in rs)


def test_kernel_4_7_names_map_to_current_series():
    rs = readings("mlx5-kernel-4.7-pport-names.txt")
    assert value(rs, "fabricmon_netdev_phy_errors_total", counter="rx_symbol_err_phy") == 457
    assert value(rs, "fabricmon_netdev_phy_errors_total", counter="rx_oversize_pkts_phy") == 3
    assert value(rs, "fabricmon_netdev_phy_errors_total", counter="rx_crc_errors_phy") == 12
    assert value(rs, "fabricmon_netdev_phy_errors_total", counter="rx_discards_phy") == 5
    assert value(rs, "fabricmon_netdev_pause_control_frames_total", direction="rx") == 99
    assert value(rs, "fabricmon_pfc_pause_frames_total", priority="3", direction="rx") == 40


def test_old_dev_out_of_buffer_keeps_the_new_series():
    assert LEGACY_NAMES["dev_out_of_buffer"] == "dev_internal_queue_oob"
    c = classify_stat("dev_out_of_buffer")
    assert c is not None and dict(c.labels) == {"counter": "dev_internal_queue_oob"}


def test_switchdev_vport_q_counter_wraps_not_resets():
    tracker = CounterTracker()
    iface = "enp8s0f0np0"
    for i, name in enumerate(("mlx5-switchdev-uplink-rep.t0.txt", "mlx5-switchdev-uplink-rep.t1.txt")):
        rs = stat_readings(iface, parse_ethtool_stats(text("ethtool", name)), classify_stat)
        _, deltas, _ = tracker.process(rs, float(i))
    d = {dict(x.labels).get("counter"): x.delta for x in deltas if x.family == "fabricmon_netdev_phy_errors_total"}
    # 4294967290 -> 10 on a 32-bit register is +16, not a reset to 10 (nor a lost count)
    assert d["rx_vport_out_of_buffer"] == 16


@pytest.mark.parametrize("name", ["rx_out_of_buffer", "rx_if_down_packets", "rx_vport_out_of_buffer",
                                  "dev_internal_queue_oob", "dev_out_of_buffer"])
def test_q_counters_are_32_bit(name):
    c = classify_stat(name)
    assert c is not None and c.width == 32 and c.semantics.value == "wrapping"
