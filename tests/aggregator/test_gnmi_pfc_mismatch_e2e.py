"""End to end: a SONiC switch (the in-process gNMI target, tests/support/gnmitarget.py) whose port to a
host's RoCE NIC has PFC on priority 4 only; the gnmi_switches source reads it, the agent's poll and batch
maker carry it as the stream would, and the aggregator raises FabricConfigDrift check=pfc_mismatch naming
the host NIC and the switch port."""

from __future__ import annotations

from collections import defaultdict

import pytest
import yaml

from fabricmon.agent.poller import Poller
from fabricmon.agent.stream_batches import BatchMaker
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.config import GnmiSwitchesConfig, GnmiTargetConfig
from fabricmon.sources.gnmi_switches.source import GnmiSwitchesSource
from fabricmon.sources.inventory import Inventory
from fabricmon.topology import load_topology
from support.gnmitarget import ScriptedTarget, TargetServer
from support.waiting import wait_until

pytestmark = pytest.mark.integration


def test_a_pfc_priority_missing_on_a_sonic_port_raises_pfc_mismatch_naming_both_ends(tmp_path):
    doc = {"version": 2, "cluster": "roce-a", "layout": "roce", "rail_optimized": True,
           "leaves": {"leaf-02": {"spines": []}},
           "nodes": [{"name": "h7", "nics": [{"device": "mlx5_3", "interface": "ens5f0np0", "leaf": "leaf-02",
                                              "leaf_port": "Ethernet0", "rail": 3}]},
                     {"name": "h8", "nics": [{"device": "mlx5_3", "interface": "ens5f0np0", "leaf": "leaf-02",
                                              "leaf_port": "Ethernet4", "rail": 3}]},
                     {"name": "sw-agent", "nics": []}]}
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(doc))
    engine = Engine(load_topology(topo), DetectionSettings(config_persist_s=0.5))
    engine.switch_side.sources = frozenset({"sw-agent"})
    target = ScriptedTarget("sonic")
    target.set("", "PORT_QOS_MAP", "4", "Ethernet0/pfc_enable", target="CONFIG_DB")  # priority 3 left out
    server = TargetServer(target)
    cfg = GnmiSwitchesConfig(enabled=True, interval=1.0, stall_intervals=10.0, targets=(
        GnmiTargetConfig(name="leaf-02", address=server.address, profile="sonic", insecure=True),))
    source = GnmiSwitchesSource(cfg)
    poller = Poller("sw-agent", [source], lambda: Inventory(sysfs_root="/nonexistent"))
    maker = BatchMaker("sw-agent", None, 1, defaultdict(int))
    try:
        def step() -> list:
            snap = poller.poll_once()
            assert engine.ingest(maker.convert(snap))
            engine.tick(snap.ts)
            return [i for i in engine.open_incidents() if i.alertname == "FabricConfigDrift"]

        incs = wait_until(step, timeout=20, what="FabricConfigDrift from the switch end")
        assert [(i.component, i.labels["check"], i.labels["node"], i.labels["device"], i.labels["leaf"],
                 i.labels["switch_port"]) for i in incs] == [
            ("h7/mlx5_3@leaf-02/Ethernet0", "pfc_mismatch", "h7", "mlx5_3", "leaf-02", "Ethernet0")]
        assert "PFC off on priority 3" in " ".join(incs[0].evidence)
    finally:
        source.close()
        server.stop()
