"""Sharded, end to end: ibsim + opensm (tests/support/ibsimrig.py), the real agent with ``--ib-switches`` and a
shard map streaming to two real aggregator shards (gRPC on 127.0.0.1; A owns unit 0 = leaf-00, B unit 1 =
leaf-01 of the topology imported from that fabric), both sending to a real Alertmanager running the shipped
deploy/alertmanager/alertmanager.yml and reading the other's alerts back from it (remote_evidence.py).
Symbol errors climb on both leaves' uplinks to spine-00: each shard raises its own leaf's uplink only, and
FabricSpineDegraded comes from the shards' summaries, sent once (by A, the shard of the first bad leaf),
hiding B's uplink in Alertmanager."""

from __future__ import annotations

import time

import pytest
import yaml

from fabricmon.cli import main
from support.agentrig import metric
from support.aggrig import Aggregator
from support.ibsimrig import IbSim, SweeperAgent, missing_tools, two_tier
from support.promtools import REPO, running_alertmanager
from support.waiting import wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing_tools()), reason=f"not installed: {missing_tools()}")]

SWEEPER = "sweeper-0"  # its own identity, not a topology node (as the DaemonSet's <node>-ibsweep)
UPLINKS = (("leaf-00", 3), ("leaf-01", 3))  # both to spine-00


def _guid(fabric, name: str) -> int:
    return next(g for g, n in fabric.nodes.items() if n.kind == "switch" and f";{name}:" in n.description)


def _open(agg: Aggregator) -> set[tuple[str, str]]:
    return {(i["alertname"], i["component"]) for i in agg.incidents("open")}


def test_two_shards_keep_their_own_leaves_and_decide_the_spine_together(tmp_path):
    fabric = two_tier(2, 2, 2)
    config = (REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    with IbSim(fabric, tmp_path / "sim") as sim, running_alertmanager(config, tmp_path / "am") as am:
        ibnet = tmp_path / "fabric.ibnet"
        ibnet.write_text(sim.run("ibnetdiscover").stdout)
        topo = tmp_path / "topology.yaml"
        assert main(["topology", "import", "--ibnetdiscover", str(ibnet), "-o", str(topo)]) == 0
        shards: list[Aggregator] = []
        try:
            for unit in (0, 1):
                (tmp_path / f"agg{unit}").mkdir()
                shards.append(Aggregator(tmp_path / f"agg{unit}", {"insecure": True, "switch_sources": [SWEEPER]},
                                         topology=topo.read_text(), extra={
                    "cluster": "lab", "shard": {"units": [unit]}, "detection": {"leaf_fold_min_links": 2},
                    "alertmanager": {"urls": [am.url], "resend_seconds": 1, "evidence_poll_seconds": 0.5}}))
            a, b = shards
            shard_map = tmp_path / "shards.yaml"
            shard_map.write_text(yaml.safe_dump({"replicas": [
                {"name": "agg-0", "address": f"127.0.0.1:{a.grpc}", "units": [0]},
                {"name": "agg-1", "address": f"127.0.0.1:{b.grpc}", "units": [1]}]}))
            with SweeperAgent(sim, tmp_path / "agent", health=1.0, full=1.0, node=SWEEPER,
                              extra={"shard": {"map": str(shard_map), "topology": str(topo)}}) as agent:
                wait_until(lambda: metric(agent.metrics(), "fabricmon_switch_port_up", switch="leaf-01",
                                          port="3") == 1, 60.0, "the first sweep")
                guids = {leaf: _guid(fabric, leaf) for leaf, _ in UPLINKS}
                value = 0
                deadline = time.monotonic() + 90.0
                while not ({("FabricSpineDegraded", "spine-00")} <= _open(a)) and time.monotonic() < deadline:
                    value = min(value + 300, 65535)
                    for leaf, port in UPLINKS:
                        sim.performance_set(guids[leaf], port, "PortCounters.SymbolErrorCounter", value)
                    wait_until(lambda want=value: all(metric(
                        agent.metrics(), "fabricmon_switch_port_errors_total", switch=leaf, port=str(port),
                        counter="symbol_error") == want for leaf, port in UPLINKS), 20.0, f"value {value} exported")
                seen_a, seen_b = _open(a), _open(b)
                assert ("FabricSpineDegraded", "spine-00") in seen_a, (seen_a, seen_b)
                # each shard its own leaf's uplink; the spine once, from the shard of the first bad leaf
                assert {c for n, c in seen_a if n == "FabricLinkErrors"} <= {"leaf-00/p3"}
                assert ("FabricLinkErrors", "leaf-01/p3") in seen_b
                assert {n for n, _ in seen_b} == {"FabricLinkErrors"} and {c for _, c in seen_b} == {"leaf-01/p3"}
                spine = next(i for i in a.incidents("open") if i["alertname"] == "FabricSpineDegraded")
                assert "leaf-01" in spine["description"] or "leaf-01" in " ".join(spine.get("evidence", []))
                # in Alertmanager: the spine's alert active, B's uplink under it inhibited (equal: cluster, spine)

                def state(name: str, component: str) -> str:
                    return next((x["status"]["state"] for x in am.get_alerts(alertname=name, cluster="lab")
                                 if x["labels"]["component"] == component), "")

                wait_until(lambda: state("FabricSpineDegraded", "spine-00") == "active"
                           and state("FabricLinkErrors", "leaf-01/p3") == "suppressed", 20.0,
                           "the spine's alert hiding B's uplink in Alertmanager")
        finally:
            for s in shards:
                s.close()
