"""InfiniBand sysfs as real kernels and drivers write it (drivers/infiniband/core/sysfs.c, MLNX_OFED mlx4)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricmon.sources.infiniband import InfinibandSource, data_rate_gbps, parse_rate
from fabricmon.sources.inventory import Inventory, PortInfo
from support.realformat import fixture


def poll_mlx4() -> dict:
    root = fixture("sysfs", "mlx4-ofed-counters-ext")
    port = PortInfo("mlx4_0", "1", str(root / "class/infiniband/mlx4_0/ports/1"), "InfiniBand", "", "0")
    res = InfinibandSource(timeout=1.0).poll(Inventory(str(root), ports=(port,)))
    assert res.errors == 0, res.messages
    return {(r.family, tuple(kv for kv in r.labels if kv[0] not in ("device", "port"))): r for r in res.readings}


def test_dead_counters_ext_does_not_hide_live_counters():
    # counters_ext/port_rcv_packets_64 reads 0 on a real mlx4 HCA; counters/port_rcv_packets holds billions.
    m = poll_mlx4()
    assert m[("fabricmon_ib_port_receive_packets_total", ())].value == 5123456789
    assert m[("fabricmon_ib_port_transmit_packets_total", ())].value == 4987654321
    # a 64-bit count past 2^32 is not a pinned 32-bit counter
    assert m[("fabricmon_ib_port_error_saturated", (("counter", "port_rcv_packets"),))].value == 0


def test_pinned_32_bit_counter_gives_way_to_live_64_bit_twin():
    m = poll_mlx4()
    r = m[("fabricmon_ib_port_receive_bytes_total", ())]
    assert r.value * r.scale == 987654321000 * 4
    assert m[("fabricmon_ib_port_error_saturated", (("counter", "port_rcv_data"),))].value == 0
    # ext-only files keep their modern names
    assert ("fabricmon_ib_port_pma_total", (("counter", "unicast_rcv_packets"),)) in m


@pytest.mark.parametrize("text,link_layer,data_gbps", [
    ("10 Gb/sec (4X)", "InfiniBand", 8.0),            # SDR, kernels before 4.x print no speed name
    ("20 Gb/sec (4X DDR)", "InfiniBand", 16.0),
    ("40 Gb/sec (4X QDR)", "InfiniBand", 32.0),        # 8b/10b: 80% of the signalled rate
    ("40 Gb/sec (4X FDR10)", "InfiniBand", 40.0),      # 10.3125 GBd x 64/66
    ("56 Gb/sec (4X FDR)", "InfiniBand", 54.5454545),  # 14.0625 GBd x 64/66 x 4
    ("100 Gb/sec (4X EDR)", "InfiniBand", 100.0),
    ("400 Gb/sec (4X NDR)", "InfiniBand", 400.0),
    ("40 Gb/sec (4X QDR)", "Ethernet", 40.0),          # 40GbE shown in IB clothing: already a data rate
])
def test_data_rate_removes_line_coding(text, link_layer, data_gbps):
    assert data_rate_gbps(parse_rate(text), link_layer) == pytest.approx(data_gbps)


def test_fdr_port_exports_data_rate():
    m = poll_mlx4()
    assert m[("fabricmon_ib_port_rate_bytes_per_second", ())].value == 56e9 / 8
    assert m[("fabricmon_ib_port_data_rate_bytes_per_second",
              ())].value == pytest.approx(56e9 * 64 / 66 * 14.0625 / 14 / 8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 1 << 20)), min_size=2, max_size=6),
       st.integers(0, 1 << 33), st.integers(0, 1 << 33))
def test_switching_between_twins_never_goes_backwards(tmp_path, steps, a0, b0):
    # counters/ and counters_ext/ each grow on their own (one may be dead, one pinned): the exported
    # value must never decrease, or the tracker would see a reset.
    port = Path(tempfile.mkdtemp(dir=tmp_path)) / "ports" / "1"
    for d in ("counters", "counters_ext"):
        (port / d).mkdir(parents=True)
    for f, v in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", "56 Gb/sec (4X FDR)"),
                 ("link_layer", "InfiniBand")):
        (port / f).write_text(v + "\n")
    src = InfinibandSource(timeout=1.0)
    inv = Inventory(str(tmp_path), ports=(PortInfo("mlx4_0", "1", str(port), "InfiniBand", "", ""),))
    a, b, last = a0, b0, -1
    for da, db in steps:
        a, b = a + da, b + db
        (port / "counters" / "port_rcv_packets").write_text(f"{min(a, (1 << 32) - 1)}\n")
        (port / "counters_ext" / "port_rcv_packets_64").write_text(f"{b}\n")
        got = [r.value for r in src.poll(inv).readings if r.family == "fabricmon_ib_port_receive_packets_total"]
        assert len(got) == 1 and got[0] >= last
        last = got[0]
