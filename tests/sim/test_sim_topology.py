"""The simulator and scenarios on fabrics from a topology: a generated fat tree, a topology file (an
imported one), leaf faults by the leaf's name; the demo localizes a degraded fat-tree leaf by its name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from fabricmon.configload import ConfigError
from fabricmon.sim.scenario import load_scenario, scenario_from_dict
from support.paths import REPO
from support.topology_fabrics import fat_tree_halves

FAT_TREE_SCENARIO = REPO / "examples" / "scenarios" / "fat-tree-leaf.yaml"




def test_scenario_fat_tree_layout_and_named_leaf_fault() -> None:
    """cluster: {fabric: fat_tree, nodes_per_leaf: 2}: every NIC of two nodes on leaf-u<k>, no rails; a
    leaf_degraded {leaf: NAME} faults that leaf's whole grid and its ground truth names it."""
    scn = scenario_from_dict({"cluster": {"nodes": 16, "fabric": "fat_tree", "nodes_per_leaf": 2, "seed": 3},
                              "duration": 120,
                              "faults": [{"kind": "leaf_degraded", "leaf": "leaf-u3", "start": 30, "end": 90},
                                         {"kind": "flaky_cable", "node": "node-009", "rail": 2, "start": 10}]})
    topo = scn.cluster.build_topology()
    assert not topo.rail_optimized and topo.shape.rails() == [] and len(topo.shape.leaves()) == 8
    assert topo.shape.nodes_on_leaf("leaf-u3") == ["node-006", "node-007"]
    assert scn.cluster.leaf_targets("leaf-u3") == (["node-006", "node-007"], list(range(8)))
    leaf, cable = (g.to_dict() for g in scn.ground_truth())
    assert (leaf["component"], leaf["leaf"], leaf["rail"]) == ("leaf-u3", "leaf-u3", None)
    assert (cable["component"], cable["leaf"], cable["rail"]) == ("node-009/mlx5_2/1", "leaf-u4", None)


@pytest.mark.parametrize(("cluster", "faults", "error"), [
    ({"nodes": 16, "fabric": "fat_tree"}, [], r"s\.yaml: cluster\.nodes_per_leaf: required with fabric: fat_tree"),
    ({"nodes": 16, "fabric": "clos"}, [], r"s\.yaml: cluster\.fabric: must be rail_optimized or fat_tree, got 'clos'"),
    ({"nodes": 16, "nodes_per_leaf": 2}, [], r"s\.yaml: cluster\.nodes_per_leaf: only with fabric: fat_tree"),
    ({"nodes": 16, "fabric": "fat_tree", "nodes_per_leaf": 2}, [{"kind": "leaf_degraded", "leaf": "leaf-a9"}],
     r"s\.yaml: faults\[0\]\.leaf: 'leaf-a9' is not a leaf of this cluster .* \(leaves: leaf-u0, leaf-u1, leaf-u2"),
    ({"nodes": 16, "fabric": "fat_tree", "nodes_per_leaf": 2}, [{"kind": "leaf_degraded", "unit": 1, "rail": 3}],
     r"s\.yaml: faults\[0\]\.unit: this cluster's leaves are not unit x rail \(a fat tree\): name the leaf"),
    ({"nodes": 16}, [{"kind": "leaf_degraded", "leaf": "leaf-u0-r3", "rail": 3}],
     r"s\.yaml: faults\[0\]\.rail: give leaf \(a name\) or unit and rail, not both"),
    ({"nodes": 16}, [{"kind": "flaky_cable", "node": "node-001", "rail": 1, "leaf": "leaf-u0-r1"}],
     r"s\.yaml: faults\[0\]\.leaf: does not apply to flaky_cable"),
])
def test_scenario_fabric_errors_name_file_field_and_problem(tmp_path, cluster, faults, error) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"cluster": cluster, "duration": 60, "faults": faults}))
    with pytest.raises(ConfigError, match=error):
        load_scenario(p)


def test_scenario_topology_file_errors(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"cluster": {"topology": "missing.yaml"}, "duration": 60}))
    with pytest.raises(ConfigError, match=r"s\.yaml: cluster\.topology: .*missing\.yaml"):
        load_scenario(p)
    (tmp_path / "t.yaml").write_text(fat_tree_halves(tmp_path).read_text())
    p.write_text(yaml.safe_dump({"cluster": {"topology": "t.yaml", "nodes": 8}, "duration": 60}))
    with pytest.raises(ConfigError, match=r"s\.yaml: cluster\.nodes: the topology file gives the nodes"):
        load_scenario(p)
    # leaf-a3 carries mlx5_4..7 of gpu-a17-02 and mlx5_0..3 of gpu-a17-03: not a nodes x NICs grid
    p.write_text(yaml.safe_dump({"cluster": {"topology": "t.yaml"}, "duration": 60,
                                 "faults": [{"kind": "leaf_degraded", "leaf": "leaf-a3", "start": 5}]}))
    with pytest.raises(ConfigError, match=r"s\.yaml: faults\[0\]\.leaf: leaf-a3 carries mlx5_\d of some of its "
                                          r"nodes but not of gpu-a17-0[23]"):
        load_scenario(p)


def test_demo_on_an_imported_fat_tree_names_the_degraded_leaf(tmp_path) -> None:
    """examples/scenarios/fat-tree-leaf.yaml: the topology imported from a real ibnetdiscover output (ibsim),
    node names and leaf names from it; the demo (in-memory agents, the real aggregator runtime) finds one
    FabricLeafDegraded on leaf-1, by its name, and prints it."""
    scn = load_scenario(FAT_TREE_SCENARIO)
    assert scn.cluster.nodes == 8 and scn.cluster.node_names()[:2] == ["node00", "node01"]
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fabricmon.cli", "--log-level", "warning", "demo", "--scenario", str(FAT_TREE_SCENARIO),
         "--mode", "memory", "--speed", "200", "--workers", "1", "--no-alertmanager", "--report-json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FabricLeafDegraded       leaf  leaf-1" in proc.stdout, proc.stdout[-3000:]
    report = json.loads(out.read_text())
    assert [(i["alertname"], i["component_type"], i["component"]) for i in report["incidents"]] == [
        ("FabricLeafDegraded", "leaf", "leaf-1")], report["incidents"]
    assert report["scores"]["recall"] == 1.0 and report["scores"]["precision"] == 1.0
    assert report["faults"][0]["component"] == "leaf-1" and report["faults"][0]["rail"] is None
