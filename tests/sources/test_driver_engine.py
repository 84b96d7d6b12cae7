"""A Broadcom NIC end to end: agent sources over a bnxt fixture tree, the counter tracker, the
stream's batch maker, the wire codec and the real Engine.

The bnxt_re resource gauges (active_qps, active_cqs, db_fifo_register) fall in every batch while
the link has a 10 s burst of FCS errors.  Read as levels they are gauges, so the burst opens
FabricLinkErrors; read as counters (what the agent did before the driver tables: every fall a
"reset"), the engine dropped every pending link event of that NIC and nothing opened, which the
control case reproduces with the old classification.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from fabricmon.agent.stream_batches import BatchMaker
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import READ_DELTA_FAMILIES, Engine
from fabricmon.batch import NicHello, NodeHello
from fabricmon.counters import CounterTracker
from fabricmon.model import Snapshot
from fabricmon.proto.codec import SeriesDecoder, SeriesEncoder
from fabricmon.sources.drivers import StatRule
from fabricmon.sources.drivers.families import HW_STAT
from fabricmon.sources.drivers.rdma_tables import BNXT_RE
from fabricmon.sources.ethtool import EthtoolSource
from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import discover
from fabricmon.topology import generate_topology
from support.paths import FIXTURES

TREE = FIXTURES / "drivers" / "bnxt-thor2-gen1" / "node"
T0 = 1_764_000_000.0
NODE = "node-003"
GAUGES = ("active_qps", "active_cqs", "active_mrs", "db_fifo_register")


def _set_stat(path: Path, name: str, value: int) -> None:
    lines = path.read_text().splitlines()
    out = [f"     {name}: {value}" if ln.strip().startswith(name + ":") else ln for ln in lines]
    path.write_text("\n".join(out) + "\n")


def run_node(tmp: Path, seconds: int = 60, burst: tuple[int, int] = (20, 30)) -> list:
    """One Broadcom node through the real pipeline into a real Engine; the incidents reported."""
    node = tmp / "node"
    shutil.copytree(TREE, node, symlinks=True)
    hw = node / "sys/class/infiniband/bnxt_re0/ports/1/hw_counters"
    eth = node / "ethtool" / "ens41f0np0.txt"
    inv = discover(str(node / "sys"))
    ib, et = InfinibandSource(timeout=1.0), EthtoolSource(ethtool_dir=str(node / "ethtool"))
    tracker = CounterTracker()
    maker = BatchMaker(NODE, None, 1, collections.Counter())
    enc, dec = SeriesEncoder(), SeriesDecoder(read_families=READ_DELTA_FAMILIES)
    engine = Engine(generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test"), DetectionSettings())
    engine.hello(NodeHello(NODE, "test", 1.0, tuple(
        NicHello(p.device, p.port, p.rail, "Ethernet", p.netdev, 400.0, 4, int(p.rail)) for p in inv.ports), 8,
        "boot-1"))
    fcs = 100
    reported = []
    for k in range(seconds):
        t = T0 + k
        for i, name in enumerate(GAUGES):  # levels falling every second (QPs torn down after a job)
            (hw / name).write_text(f"{50_000 - 700 * k - i}\n")
        if burst[0] <= k < burst[1]:
            fcs += 500
        _set_stat(eth, "rx_fcs_err_frames", fcs)
        readings = ib.poll(inv).readings + et.poll(inv).readings
        samples, deltas, sat = tracker.process(readings, t)
        snap = Snapshot(NODE, t, k + 1, tuple(samples) + tuple(sat), tuple(deltas), 1.0 if k else 0.0, ())
        wire = enc.encode(maker.convert(snap))
        assert engine.ingest(dec.decode(wire, NODE)) is not False
        reported += [(k, inc.alertname, inc.component, inc.open) for inc in engine.tick(t)]
    return reported


def test_broadcom_link_error_burst_opens_its_incident_while_gauges_fall(tmp_path: Path) -> None:
    reported = run_node(tmp_path)
    opened = [(k, comp) for k, alert, comp, is_open in reported if alert == "FabricLinkErrors" and is_open]
    assert opened and opened[0][1] == f"{NODE}/bnxt_re0/1", reported
    assert 20 <= opened[0][0] <= 25  # within 5 s of the burst's start
    assert all(comp == f"{NODE}/bnxt_re0/1" for _, comp in opened)


def test_control_gauges_read_as_counters_hide_the_burst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure this guards against, reproduced: the same run with the gauges classified as
    64-bit counters (as before the driver tables) opens nothing."""
    for name in GAUGES:
        monkeypatch.setitem(BNXT_RE._exact, name, StatRule(name, HW_STAT, (("counter", "{name}"),)))
    reported = run_node(tmp_path)
    assert not [r for r in reported if r[1] == "FabricLinkErrors"], reported
