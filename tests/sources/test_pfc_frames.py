"""A PFC storm on NICs that count pause differently from mlx5 opens the same incident (FabricPFCStorm).

Intel E810 (ice) counts XOFF frames per traffic class and no pause time; Broadcom (bnxt_en) gives
pause time per priority (``pfc_pri<n>_{rx,tx}_duration_us``).  Each node runs end to end: the agent's
sources over the driver's fixture tree (tests/fixtures/drivers, names from the driver sources), the
counter tracker, the stream's batch maker, the wire codec and the real Engine.  The storm is the
slow receiver's: it sends pause on the RoCE class most of each second and receives little.
"""

from __future__ import annotations

import collections
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fabricmon.agent.stream_batches import BatchMaker
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import READ_DELTA_FAMILIES, Engine
from fabricmon.batch import NicHello, NodeHello
from fabricmon.counters import CounterTracker
from fabricmon.model import Snapshot
from fabricmon.proto.codec import SeriesDecoder, SeriesEncoder
from fabricmon.sources.drivers.ethtool_tables import ICE, ICE_XOFF_REFRESH
from fabricmon.sources.ethtool import EthtoolSource
from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import discover
from fabricmon.topology import generate_topology
from support.paths import FIXTURES

DRIVERS = FIXTURES / "drivers"
T0 = 1_764_000_000.0
NODE = "node-003"
# ice at the fixture's 100 Gb/s: XOFF frames a second a port sends while paused throughout (5,960)
ICE_FULL = ICE_XOFF_REFRESH.frames_per_second(100.0)


def _values(path: Path) -> dict[str, int]:
    out = {}
    for ln in path.read_text().splitlines()[1:]:
        name, _, value = ln.strip().rpartition(": ")
        out[name] = int(value)
    return out


def _write(path: Path, values: dict[str, int]) -> None:
    path.write_text("NIC statistics:\n" + "".join(f"     {n}: {v}\n" for n, v in values.items()))


def run_node(tmp: Path, tree: str, ifname: str, step: Callable[[dict[str, int], int], None],
             seconds: int = 40, gbps: float = 400.0) -> list[tuple[int, str, str, bool, tuple[str, ...]]]:
    """One node of ``tree`` through the real pipeline into a real Engine; ``step(stats, k)`` advances the
    netdev's ``ethtool -S`` values (read from the fixture) each second.  The incidents reported."""
    node = tmp / "node"
    shutil.copytree(DRIVERS / tree / "node", node, symlinks=True)
    eth = node / "ethtool" / f"{ifname}.txt"
    stats = _values(eth)
    inv = discover(str(node / "sys"))
    ib, et = InfinibandSource(timeout=1.0), EthtoolSource(ethtool_dir=str(node / "ethtool"))
    tracker = CounterTracker()
    maker = BatchMaker(NODE, None, 1, collections.Counter())
    enc, dec = SeriesEncoder(), SeriesDecoder(read_families=READ_DELTA_FAMILIES)
    engine = Engine(generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test"), DetectionSettings())
    engine.hello(NodeHello(NODE, "test", 1.0, tuple(
        NicHello(p.device, p.port, p.rail, "Ethernet", p.netdev, gbps, 4, int(p.rail)) for p in inv.ports), 8,
        "boot-1"))
    reported = []
    for k in range(seconds):
        t = T0 + k
        step(stats, k)
        _write(eth, stats)
        readings = ib.poll(inv).readings + et.poll(inv).readings
        samples, deltas, sat = tracker.process(readings, t)
        snap = Snapshot(NODE, t, k + 1, tuple(samples) + tuple(sat), tuple(deltas), 1.0 if k else 0.0, ())
        assert engine.ingest(dec.decode(enc.encode(maker.convert(snap)), NODE)) is not False
        reported += [(k, i.alertname, i.component, i.open, tuple(i.evidence)) for i in engine.tick(t)]
    return reported


def _ice_xoff(tx_per_s: float, rx_per_s: float = 20.0, start: int = 10) -> Callable[[dict[str, int], int], None]:
    def step(stats: dict[str, int], k: int) -> None:
        if k >= start:
            stats["tx_priority_3_xoff.nic"] += round(tx_per_s)
            stats["rx_priority_3_xoff.nic"] += round(rx_per_s)
            stats["tx_priority_3_xon.nic"] += round(tx_per_s / 10)  # XON frames are not pause
    return step


def _opened(reported: list, alert: str = "FabricPFCStorm") -> list:
    return [r for r in reported if r[1] == alert and r[3]]


def test_ice_pfc_storm_from_xoff_frames_opens_the_incident(tmp_path: Path) -> None:
    # the slow receiver: XOFF on traffic class 3 at 85% of the rate of a port paused throughout
    reported = run_node(tmp_path, "ice-irdma-e810", "ens801f0np0", _ice_xoff(0.85 * ICE_FULL), gbps=100.0)
    opened = _opened(reported)
    assert opened, reported
    k, _, component, _, evidence = opened[0]
    assert component == f"{NODE}/irdma0/1"
    assert 10 <= k <= 14, opened  # within a few seconds of the storm's start (2 of 3 windows)
    assert "traffic class 3 (from XOFF frames)" in evidence[0] and "85%" in evidence[0], evidence


def test_ice_steady_low_xoff_rate_opens_nothing(tmp_path: Path) -> None:
    # ordinary PFC on a busy RoCE class: 300 XOFF/s (5% of the time) for the whole run, and a third of
    # the time for the last part: neither is a storm
    def step(stats: dict[str, int], k: int) -> None:
        rate = 300.0 if k < 25 else 0.3 * ICE_FULL
        _ice_xoff(rate, start=0)(stats, k)
    reported = run_node(tmp_path, "ice-irdma-e810", "ens801f0np0", step, gbps=100.0)
    assert not _opened(reported), reported


def test_ice_victim_receiving_pause_is_not_blamed(tmp_path: Path) -> None:
    # the victim: it receives XOFF most of the time and sends as much back (a chain): not the culprit
    reported = run_node(tmp_path, "ice-irdma-e810", "ens801f0np0",
                        _ice_xoff(0.85 * ICE_FULL, rx_per_s=0.9 * ICE_FULL), gbps=100.0)
    assert not _opened(reported), reported


def test_bnxt_pfc_storm_from_pause_duration_opens_the_incident(tmp_path: Path) -> None:
    # bnxt_en gives pause time (pfc_pri3_tx_duration_us): 850 ms of every second on priority 3
    def step(stats: dict[str, int], k: int) -> None:
        if k >= 10:
            stats["pfc_pri3_tx_duration_us"] += 850_000
            stats["tx_pfc_ena_frames_pri3"] += 20_000  # its frames are counted too, but time decides
    reported = run_node(tmp_path, "bnxt-thor2-gen2", "ens41f0np0", step)
    opened = _opened(reported)
    assert opened and opened[0][2] == f"{NODE}/bnxt_re0/1", reported
    assert 10 <= opened[0][0] <= 14
    assert "priority 3" in opened[0][4][0] and "85%" in opened[0][4][0], opened


def test_control_without_the_drivers_xoff_refresh_the_storm_is_unseen(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What this guards against, reproduced: without the driver's XOFF refresh (what the agent had
    before) the frames reach no detector and the same storm opens nothing."""
    monkeypatch.setattr(ICE, "xoff_refresh", None)
    reported = run_node(tmp_path, "ice-irdma-e810", "ens801f0np0", _ice_xoff(0.85 * ICE_FULL), gbps=100.0)
    assert not _opened(reported), reported
