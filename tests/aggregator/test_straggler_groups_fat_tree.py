"""Comm-late stragglers on a fat tree (a version-2 topology whose NICs have no rail) are grouped by node
and leaf: no rail exists to blame (before, they were grouped under ``comp.rail(None)``, "railNone")."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricmon.aggregator.correlator import _group
from fabricmon.aggregator.stragglers import Straggler
from fabricmon.cli import main
from fabricmon.components import Kind
from fabricmon.topology import Topology, load_topology
from support.paths import FIXTURES

# ibsim's fat tree (tests/fixtures/topology_import/ibsim/fat-tree.net), as ibnetdiscover printed it
FAT_TREE = FIXTURES / "topology_import" / "ibsim" / "fat-tree.out"


@pytest.fixture(scope="module")
def fat_tree(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    path: Path = tmp_path_factory.mktemp("fat") / "t.yaml"
    assert main(["topology", "import", "--cluster", "lab", "-o", str(path), "--log-level", "error",
                 "--ibnetdiscover", str(FAT_TREE)]) == 0
    topo = load_topology(path)
    assert not topo.rail_optimized
    return topo


def _comm(node: str, gpu: int, rank: int) -> Straggler:
    return Straggler("train", rank, node, gpu, "comm", 3.0, 0.5)


def test_comm_stragglers_under_two_leaves_are_not_blamed_on_a_rail(fat_tree: Topology) -> None:
    assert fat_tree.leaf_of("node00", None) != fat_tree.leaf_of("node05", None)
    groups = _group(fat_tree, [_comm("node00", 1, 1), _comm("node05", 1, 41)])
    assert all(c.kind is not Kind.RAIL for c, _ in groups), groups
    assert sorted((c.kind, c.id) for c, _ in groups) == [(Kind.GPU, "node00/gpu1"), (Kind.GPU, "node05/gpu1")]


def test_comm_stragglers_of_two_nodes_under_one_leaf_blame_the_leaf(fat_tree: Topology) -> None:
    assert fat_tree.leaf_of("node00", None) == fat_tree.leaf_of("node01", None) == "leaf-0"
    groups = _group(fat_tree, [_comm("node00", 1, 1), _comm("node01", 1, 9)])
    assert [(c.kind, c.id, len(m)) for c, m in groups] == [(Kind.LEAF, "leaf-0", 2)]
