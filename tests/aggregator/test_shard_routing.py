"""Agents land on the aggregator replica that owns their unit, and only there.

Two real aggregators (``build_runtime`` from one aggregator config with
``shard.ordinal_from_hostname``, as every StatefulSet replica runs it; hostnames
``fabricmon-aggregator-0`` and ``-1``) on 127.0.0.1, each owning one unit of a generated
topology.  Real agents (``build_live_agent`` from agent configs loaded from YAML, as
``fabricmon agent`` wires them) on simulated node trees in both units find their replica:
by the topology file, by an explicit unit, and by the node's Kubernetes label read from a
loopback HTTPS API server.  Only the hardware (sim trees) and the API server are stand-ins.
"""

from __future__ import annotations

import functools
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from fabricmon.agent.wiring import build_live_agent
from fabricmon.aggregator.config import load_aggregator_config
from fabricmon.aggregator.service import build_runtime
from fabricmon.config import load_agent_config
from fabricmon.shardmap import check_ownership, load_shard_map
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree
from support.waiting import wait_until

pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

# real agents and aggregators start here: a longer deadline than wait_until's default
_wait = functools.partial(wait_until, timeout=20.0)
SPEC = ClusterSpec(4, "roce", 2, seed=3)  # node-000, node-001: unit 0; node-002, node-003: unit 1



class Seen:
    """Every node whose hello or batch reached an engine (observed; the engine still gets all)."""

    def __init__(self, engine) -> None:
        self.nodes: set[str] = set()
        self.lock = threading.Lock()
        for name in ("hello", "ingest"):
            real = getattr(engine, name)

            def seen(arg, _real=real):
                with self.lock:
                    self.nodes.add(arg.node)
                return _real(arg)

            setattr(engine, name, seen)

    def get(self) -> set[str]:
        with self.lock:
            return set(self.nodes)


@pytest.fixture
def cluster(tmp_path):
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump({"cluster": "shards", "layout": SPEC.layout, "nodes_per_unit": SPEC.nodes_per_unit,
                                    "generate": {"nodes": SPEC.nodes, "gpus_per_node": NGPU, "rails": NRAILS}}))
    agg_path = tmp_path / "aggregator.yaml"
    agg_path.write_text(yaml.safe_dump({
        "topology": "topology.yaml", "grpc_listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
        "tick_seconds": 0.2, "auth": {"insecure": True},
        "shard": {"units_per_shard": 1, "ordinal_from_hostname": True}}))
    cfg = load_aggregator_config(agg_path)
    runtimes, seen = [], []
    try:
        for k in range(2):
            rt = build_runtime(cfg, hostname=f"fabricmon-aggregator-{k}")
            seen.append(Seen(rt.engine))
            runtimes.append(rt.start())
        shard_map = tmp_path / "shards.yaml"
        shard_map.write_text(yaml.safe_dump({"topology": "topology.yaml", "replicas": [
            {"name": f"fabricmon-aggregator-{k}", "address": rt.grpc_address, "units": [k]}
            for k, rt in enumerate(runtimes)]}))
        check_ownership(load_shard_map(shard_map), str(shard_map))  # what check-config would say of it
        sim = ClusterState(Scenario(SPEC, 3600))
        sim.advance(1.0)
        yield {"tmp": tmp_path, "runtimes": runtimes, "seen": seen, "sim": sim}
    finally:
        for rt in runtimes:
            rt.stop(grace=0.5, flush=0.5, final_tick=False)


def _agent(c, index: int, shard: dict):
    tmp: Path = c["tmp"]
    tree = NodeTree(c["sim"], index, tmp / f"n{index}")
    tree.render()
    path = tmp / f"agent-{index}.yaml"
    path.write_text(yaml.safe_dump({
        "sysfs_root": tree.sys, "ethtool_dir": tree.ethtool_dir, "node_name": tree.name,
        "nvml": f"fake:{tree.nvml_file}", "listen": "127.0.0.1:0", "interval": 0.3,
        "stream": {"spool_dir": str(tmp / f"spool-{index}")}, "intake": {"listen": None, "socket": None},
        "shard": {"map": "shards.yaml", **shard}}))
    agent = build_live_agent(load_agent_config(path), stream_backoff=(0.05, 0.5), source=str(path))
    agent.start_http("127.0.0.1:0")
    agent.start_polling()
    agent.start_supervisor(every=0.1)
    return agent


def _scrape(agent) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.http.port}/metrics", timeout=5) as r:
        return r.read().decode()


def _ingested(rt, node: str) -> bool:
    ns = rt.engine.nodes.get(node)
    return ns is not None and ns.last_seq >= 1


def test_each_agent_lands_on_the_replica_owning_its_unit(cluster, tmp_path):
    pytest.importorskip("cryptography", reason="tests/support/certs.py makes the API server's test CA")
    from support.kubeapi import FakeApiServer

    api = FakeApiServer(tmp_path / "api")
    api.nodes["node-003"] = {"fabricmon.io/unit": "1"}
    agg0, agg1 = cluster["runtimes"]
    seen0, seen1 = cluster["seen"]
    agents = []
    try:
        agents.append(_agent(cluster, 0, {"topology": "topology.yaml"}))          # unit 0 from the topology
        agents.append(_agent(cluster, 2, {"topology": "topology.yaml"}))          # unit 1 from the topology
        agents.append(_agent(cluster, 1, {"unit": 0}))                            # unit 0 given
        agents.append(_agent(cluster, 3, {"node_label": {                          # unit 1 from its label
            "api_server": api.url, "token_file": str(api.token_file), "ca_file": api.ca, "timeout": 2.0}}))
        assert _wait(lambda: all(_ingested(agg0, n) for n in ("node-000", "node-001"))
                     and all(_ingested(agg1, n) for n in ("node-002", "node-003"))), (seen0.get(), seen1.get())
        for a in agents:  # several batches each, so a stray one would have had its chance
            seq = a.stream.stats()["next_seq"]
            assert _wait(lambda a=a, seq=seq: a.stream.stats()["batches_acked_total"] >= 3
                         and a.stream.stats()["next_seq"] > seq)
        assert seen0.get() == {"node-000", "node-001"}
        assert seen1.get() == {"node-002", "node-003"}
        assert {n for n in agg0.engine.nodes} == {"node-000", "node-001"}
        assert {n for n in agg1.engine.nodes} == {"node-002", "node-003"}
        assert api.paths() == ["/api/v1/nodes/node-003"]
        # where each agent streams, as an SRE sees it on /metrics, and /readyz agrees
        via = {a.node: (a.shard.target.replica, a.shard.target.via) for a in agents}
        assert via == {"node-000": ("fabricmon-aggregator-0", "topology"),
                       "node-002": ("fabricmon-aggregator-1", "topology"),
                       "node-001": ("fabricmon-aggregator-0", "unit"),
                       "node-003": ("fabricmon-aggregator-1", "node_label")}
        body = _scrape(agents[3])
        assert (f'fabricmon_agent_shard_info{{aggregator="{agg1.grpc_address}",node="node-003",'
                f'replica="fabricmon-aggregator-1",unit="1",via="node_label"}} 1.0') in body
        assert "fabricmon_stream_connected{node=\"node-003\"} 1.0" in body
        assert _wait(lambda: all(a.not_ready() == [] for a in agents)), [a.not_ready() for a in agents]
    finally:
        for a in agents:
            a.stop()
        api.close()


def test_agent_waits_for_its_label_and_keeps_exporting(cluster, tmp_path):
    """The API server refuses (no RBAC yet): the agent polls and serves /metrics, /readyz says why;
    once allowed, the stream starts towards the label's replica."""
    pytest.importorskip("cryptography", reason="tests/support/certs.py makes the API server's test CA")
    from support.kubeapi import FakeApiServer

    api = FakeApiServer(tmp_path / "api")
    api.nodes["node-001"] = {"fabricmon.io/unit": "0"}
    api.status = 403
    agg0, _ = cluster["runtimes"]
    agent = _agent(cluster, 1, {"node_label": {"api_server": api.url, "token_file": str(api.token_file),
                                               "ca_file": api.ca, "timeout": 2.0}})
    try:
        assert _wait(lambda: agent.poller.latest is not None and len(api.requests) >= 2)
        problems = agent.not_ready()
        assert any("shard not resolved" in p and "403" in p for p in problems), problems
        body = _scrape(agent)
        assert 'fabricmon_agent_shard_resolved{node="node-001"} 0.0' in body
        assert "fabricmon_stream_connected{node=\"node-001\"} 0.0" in body  # exported before the stream exists
        assert agent.stream is None
        api.status = None
        assert _wait(lambda: _ingested(agg0, "node-001"))
        assert _wait(lambda: agent.not_ready() == []), agent.not_ready()
    finally:
        agent.stop()
        api.close()


def test_reload_refuses_a_changed_shard_section(cluster):
    from dataclasses import replace

    from fabricmon.configload import ConfigError

    agent = _agent(cluster, 0, {"topology": "topology.yaml"})
    try:
        new = replace(agent.cfg, shard=replace(agent.cfg.shard, unit=1))
        with pytest.raises(ConfigError, match=r"^shard changed: needs a restart"):
            agent.reload(new)
        assert agent.shard.target.replica == "fabricmon-aggregator-0"
    finally:
        agent.stop()
