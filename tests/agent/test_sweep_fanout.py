"""Sharded aggregators and the switch sweep (agent/sweep_fanout.py): an agent with sources.ib_switches enabled
streams to every replica, each stream with its own spool; without the sweep a node streams to its unit's
owner alone, as before; with shard.kubernetes the replicas come from the topology's units, which must then
be given."""

from __future__ import annotations

import pytest
import yaml

from fabricmon.agent.wiring import build_live_agent
from fabricmon.config import ConfigError, load_agent_config
from fabricmon.topology import generate_topology


@pytest.fixture
def files(tmp_path):
    """topology.yaml: 48 nodes, 16 per unit (units 0..2); shards.yaml: three replicas on closed loopback ports."""
    generate_topology(48, nodes_per_unit=16, cluster="t").write_yaml(tmp_path / "topology.yaml")
    (tmp_path / "shards.yaml").write_text(yaml.safe_dump({"replicas": [
        {"name": "agg-0", "address": "127.0.0.1:9", "units": [0]},
        {"name": "agg-1", "address": "127.0.0.2:9", "units": [1]},
        {"name": "agg-2", "address": "127.0.0.3:9", "units": [2]}]}))
    return tmp_path


def _agent(d, shard: dict, sweep: bool):
    (d / "sys").mkdir(exist_ok=True)
    p = d / "agent.yaml"
    p.write_text(yaml.safe_dump({
        "node_name": "node-020-ibsweep", "sysfs_root": str(d / "sys"), "nvml": "off", "shard": shard,
        "sources": {"ib_switches": {"enabled": sweep}},
        "intake": {"listen": None, "socket": None}, "stream": {"spool_dir": str(d / "spool")}}))
    return build_live_agent(load_agent_config(p), stream_backoff=(30.0, 60.0), source=str(p))


def _streams(agent) -> list:
    return [x for x in agent.extras if type(x).__name__ == "StreamClient"]


def test_the_sweeper_streams_to_every_replica_with_a_spool_each(files):
    agent = _agent(files, {"map": "shards.yaml", "topology": "topology.yaml"}, sweep=True)
    try:
        streams = _streams(agent)
        assert sorted(s.options.target for s in streams) == ["127.0.0.1:9", "127.0.0.2:9", "127.0.0.3:9"]
        assert agent.stream is streams[0] and agent.shard is None
        spools = {str(s.state.spool.directory) for s in streams}
        assert spools == {str(files / "spool" / r) for r in ("agg-0", "agg-1", "agg-2")}
    finally:
        for x in agent.extras:
            x.stop()


def test_without_the_sweep_a_node_streams_to_its_owner_alone(files):
    agent = _agent(files, {"map": "shards.yaml", "unit": 1}, sweep=False)
    try:
        assert agent.shard is not None and agent.shard.target.replica == "agg-1"
        assert [s.options.target for s in _streams(agent)] == [] and agent.stream.options.target == "127.0.0.2:9"
    finally:
        for x in agent.extras:
            x.stop()


def test_kubernetes_replicas_from_the_topology_units_and_required_there(files):
    agent = _agent(files, {"kubernetes": {"units_per_shard": 2}, "topology": "topology.yaml"}, sweep=True)
    try:
        assert sorted(s.options.target for s in _streams(agent)) == [
            "fabricmon-aggregator-0.fabricmon-aggregator.fabricmon.svc:9721",
            "fabricmon-aggregator-1.fabricmon-aggregator.fabricmon.svc:9721"]  # units 0,1 and 2
    finally:
        for x in agent.extras:
            x.stop()
    with pytest.raises(ConfigError, match=r"agent.yaml: shard.topology: required with shard.kubernetes"):
        _agent(files, {"kubernetes": {"units_per_shard": 2}, "unit": 0}, sweep=True)
