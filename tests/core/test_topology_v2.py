"""The aggregator's topology loader on version-2 (imported) files beside generate: and version 1;
`check-config --kind topology` summaries; `fabricmon topology diff`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fabricmon.cli import main
from fabricmon.components import Component, Kind
from fabricmon.configload import ConfigError
from fabricmon.topology import generate_topology, load_topology, topology_dict
from support.paths import FIXTURES

IBSIM = FIXTURES / "topology_import" / "ibsim"


def _ids(path: dict[Kind, Component]) -> dict[str, str]:
    """``path_of_gpu`` rendered as component_type -> id, as the alert labels read them."""
    return {k.value: c.id for k, c in path.items()}



def imported(tmp_path: Path, *outs: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    args = ["topology", "import", "--cluster", "lab", "-o", str(path), "--log-level", "error"]
    for o in outs:
        args += ["--ibnetdiscover", str(IBSIM / o)]
    assert main(args) == 0
    return path


def test_v2_rail_optimized_lookups(tmp_path) -> None:
    topo = load_topology(imported(tmp_path, "forms-plane-a.out", "forms-plane-b.out"))
    assert (topo.version, topo.cluster, topo.layout, topo.rail_optimized) == (2, "lab", "ib", True)
    assert topo.shape.rails() == [0, 1, 2, 3]
    # named leaves replace leaf-u<unit>-r<rail> in every lookup the aggregator makes
    assert topo.leaf_of("gpu-a17-03", 2) == "leaf-b0"
    assert _ids(topo.path_of_gpu("gpu-a17-03", 1)) == {
        "node": "gpu-a17-03", "gpu": "gpu-a17-03/gpu1", "nic": "gpu-a17-03/mlx5_1", "link": "gpu-a17-03/mlx5_1/1",
        "rail": "rail1", "leaf": "leaf-a1"}
    assert topo.path_of_gpu("gpu-a17-03", 1)[Kind.LINK].leaf == "leaf-a1"
    assert topo.labels_of_link("gpu-a17-05", "mlx5_3") == {"node": "gpu-a17-05", "rail": "3", "leaf": "leaf-b1"}
    assert topo.shape.spines_of("leaf-a0") == ("spine-a2", "switch-b8cef60300f00040")
    assert topo.shape.units() == [0,
                            1] and topo.unit_of("gpu-a17-03") == topo.unit_of("gpu-a17-05") != topo.unit_of("gpu-b02")
    # "gpu-a17-04 HCA-1": no device until the agent's fabricmon_ib_port_info names it by node GUID
    spec = topo.nodes["gpu-a17-04"]
    assert spec.nics == () and len(spec.unbound) == 4
    assert topo.nic_by_guid("0xb8cef60300a11010")[0] == "gpu-a17-04"
    assert topo.nic("gpu-a17-04", "mlx5_0") is None
    names = {"0xB8CEF60300A11010": "mlx5_0", "0xb8cef60300a11020": "mlx5_1"}
    assert topo.binding.bind_devices("gpu-a17-04", names) == 2
    assert topo.nic("gpu-a17-04", "mlx5_1").leaf == "leaf-a1" and len(topo.nodes["gpu-a17-04"].unbound) == 2
    assert topo.leaf_of_nic("gpu-a17-04", "mlx5_0") == "leaf-a0"


def test_v2_fat_tree_has_no_rail_labels(tmp_path) -> None:
    topo = load_topology(imported(tmp_path, "fat-tree.out"))
    assert not topo.rail_optimized and topo.shape.rails() == []
    p = _ids(topo.path_of_gpu("node05", 1))
    assert "rail" not in p and p["leaf"] == "leaf-1" and p["nic"] == "node05/mlx5_1"
    assert topo.path_of_gpu("node05", 1)[Kind.LINK].labels() == {"node": "node05", "leaf": "leaf-1"}
    assert topo.leaf_of("node05", None) == "leaf-1"
    assert topo.labels_of_link("node00", "mlx5_0") == {"node": "node00", "leaf": "leaf-0"}
    assert topo.shape.nodes_on_leaf("leaf-0") == ["node00", "node01", "node02", "node03"]
    assert topo.shape.units() == [0, 1]


def test_v2_round_trips_through_to_dict(tmp_path) -> None:
    topo = load_topology(imported(tmp_path, "forms-plane-a.out"))
    again = tmp_path / "again.yaml"
    topo.write_yaml(again)
    back = load_topology(again)
    assert topology_dict(back) == topology_dict(topo) and back.leaf_of("gpu-b02", 0) == "pod1_leaf-a2"


def test_generate_and_version_1_still_load(tmp_path) -> None:
    gen = tmp_path / "gen.yaml"
    gen.write_text("cluster: x\nnodes_per_unit: 2\ngenerate: {nodes: 4, rails: 2}\n")
    topo = load_topology(gen)
    assert topo.version == 1 and topo.leaf_of("node-003", 1) == "leaf-u1-r1" and topo.shape.rails() == [0, 1]
    v1 = tmp_path / "v1.yaml"
    generate_topology(4, nodes_per_unit=2, rails=2, cluster="x").write_yaml(v1)
    assert topology_dict(load_topology(v1)) == topology_dict(topo)
    one = tmp_path / "one.yaml"
    one.write_text("version: 1\n" + v1.read_text())
    assert load_topology(one).leaf_of("node-000", 0) == "leaf-u0-r0"


@pytest.mark.parametrize("edit,problem", [
    (lambda d: d["nodes"][0]["nics"][0].update(leaf="nowhere"),
     "nodes[0].nics[0].leaf: 'nowhere' is not under leaves:"),
    (lambda d: d["nodes"][1]["nics"][0].update(node_guid=d["nodes"][0]["nics"][0]["node_guid"]),
     "nodes[1].nics[0].node_guid"),
    (lambda d: d["leaves"].update({"a/b": {"spines": []}}), "leaves.a/b: holds '/'"),
    (lambda d: d.update(version=3), "version: must be 1 or 2, got 3"),
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "duplicate node 'gpu-a17-03'"),
    (lambda d: d["nodes"][0]["nics"][0].pop("device") and d["nodes"][0]["nics"][0].pop("node_guid"),
     "nodes[0].nics[0]: give device, node_guid or interface"),
])
def test_v2_bad_files_name_the_field(tmp_path, edit, problem) -> None:
    doc = yaml.safe_load(imported(tmp_path, "forms-plane-a.out").read_text())
    edit(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError) as exc:
        load_topology(bad)
    assert problem in str(exc.value) and str(bad) in str(exc.value), str(exc.value)


def test_check_config_prints_a_summary(tmp_path, capsys) -> None:
    path = imported(tmp_path, "forms-plane-a.out", "forms-plane-b.out")
    capsys.readouterr()
    assert main(["check-config", str(path)]) == 0  # the kind is detected from the version-2 keys
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: ok (topology config)"
    text = "\n".join(out)
    for want in ("nodes: 5, NICs: 18 (4 known by GUID or netdev", "leaves: 6, spines: 4", "rails: 4 (0, 1, 2, 3)",
                 "nodes per leaf: min 1, max 4", "odd: 1 nodes without the usual 4 NICs: gpu-b02"):
        assert want in text, text
    assert len(out) <= 24  # one screen
    fat = imported(tmp_path, "fat-tree.out", name="fat.yaml")
    capsys.readouterr()
    assert main(["check-config", "--kind", "topology", str(fat)]) == 0
    assert "rails: not rail-optimized" in capsys.readouterr().out


def test_diff_shows_what_a_reimport_changed(tmp_path, capsys) -> None:
    old = imported(tmp_path, "forms-plane-a.out", name="old.yaml")
    # the same fabric after a recabling: gpu-a17-03's mlx5_1 moved from leaf-a1 to the pod leaf, and
    # gpu-b02 left the fabric
    doc = yaml.safe_load(old.read_text())
    doc["nodes"][0]["nics"][1]["leaf"] = "pod1_leaf-a2"
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] != "gpu-b02"]
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(doc, sort_keys=False))
    capsys.readouterr()
    assert main(["topology", "diff", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "- 1 nodes gone: gpu-b02" in out and "~ gpu-a17-03/mlx5_1: leaf leaf-a1 -> pod1_leaf-a2" in out, out
    assert main(["topology", "diff", str(old), str(old)]) == 0
    assert "same nodes" in capsys.readouterr().out


@pytest.mark.parametrize("out,node,device,leaf,rail", [
    ("fat-tree.out", "node05", "mlx5_1", "leaf-1", None),
    ("rail-optimized.out", "gpu-0013", "mlx5_2", "leaf-su01-r2", "2"),
])
def test_engine_runs_unchanged_on_imported_topologies_and_labels_the_named_leaf(tmp_path, out, node, device, leaf,
                                                                                rail) -> None:
    """The aggregator's engine (not edited here) takes a version-2 topology through the Topology interface:
    a flaky cable is alerted with its imported leaf name, and without a rail label on a fat tree."""
    from fabricmon.aggregator.config import DetectionSettings
    from fabricmon.aggregator.engine import Engine
    from support.enginerig import T0, Feed, flaky

    topo = load_topology(imported(tmp_path, out))
    engine = Engine(topo, DetectionSettings())
    feeds = {n: Feed(topo, n, i, roce=False) for i, n in enumerate(topo.nodes)}
    for f in feeds.values():
        engine.hello(f.hello())
    inject = flaky(node, device)
    for step in range(1, 16):
        inject(type("C", (), {"feeds": feeds})())
        for f in feeds.values():
            engine.ingest(f.batch(T0 + step, first=step == 1))
        engine.tick(T0 + step)
    alerts = [i for i in engine.incidents() if i.component == f"{node}/{device}/1"]
    assert alerts, [(i.alertname, i.component) for i in engine.incidents()]
    labels = alerts[0].labels
    assert labels["leaf"] == leaf and labels["node"] == node and labels.get("rail") == rail, labels


def test_v2_gpu_of_a_nic_comes_from_the_agents_pairing_not_name_order(tmp_path) -> None:
    """An HGX H100's compute HCAs are mlx5_0,3,4,5,6,9,10,11; mlx5_1 is storage (its own leaf).  By name
    order GPU 1 "depended" on the storage switch.  The agent's hello pairs each GPU with its nearest NIC
    by PCI affinity: that pairing stands, and the NIC it pairs with no GPU serves none (no rail)."""
    compute = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    nodes = []
    for h in ("gpu-01", "gpu-02"):
        nics = [{"device": d, "port": 1, "leaf": f"leaf-r{r}", "rail": r} for r, d in enumerate(compute)]
        nics.append({"device": "mlx5_1", "port": 1, "leaf": "storage-1", "rail": 8})  # as an import wrote it
        nodes.append({"name": h, "nics": nics})
    path = tmp_path / "hgx.yaml"
    path.write_text(yaml.safe_dump({"version": 2, "cluster": "lab", "layout": "ib", "rail_optimized": True,
                                    "nodes": nodes, "leaves": {}}))
    topo = load_topology(path)
    assert topo.nic_for_gpu("gpu-01", 1).device == "mlx5_1"  # name order: the storage NIC (the fallback)
    pairing = {d: g for g, d in enumerate(compute)} | {"mlx5_1": -1}
    assert topo.binding.pair_gpus("gpu-01", pairing) > 0
    assert [topo.nic_for_gpu("gpu-01", g).device for g in range(8)] == compute
    assert _ids(topo.path_of_gpu("gpu-01", 1))["leaf"] == "leaf-r1"
    storage = topo.nic("gpu-01", "mlx5_1")
    assert storage.rail is None and storage.gpu == -1
    assert topo.nic_for_gpu("gpu-02", 1).device == "mlx5_1"  # no hello from gpu-02 yet: the fallback
    reloaded = load_topology(path)
    reloaded.binding.rebind(topo.binding)  # a reloaded file keeps what the hellos said
    assert reloaded.nic_for_gpu("gpu-01", 1).device == "mlx5_3"
