"""The agent's shard: section: how the unit is found (precedence) and every way the config is refused.

Errors are one line naming the file, the field and the problem; the CLI exits 2 on them
(``fabricmon check-config --kind agent`` and ``fabricmon agent`` alike).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fabricmon.agent.shard_target import resolve_static, static_unit
from fabricmon.cli import _load_agent, build_parser
from fabricmon.config import ConfigError, load_agent_config
from fabricmon.topology import generate_topology
from support.paths import REPO


@pytest.fixture
def files(tmp_path):
    """topology.yaml: 64 nodes, 16 per unit (units 0..3); shards.yaml: agg-0 owns 0, 1; agg-1 owns 2, 3."""
    generate_topology(64, nodes_per_unit=16, cluster="t").write_yaml(tmp_path / "topology.yaml")
    (tmp_path / "shards.yaml").write_text(yaml.safe_dump({"replicas": [
        {"name": "agg-0", "address": "10.0.0.1:9721", "units": [0, 1]},
        {"name": "agg-1", "address": "10.0.0.2:9721", "units": [2, 3]}]}))
    return tmp_path


def _write(d: Path, shard, **top) -> Path:
    p = d / "agent.yaml"
    p.write_text(yaml.safe_dump({"node_name": "node-040", **top, "shard": shard}))
    return p


def _target(path: Path):
    cfg = load_agent_config(path)
    return resolve_static(cfg.shard, cfg.node_name, str(path))[1]


def test_unit_from_the_topology_picks_its_owner_in_the_map(files):
    t = _target(_write(files, {"map": "shards.yaml", "topology": "topology.yaml"}))  # node-040: unit 2
    assert (t.unit, t.replica, t.address, t.via) == (2, "agg-1", "10.0.0.2:9721", "topology")


@pytest.mark.parametrize("shard, want", [
    ({"map": "shards.yaml", "topology": "topology.yaml"}, ("agg-0", "10.0.0.1:9721")),
    ({"map": "shards.yaml", "topology": "topology.yaml", "unknown_owner": 1}, ("agg-1", "10.0.0.2:9721")),
    ({"kubernetes": {"units_per_shard": 2}, "topology": "topology.yaml", "unknown_owner": 1},
     ("fabricmon-aggregator-1", "fabricmon-aggregator-1.fabricmon-aggregator.fabricmon.svc:9721")),
])
def test_node_missing_from_the_topology_streams_to_the_unknown_owner(files, shard, want):
    """Its real hostname is not in the topology: it still streams (to ``shard.unknown_owner``, replica 0 by
    default), where the aggregator monitors it without rail or leaf, instead of refusing to start."""
    cfg = load_agent_config(_write(files, shard, node_name="gpu-a17-03"))
    t = resolve_static(cfg.shard, "gpu-a17-03", "x")[1]
    assert (t.unit, t.replica, t.address, t.via) == (None, *want, "unknown_owner")


def test_explicit_unit_wins_over_topology_and_label(files):
    cfg = load_agent_config(_write(files, {"map": "shards.yaml", "topology": "topology.yaml", "unit": 0,
                                           "node_label": {}}))
    assert static_unit(cfg.shard, "node-040", "x") == (0, "unit")
    assert resolve_static(cfg.shard, "node-040", "x")[1].replica == "agg-0"


def test_topology_wins_over_label_and_label_is_the_fallback(files):
    cfg = load_agent_config(_write(files, {"kubernetes": {"units_per_shard": 2}, "topology": "topology.yaml",
                                           "node_label": {}}))
    assert static_unit(cfg.shard, "node-040", "x") == (2, "topology")
    t = resolve_static(cfg.shard, "node-040", "x")[1]
    assert t.address == "fabricmon-aggregator-1.fabricmon-aggregator.fabricmon.svc:9721"
    # a node the topology does not list: the label (read at run time) decides
    assert static_unit(cfg.shard, "not-in-topology", "x") is None
    assert resolve_static(cfg.shard, "not-in-topology", "x")[1] is None


def test_flag_then_env_then_file(files, monkeypatch):
    path = _write(files, {"map": "shards.yaml", "unit": 1})
    parse = build_parser().parse_args
    monkeypatch.setenv("FABRICMON_UNIT", "3")
    assert _load_agent(parse(["agent", "--config", str(path), "--unit", "2"])).shard.unit == 2
    assert _load_agent(parse(["agent", "--config", str(path)])).shard.unit == 3
    monkeypatch.setenv("FABRICMON_UNIT", "")
    assert _load_agent(parse(["agent", "--config", str(path)])).shard.unit == 1
    # $FABRICMON_UNIT is ambient: an agent with one aggregator address ignores it
    plain = files / "plain.yaml"
    plain.write_text("aggregator: 10.0.0.9:9721\n")
    monkeypatch.setenv("FABRICMON_UNIT", "3")
    assert _load_agent(parse(["agent", "--config", str(plain)])).shard is None
    with pytest.raises(ConfigError, match=r"^command line: --unit: only with a shard: section"):
        _load_agent(parse(["agent", "--config", str(plain), "--unit", "1"]))
    monkeypatch.setenv("FABRICMON_UNIT", "two")
    with pytest.raises(ConfigError, match=r"^FABRICMON_UNIT: expected a unit number .*'two'"):
        _load_agent(parse(["agent", "--config", str(path)]))


def test_plain_aggregator_address_unchanged(files):
    p = files / "plain.yaml"
    p.write_text("aggregator: 10.0.0.9:9721\n")
    cfg = load_agent_config(p)
    assert cfg.aggregator == "10.0.0.9:9721" and cfg.shard is None


def test_relative_paths_are_relative_to_the_config_file(files):
    cfg = load_agent_config(_write(files, {"map": "shards.yaml", "topology": "topology.yaml"}))
    assert cfg.shard.map == str(files / "shards.yaml") and cfg.shard.topology == str(files / "topology.yaml")


@pytest.mark.parametrize("shard, top, message", [
    ({"map": "shards.yaml", "kubernetes": {"units_per_shard": 2}, "unit": 0}, {},
     r"shard: give exactly one of map .* or kubernetes"),
    ({"unit": 0}, {}, r"shard: give exactly one of map"),
    ({"map": "shards.yaml"}, {}, r"shard: the node's unit is unknown: give unit, topology or node_label"),
    ({"map": "shards.yaml", "unit": -1}, {}, r"shard.unit: must be >= 0, got -1"),
    ({"map": "shards.yaml", "unit": True}, {}, r"shard.unit: expected an integer, got True"),
    ({"map": "shards.yaml", "unit": "3"}, {}, r"shard.unit: expected an integer, got '3'"),
    ({"kubernetes": {}, "unit": 0}, {}, r"shard.kubernetes.units_per_shard: required, an integer >= 1, got 0"),
    ({"kubernetes": {"units_per_shard": 2, "namespace": "Bad_NS"}, "unit": 0}, {},
     r"shard.kubernetes.namespace: not a Kubernetes namespace name"),
    ({"kubernetes": {"units_per_shard": 2, "port": 0}, "unit": 0}, {}, r"shard.kubernetes.port: must be >= 1"),
    ({"kubernetes": {"units_per_shard": 2}, "node_label": {"api_server": "http://10.0.0.1"}}, {},
     r"shard.node_label.api_server: must be an https:// URL"),
    ({"kubernetes": {"units_per_shard": 2}, "node_label": {"key": ""}}, {}, r"shard.node_label.key: a node label key"),
    ({"kubernetes": {"units_per_shard": 2}, "node_label": {"timeout": 0}}, {},
     r"shard.node_label.timeout: must be > 0"),
    ({"map": "shards.yaml", "unit": 0, "replicas": 3}, {}, r"shard.replicas: unknown key"),
    ({"map": "shards.yaml", "unit": 0}, {"aggregator": "10.0.0.9:9721"},
     r"shard: give aggregator \(one address\) or shard .*not both"),
    ("shards.yaml", {}, r"shard: expected a mapping, got str"),
])
def test_bad_shard_section_is_refused_naming_file_and_field(files, shard, top, message):
    path = _write(files, shard, **top)
    with pytest.raises(ConfigError, match=rf"^{path}: {message}") as exc:
        load_agent_config(path)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("shard, message", [
    ({"map": "missing.yaml", "unit": 0}, r"shard.map: .*missing.yaml: cannot read"),
    ({"map": "topology.yaml", "unit": 0}, r"shard.map: .*replicas: required"),
    ({"map": "shards.yaml", "unit": 7}, r"shard.unit: unit 7 is owned by no replica of .*shards.yaml"),
    ({"map": "shards.yaml", "topology": "missing.yaml"}, r"shard.topology: .*missing.yaml: cannot read"),
    ({"map": "shards.yaml", "topology": "shards.yaml"}, r"shard.topology: .*replicas: unknown key"),
    ({"map": "shards.yaml", "topology": "topology.yaml", "unknown_owner": 5, "node_name_is": "ghost"},
     r"shard.unknown_owner: unknown_owner 5 is past the 2 replicas of .*shards.yaml"),
])
def test_shard_that_cannot_give_a_replica_is_refused(files, shard, message):
    node = shard.pop("node_name_is", "node-040")
    path = _write(files, shard)
    cfg = load_agent_config(path)
    with pytest.raises(ConfigError, match=rf"^{path}: {message}"):
        resolve_static(cfg.shard, node, str(path))


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fabricmon.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=env)


def test_check_config_resolves_the_unit(files):
    good = _write(files, {"map": "shards.yaml", "topology": "topology.yaml"})
    proc = _cli("check-config", "--kind", "agent", good)
    assert proc.returncode == 0 and "ok (agent config)" in proc.stdout, proc.stderr
    bad = _write(files, {"map": "shards.yaml", "unit": 9})
    proc = _cli("check-config", bad)  # detected as an agent config by its keys
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}: shard.unit: unit 9 is owned by no replica" in lines[0]


def test_agent_exits_2_before_starting_when_its_unit_has_no_owner(files):
    path = _write(files, {"map": "shards.yaml", "unit": 9}, sysfs_root=str(files / "nosys"), nvml="off",
                  listen="127.0.0.1:0", intake={"listen": None, "socket": None})
    proc = _cli("agent", "--config", path)
    assert proc.returncode == 2
    assert f"{path}: shard.unit: unit 9 is owned by no replica" in proc.stderr
