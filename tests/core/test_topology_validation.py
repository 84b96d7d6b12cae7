"""Topology typos refused with one line naming the file and field (issue 26: duplicate NIC names,
negative unit, rail, port or rate, width 0 and ``generate:`` beside ``nodes:`` made a wrong model
silently; ``generate: {nodes: 100000000}`` ran for minutes and gigabytes)."""

from __future__ import annotations

import time

import pytest

from fabricmon.cli import main
from fabricmon.configload import ConfigError
from fabricmon.topology import MAX_NODES, load_topology

NIC = "{device: mlx5_0, rail: 0, gpu: 0}"


@pytest.mark.parametrize("body,field", [
    (f"nodes:\n  - {{name: n0, unit: 0, nics: [{NIC}, {{device: mlx5_0, rail: 1, gpu: 1}}]}}\n",
     "nodes[0].nics[1].device: duplicate NIC 'mlx5_0'"),
    (f"nodes:\n  - {{name: n0, unit: -1, nics: [{NIC}]}}\n", "nodes[0].unit: must be >= 0"),
    ("nodes:\n  - {name: n0, unit: 0, nics: [{device: mlx5_0, rail: -3, gpu: 0}]}\n",
     "nodes[0].nics[0].rail: must be >= 0"),
    ("nodes:\n  - {name: n0, unit: 0, nics: [{device: mlx5_0, rail: 0, gpu: 0, port: -1}]}\n",
     "nodes[0].nics[0].port: must be >= 0"),
    ("nodes:\n  - {name: n0, unit: 0, nics: [{device: mlx5_0, rail: 0, gpu: 0, rate_gbps: -400}]}\n",
     "nodes[0].nics[0].rate_gbps: must be in"),
    ("nodes:\n  - {name: n0, unit: 0, nics: [{device: mlx5_0, rail: 0, gpu: 0, width: 0}]}\n",
     "nodes[0].nics[0].width: must be >= 1"),
    ("rate_gbps: -1\ngenerate: {nodes: 4}\n", "rate_gbps: must be in"),
    (f"generate: {{nodes: 4}}\nnodes:\n  - {{name: n0, unit: 0, nics: [{NIC}]}}\n",
     "generate: give a node list or a generate: section, not both"),
    ("generate: {nodes: 100000000}\n", f"generate.nodes: must be in [1, {MAX_NODES}]"),
    ("generate: {nodes: 4, gpus_per_node: 100000}\n", "generate.gpus_per_node: must be in"),
    ("generate: {nodes: 4, rails: 0}\n", "generate.rails: must be in"),
])
def test_typo_refused_in_one_line_naming_file_and_field(tmp_path, capsys, body, field):
    p = tmp_path / "topology.yaml"
    p.write_text("cluster: x\n" + body)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as exc:
        load_topology(p)
    assert time.monotonic() - t0 < 5  # refused before any work, not after generating it
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{p}: ") and field in msg, msg
    assert main(["check-config", "--kind", "topology", str(p)]) == 2
    assert field in capsys.readouterr().err


def test_largest_stated_size_still_loads(tmp_path):
    p = tmp_path / "topology.yaml"
    p.write_text(f"cluster: x\ngenerate: {{nodes: {MAX_NODES}, rails: 1, gpus_per_node: 1}}\n")
    assert len(load_topology(p).nodes) == MAX_NODES
