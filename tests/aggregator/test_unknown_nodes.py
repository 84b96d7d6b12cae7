"""A node whose real hostname is not in the aggregator's topology is still monitored.

DESIGN "Topology from the fabric", last bullet: a streaming node missing from the topology is
monitored at node, NIC, link and GPU level (alerts without rail or leaf labels), warned once in the
log by name, counted in ``fabricmon_agents_unknown`` and raises one ``FabricmonUnknownNodes`` per
cluster listing them.  The end-to-end test runs a real ``fabricmon agent`` named ``gpu-a17-03`` (the
topology generates ``node-000``...) on a simulated tree with a flaky cable, streaming to a real
``fabricmon aggregator`` over 127.0.0.1; the engine tests cover the sharded owner and the fold.
"""

from __future__ import annotations

import json
import re
import sys
import threading

import pytest
import yaml

from fabricmon.aggregator.engine import Engine
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Fault, Scenario
from fabricmon.sim.tree import NodeTree
from fabricmon.topology import generate_topology
from support.agentrig import http_get
from support.enginerig import T0, Cluster, flaky
from support.procrig import Proc, free_port, metrics, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")
pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

SPEC = ClusterSpec(4, "roce", 2, seed=11)
UNKNOWN = "gpu-a17-03"


def _value(body: str, pattern: str) -> float | None:
    m = re.search(rf"^{pattern} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def _incidents(port: int) -> list[dict]:
    code, body = http_get(f"http://127.0.0.1:{port}/api/incidents?state=open")
    return json.loads(body) if code == 200 else []


@pytest.mark.integration
def test_agent_with_unknown_hostname_gets_its_flaky_cable_alerted(tmp_path):
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump({
        "cluster": "prod", "layout": SPEC.layout, "nodes_per_unit": SPEC.nodes_per_unit,
        "generate": {"nodes": SPEC.nodes, "gpus_per_node": NGPU, "rails": NRAILS}}))
    g, h = free_port(), free_port()
    (tmp_path / "aggregator.yaml").write_text(yaml.safe_dump({
        "topology": "topology.yaml", "grpc_listen": f"127.0.0.1:{g}", "http_listen": f"127.0.0.1:{h}",
        "tick_seconds": 0.2, "auth": {"insecure": True}}))
    sim = ClusterState(Scenario(SPEC, 3600, faults=(Fault("flaky_cable", 0.0, node="node-002", rail=3),)))
    sim.advance(1.0)
    tree = NodeTree(sim, 2, tmp_path / "node")
    tree.render()
    stop = threading.Event()

    def advance() -> None:  # the cable keeps erring while the agent polls (bounded: 600 steps)
        for _ in range(600):
            if stop.wait(0.2):
                return
            sim.advance(1.0)
            tree.render()

    mover = threading.Thread(target=advance, daemon=True)
    procs: list[Proc] = []
    try:
        agg = Proc(["aggregator", "--config", str(tmp_path / "aggregator.yaml"), "--log-format", "json"],
                   tmp_path / "agg.log")
        procs.append(agg)
        assert agg.wait_log("aggregator_started"), agg.text()
        a_path = tmp_path / "agent.yaml"
        a_path.write_text(yaml.safe_dump({
            "sysfs_root": str(tree.sys), "ethtool_dir": str(tree.ethtool_dir), "node_name": UNKNOWN,
            "nvml": f"fake:{tree.nvml_file}", "listen": f"127.0.0.1:{free_port()}", "interval": 0.2,
            "aggregator": f"127.0.0.1:{g}", "stream": {"spool_dir": str(tmp_path / "spool")},
            "intake": {"listen": None, "socket": None}, "log": {"format": "json"}}))
        mover.start()
        procs.append(Proc(["agent", "--config", str(a_path)], tmp_path / "agent.log"))

        def link_incident() -> dict | None:
            return next((i for i in _incidents(h) if i["alertname"] == "FabricLinkErrors"), None)

        assert wait_until(lambda: link_incident() is not None, 45), (agg.text()[-3000:], _incidents(h))
        inc = link_incident()
        assert inc["component"] == f"{UNKNOWN}/mlx5_3/1" and inc["component_type"] == "link"
        # no rail or leaf the topology does not know: they would scope inhibitions cluster-wide
        assert inc["labels"]["node"] == UNKNOWN
        assert "leaf" not in inc["labels"] and "rail" not in inc["labels"]

        unknown = [i for i in _incidents(h) if i["alertname"] == "FabricmonUnknownNodes"]
        assert len(unknown) == 1 and unknown[0]["component_type"] == "config", _incidents(h)
        assert UNKNOWN in unknown[0]["description"]
        assert unknown[0]["severity"] == "warning"
        assert "node" not in unknown[0]["labels"]  # one per cluster, not one per node
        assert _value(metrics(h), "fabricmon_agents_unknown") == 1
        code, body = http_get(f"http://127.0.0.1:{h}/api/nodes")
        view = json.loads(body)
        assert code == 200 and view["unknown"] == [UNKNOWN]
        row = next(r for r in view["nodes"] if r["node"] == UNKNOWN)
        assert row["connected"] and not row["in_topology"] and row["unit"] is None
        warned = [ln for ln in agg.text().splitlines() if '"unknown_node"' in ln]
        assert len(warned) == 1 and UNKNOWN in warned[0]
    finally:
        stop.set()
        for p in procs:
            p.stop()


def test_unknown_nodes_are_one_cluster_alert_and_resolve_when_they_leave():
    c = Cluster(nodes=4, nodes_per_unit=2)
    for name, real in (("node-003", "gpu-a17-03"), ("node-002", "gpu-a17-02")):
        f = c.feeds.pop(name)
        f.node = real
        c.feeds[f.node] = f
        c.engine.hello(f.hello())
    c.run(10)
    alerts = [i for i in c.engine.incidents() if i.alertname == "FabricmonUnknownNodes"]
    assert len(alerts) == 1 and alerts[0].component == "topology" and alerts[0].component_type == "config"
    assert alerts[0].labels == {"cluster": "test"}  # one per cluster: no node label
    assert "gpu-a17-02, gpu-a17-03" in alerts[0].description
    assert c.engine.node_registry.unknown_nodes() == ["gpu-a17-02", "gpu-a17-03"]
    c.run(30, flaky("gpu-a17-03", "mlx5_1"))
    link = [i for i in c.engine.incidents() if i.alertname == "FabricLinkErrors"]
    assert [i.component for i in link] == ["gpu-a17-03/mlx5_1/1"]
    assert link[0].labels == {"node": "gpu-a17-03", "cluster": "test"}
    # the unknown nodes go away (renamed back, say): the cluster alert resolves once
    for name in ("gpu-a17-02", "gpu-a17-03"):
        c.engine.disconnected(name)
        c.feeds.pop(name)
    c.run(400)
    assert alerts[0].resolved_at is not None
    assert c.engine.node_registry.unknown_nodes() == []


def test_a_shard_monitors_the_unknown_node_that_streams_to_it_and_drops_other_units_nodes():
    """Agents with no unit dial ``shard.unknown_owner``; a node labelled with a unit this topology lacks
    lands on that unit's owner.  Either way the replica it streams to monitors it (today: dropped)."""
    topo = generate_topology(4, nodes_per_unit=2, layout="roce", cluster="test")
    shard = Engine(topo, shard_units=(0,))
    c = Cluster(nodes=4, nodes_per_unit=2)
    f = c.feeds["node-003"]  # unit 1: another replica's
    shard.hello(f.hello())
    assert "node-003" not in shard.nodes
    f.node = UNKNOWN
    shard.hello(f.hello())
    assert shard.node_registry.unknown_nodes() == [UNKNOWN] and UNKNOWN in shard.nodes
    assert shard.ingest(f.batch(T0 + 1.0, first=True))


def test_topology_nodes_never_heard_from_are_listed_after_the_start_up_grace():
    topo = generate_topology(4, nodes_per_unit=2, layout="roce", cluster="test")
    engine = Engine(topo)
    c = Cluster(nodes=4, nodes_per_unit=2)
    feeds = [c.feeds[n] for n in ("node-000", "node-001", "node-002")]  # node-003 never comes
    for k in range(1, 91):
        for f in feeds:
            if k == 1:
                engine.hello(f.hello())
            engine.ingest(f.batch(T0 + k, first=(k == 1)))
        engine.tick(T0 + k)
        if k == 30:  # inside max(60 s, 5 intervals): agents may still be reconnecting
            assert engine.node_registry.nodes_view()["never_connected"] == []
            assert engine.views.metrics_snapshot()["never_connected"] == []
    assert engine.node_registry.nodes_view()["never_connected"] == ["node-003"]
    assert engine.views.metrics_snapshot()["never_connected"] == ["node-003"]
    # exported one series per node (FabricmonNodesNeverConnected lists them) beside the count
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    from fabricmon.aggregator.http_api import AggregatorCollector

    reg = CollectorRegistry()
    reg.register(AggregatorCollector(engine))
    text = generate_latest(reg).decode()
    assert 'fabricmon_agent_never_connected{node="node-003"} 1.0' in text
    assert "fabricmon_agents_never_connected 1.0" in text
    assert "fabricmon_aggregator_resuming 0.0" in text  # 90 s in: past the grace, nothing restored
    assert engine.node_registry.unknown_nodes() == []
