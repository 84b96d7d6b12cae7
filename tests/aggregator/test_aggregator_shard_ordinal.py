"""An aggregator replica derives its units from its StatefulSet ordinal: one config for every replica."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fabricmon.aggregator.config import ConfigError, ShardSettings, load_aggregator_config
from fabricmon.shardmap import kubernetes_aggregator
from fabricmon.topology import generate_topology
from support.paths import REPO


def _config(tmp_path: Path, shard) -> Path:
    generate_topology(64, nodes_per_unit=8, cluster="t").write_yaml(tmp_path / "topology.yaml")  # units 0..7
    p = tmp_path / "aggregator.yaml"
    p.write_text(yaml.safe_dump({"topology": "topology.yaml", "auth": {"insecure": True}, "shard": shard}))
    return p


@pytest.mark.parametrize("hostname, units", [
    ("fabricmon-aggregator-0", (0, 1, 2)),
    ("fabricmon-aggregator-2", (6, 7, 8)),
    ("fabricmon-aggregator-11.fabricmon-aggregator.fm.svc.cluster.local", (33, 34, 35)),
])
def test_units_follow_the_ordinal_as_agents_dial_it(hostname, units):
    s = ShardSettings(units_per_shard=3, ordinal_from_hostname=True)
    assert s.owned(hostname, "a.yaml") == units
    ordinal = hostname.split(".")[0].rsplit("-", 1)[1]
    # every unit this replica owns is one whose agents dial this replica's stable name
    assert {kubernetes_aggregator(u, 3, "fm").split(".")[0] for u in units} == {f"fabricmon-aggregator-{ordinal}"}


def test_explicit_units_unchanged():
    assert ShardSettings(units=(4, 5)).owned("anything", "a.yaml") == (4, 5)
    assert ShardSettings().owned("fabricmon-aggregator-3", "a.yaml") == ()


def test_hostname_without_ordinal_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^a.yaml: shard.ordinal_from_hostname: hostname 'aggbox' does not end"):
        ShardSettings(units_per_shard=2, ordinal_from_hostname=True).owned("aggbox", "a.yaml")


@pytest.mark.parametrize("shard, message", [
    ({"ordinal_from_hostname": True}, r"shard.units_per_shard: required with ordinal_from_hostname"),
    ({"ordinal_from_hostname": True, "units_per_shard": 2, "units": [1]},
     r"shard.units: give units or ordinal_from_hostname, not both"),
    ({"units_per_shard": 2}, r"shard.units_per_shard: only with ordinal_from_hostname: true"),
    ({"ordinal_from_hostname": "yes", "units_per_shard": 2}, r"shard.ordinal_from_hostname: expected true or false"),
    ({"ordinal_from_hostname": True, "units_per_shard": -1}, r"shard.units_per_shard: must be >= 0"),
])
def test_bad_shard_settings_are_refused(tmp_path, shard, message):
    p = _config(tmp_path, shard)
    with pytest.raises(ConfigError, match=rf"^{p}: {message}"):
        load_aggregator_config(p)


def test_engine_owns_the_ordinals_units(tmp_path):
    pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")
    from fabricmon.aggregator.service import build_engine

    cfg = load_aggregator_config(_config(tmp_path, {"ordinal_from_hostname": True, "units_per_shard": 2}))
    engine = build_engine(cfg, hostname="fabricmon-aggregator-1")
    assert engine.shard_units == frozenset({2, 3})
    assert {engine.topology.unit_of(n) for n in engine.nodes} == {2, 3}
    with pytest.raises(ConfigError, match="does not end in a StatefulSet ordinal"):
        build_engine(cfg, hostname="laptop")


def test_check_config_accepts_the_replica_config(tmp_path):
    p = _config(tmp_path, {"ordinal_from_hostname": True, "units_per_shard": 2})
    proc = subprocess.run([sys.executable, "-m", "fabricmon.cli", "check-config", "--kind", "aggregator", str(p)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
