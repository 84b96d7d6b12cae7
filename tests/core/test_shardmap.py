"""Shards: every scalable unit owned by exactly one aggregator replica; agents find their replica."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fabricmon.configload import ConfigError
from fabricmon.shardmap import (
    aggregator_for_unit,
    check_ownership,
    kubernetes_aggregator,
    load_shard_map,
    ownership_problems,
    units_of_ordinal,
)
from fabricmon.topology import generate_topology
from support.paths import REPO


@pytest.fixture
def topo_path(tmp_path):
    p = tmp_path / "topology.yaml"
    generate_topology(64, layout="ib", nodes_per_unit=16, cluster="t").write_yaml(p)  # units 0..3
    return p


def _map(tmp_path, replicas, topology="topology.yaml"):
    p = tmp_path / "shards.yaml"
    p.write_text(yaml.safe_dump({"topology": topology, "replicas": replicas}))
    return p


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fabricmon.cli", "check-config", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_every_unit_owned_once_passes(tmp_path, topo_path):
    p = _map(tmp_path, [{"name": "agg-0", "address": "127.0.0.1:9721", "units": [0, 1]},
                        {"name": "agg-1", "address": "127.0.0.1:9731", "units": [2, 3]}])
    check_ownership(load_shard_map(p), str(p))
    proc = _cli(p)
    assert proc.returncode == 0 and "shardmap" in proc.stdout, proc.stderr


def test_unowned_and_twice_owned_units_are_refused(tmp_path, topo_path):
    p = _map(tmp_path, [{"name": "agg-0", "address": "127.0.0.1:9721", "units": [0, 1]},
                        {"name": "agg-1", "address": "127.0.0.1:9731", "units": [1, 2, 7]}])
    problems = ownership_problems(load_shard_map(p), [0, 1, 2, 3])
    assert problems == ["unit 3: owned by no replica",
                        "unit 1: owned by 2 replicas (agg-0, agg-1); a unit's leaves must stay in one shard",
                        "unit 7: owned by agg-1 but not in the topology"]
    with pytest.raises(ConfigError, match=r"shards.yaml: replicas: unit 3: owned by no replica \(and 2 more\)"):
        check_ownership(load_shard_map(p), str(p))
    proc = _cli(p, "--kind", "shardmap")
    assert proc.returncode != 0
    assert "unit 3: owned by no replica" in proc.stderr + proc.stdout


@pytest.mark.parametrize("replicas, field", [
    ([{"name": "a", "address": "127.0.0.1:9721", "units": ["x"]}], "replicas[0].units"),
    ([{"name": "a", "address": "nohost", "units": [0]}], "replicas[0].address"),
    ([{"name": "a", "address": "127.0.0.1:1", "units": [0]}, {"name": "a", "address": "127.0.0.1:2", "units": [1]}],
     "replicas[1].name"),
    ([], "replicas"),
])
def test_bad_shard_map_names_the_field(tmp_path, replicas, field):
    p = _map(tmp_path, replicas)
    with pytest.raises(ConfigError, match=r"shards\.yaml: " + field.replace("[", r"\[").replace("]", r"\]")):
        load_shard_map(p)


def test_agent_finds_its_shard_bare_metal(tmp_path, topo_path):
    topo = generate_topology(64, layout="ib", nodes_per_unit=16, cluster="t")
    p = _map(tmp_path, [{"name": "agg-0", "address": "10.0.0.11:9721", "units": [0, 1]},
                        {"name": "agg-1", "address": "10.0.0.12:9721", "units": [2, 3]}])
    shards = load_shard_map(p)
    # the agent's unit from the topology (or its config/node label): node-040 is in unit 2
    assert aggregator_for_unit(shards, topo.unit_of("node-040")) == "10.0.0.12:9721"
    assert aggregator_for_unit(shards, topo.unit_of("node-005")) == "10.0.0.11:9721"
    with pytest.raises(ConfigError, match="unit 9 is owned by no replica"):
        aggregator_for_unit(shards, 9)


def test_agent_finds_its_shard_on_kubernetes():
    assert kubernetes_aggregator(5, 2, "fabric") == "fabricmon-aggregator-2.fabricmon-aggregator.fabric.svc:9721"
    assert kubernetes_aggregator(0, 4, "ns") == "fabricmon-aggregator-0.fabricmon-aggregator.ns.svc:9721"
    # the replica with that ordinal owns the unit: agent and aggregator agree
    for unit in range(12):
        ordinal = int(kubernetes_aggregator(unit, 3, "ns").split(".")[0].rsplit("-", 1)[1])
        assert unit in units_of_ordinal(ordinal, 3)
    with pytest.raises(ValueError):
        kubernetes_aggregator(1, 0, "ns")
