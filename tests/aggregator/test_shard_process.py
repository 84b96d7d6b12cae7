"""``fabricmon agent`` with a shard section, as processes: it streams to its unit's owner, not the other
replica, says where on /metrics, and refuses a changed shard section on SIGHUP (needs a restart).

Real processes (two ``fabricmon aggregator``, one ``fabricmon agent``), real gRPC and HTTP over
127.0.0.1; the node's hardware is a simulated tree.  Waits are on log lines and /metrics answers.
"""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree
from support.procrig import Proc, free_port, metrics, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX signals")
pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

SPEC = ClusterSpec(4, "roce", 2, seed=5)  # units 0 (node-000, node-001) and 1 (node-002, node-003)


def _value(body: str, pattern: str) -> float | None:
    m = re.search(rf"^{pattern} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def test_agent_process_streams_to_its_units_replica_only(tmp_path):
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump({
        "cluster": "shards", "layout": SPEC.layout, "nodes_per_unit": SPEC.nodes_per_unit,
        "generate": {"nodes": SPEC.nodes, "gpus_per_node": NGPU, "rails": NRAILS}}))
    procs: list[Proc] = []
    try:
        aggs = []
        for k in range(2):
            g, h = free_port(), free_port()
            p = tmp_path / f"aggregator-{k}.yaml"
            p.write_text(yaml.safe_dump({"topology": "topology.yaml", "grpc_listen": f"127.0.0.1:{g}",
                                         "http_listen": f"127.0.0.1:{h}", "tick_seconds": 0.2,
                                         "auth": {"insecure": True}, "shard": {"units": [k]}}))
            proc = Proc(["aggregator", "--config", str(p), "--log-format", "json"], tmp_path / f"agg-{k}.log")
            procs.append(proc)
            aggs.append((proc, g, h))
        for proc, _, _ in aggs:
            assert proc.wait_log("aggregator_started"), proc.text()
        (tmp_path / "shards.yaml").write_text(yaml.safe_dump({"topology": "topology.yaml", "replicas": [
            {"name": f"agg-{k}", "address": f"127.0.0.1:{g}", "units": [k]} for k, (_, g, _) in enumerate(aggs)]}))

        sim = ClusterState(Scenario(SPEC, 3600))
        sim.advance(1.0)
        tree = NodeTree(sim, 2, tmp_path / "node")  # node-002: unit 1
        tree.render()
        aport = free_port()
        cfg = {"sysfs_root": tree.sys, "ethtool_dir": tree.ethtool_dir, "node_name": tree.name,
               "nvml": f"fake:{tree.nvml_file}", "listen": f"127.0.0.1:{aport}", "interval": 0.2,
               "stream": {"spool_dir": str(tmp_path / "spool")}, "intake": {"listen": None, "socket": None},
               "log": {"format": "json"}, "shard": {"map": "shards.yaml", "topology": "topology.yaml"}}
        a_path = tmp_path / "agent.yaml"
        a_path.write_text(yaml.safe_dump(cfg))
        agent = Proc(["agent", "--config", str(a_path)], tmp_path / "agent.log")
        procs.append(agent)

        owner, other = aggs[1][2], aggs[0][2]
        assert wait_until(lambda: _value(metrics(owner), "fabricmon_agents_connected") == 1, 30), agent.text()
        assert _value(metrics(other), "fabricmon_agents_connected") == 0
        assert _value(metrics(other), "fabricmon_grpc_streams_total") == 0  # never even opened one
        line = next(ln for ln in agent.text().splitlines() if '"shard_target"' in ln)
        assert '"replica": "agg-1"' in line and '"via": "topology"' in line and f":{aggs[1][1]}" in line
        body = metrics(aport)
        assert (f'fabricmon_agent_shard_info{{aggregator="127.0.0.1:{aggs[1][1]}",node="node-002",'
                f'replica="agg-1",unit="1",via="topology"}} 1.0') in body

        # The shard section changed: refused with one log line, the stream stays where it was.
        a_path.write_text(yaml.safe_dump(dict(cfg, shard={"map": "shards.yaml", "unit": 0})))
        agent.hup()
        assert agent.wait_log('"config_reload_failed"'), agent.text()
        assert "shard changed: needs a restart" in agent.text()
        assert agent.alive()
        assert _value(metrics(owner), "fabricmon_agents_connected") == 1
        assert _value(metrics(other), "fabricmon_agents_connected") == 0
        assert agent.stop() == 0
    finally:
        for p in procs:
            p.stop()
