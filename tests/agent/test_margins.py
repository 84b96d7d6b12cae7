"""Pre-FEC BER and lane shares on the node: corrected bits over data rate x interval."""

from __future__ import annotations

import pytest

from fabricmon.agent.margins import BER, LANE_SHARE, link_margins
from fabricmon.model import CounterDelta, Sample, Snapshot
from fabricmon.sources.inventory import Inventory, PortInfo


def snap(interval: float, corrected: float, lanes: dict[int, float], reset: bool = False) -> Snapshot:
    inv = Inventory("", (), (PortInfo("mlx5_3", "1", "", "Ethernet", "eth3", "3"),))
    deltas = [CounterDelta("fabricmon_netdev_phy_corrected_bit_total", (("interface", "eth3"),), corrected,
                           reset=reset)]
    deltas += [CounterDelta("fabricmon_netdev_phy_errors_total", (("interface", "eth3"),
                                                                  ("counter", f"rx_err_lane_{k}_phy")), v)
               for k, v in lanes.items()]
    samples = (Sample("fabricmon_ib_port_data_rate_bytes_per_second", (("device", "mlx5_3"), ("port", "1")), 50e9),)
    return Snapshot("n", 100.0, 2, samples, tuple(deltas), interval, (), {"inventory": inv})


def test_ber_is_corrected_bits_over_data_rate_times_interval():
    out = {(s.family, s.labels): s.value for s in link_margins(snap(2.0, 8e5, {0: 1, 1: 1, 2: 6, 3: 0}))}
    assert out[(BER, (("interface", "eth3"),))] == pytest.approx(8e5 / (50e9 * 8 * 2.0))
    assert out[(LANE_SHARE, (("interface", "eth3"), ("lane", "2")))] == pytest.approx(0.75)
    assert out[(LANE_SHARE, (("interface", "eth3"), ("lane", "3")))] == 0.0


def test_no_margin_without_an_interval_or_across_a_reset():
    assert link_margins(snap(0.0, 8e5, {0: 1})) == []
    out = link_margins(snap(1.0, 8e5, {}, reset=True))
    assert [s.family for s in out] == []
