"""Typed component identity: what the topology hands out is what the alert names, whatever a leaf is called.

A leaf is a name the topology gives (``leaf-a3``), not ``leaf-u<unit>-r<rail>`` read back from a
string: the leaf incident, its labels and the straggler vote over the leaf all carry that name.
"""

from __future__ import annotations

import dataclasses

from fabricmon import components
from fabricmon.aggregator.engine import Engine
from fabricmon.components import Kind
from fabricmon.topology import Topology, load_topology
from support.enginerig import Cluster, flaky, synced_ranks


def _named_leaves(topo: Topology) -> Topology:
    """Unit 1's leaves named by hand (``leaf-a<rail>``), unit 0 keeps the generated names."""
    nodes = {}
    for name, spec in topo.nodes.items():
        if spec.unit == 1:
            spec = dataclasses.replace(spec, nics=tuple(dataclasses.replace(n, leaf=f"leaf-a{n.rail}")
                                                        for n in spec.nics))
        nodes[name] = spec
    return Topology(topo.cluster, topo.layout, topo.nodes_per_unit, topo.spines, nodes)


def _cluster() -> Cluster:
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.topo = _named_leaves(c.topo)
    c.engine = Engine(c.topo, c.engine.settings)
    for f in c.feeds.values():
        f.topo = c.topo
        c.engine.hello(f.hello())
    return c


def test_identity_is_kind_and_id_and_context_renders_the_labels():
    a = components.link("node-003", "mlx5_3", 1, rail=3, leaf="leaf-a3")
    b = components.link("node-003", "mlx5_3", "1")  # no topology context: still the same link
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1 and str(a) == "node-003/mlx5_3/1"
    assert a != components.nic("node-003", "mlx5_3") and a.type == "link"
    assert a.labels("c") == {"node": "node-003", "rail": "3", "leaf": "leaf-a3", "cluster": "c"}
    assert a.parent() == components.nic("node-003", "mlx5_3") and a.parent().leaf == "leaf-a3"
    nv = components.nvlink("node-003", 2, 5)
    assert nv.id == "node-003/gpu2/nvlink5" and nv.parent() == components.gpu("node-003", 2)
    # the same id under another kind is another component (a node's config drift is not the node)
    assert components.config("node-003") != components.node("node-003")
    assert components.job("llm", 3).id == "llm/stage3" and components.job("llm").labels() == {"hpc_job": "llm"}


def test_topology_hands_out_named_leaves_and_the_file_keeps_them(tmp_path):
    c = _cluster()
    assert c.topo.leaf("node-009", 3) == components.leaf("leaf-a3") and c.topo.leaf("node-009", 3).rail == 3
    assert c.topo.leaf_of("node-001", 3) == "leaf-u0-r3"
    path = c.topo.path_of_gpu("node-009", 3)
    assert path[Kind.LEAF].id == "leaf-a3" and path[Kind.LINK].leaf == "leaf-a3"
    assert c.topo.gpu("node-009", 3).labels() == {"node": "node-009", "gpu": "3", "rail": "3", "leaf": "leaf-a3"}
    c.topo.write_yaml(tmp_path / "topology.yaml")
    assert load_topology(tmp_path / "topology.yaml").leaf_of("node-009", 5) == "leaf-a5"


def test_leaf_with_a_name_gets_its_leaf_incident_by_that_name():
    c = _cluster()
    c.run(10)
    unit1 = [n for n in c.topo.nodes if c.topo.unit_of(n) == 1]

    def inject(cl):
        for n in unit1:
            flaky(n, "mlx5_5")(cl)

    c.run(30, inject)
    incs = c.engine.incidents()
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("FabricLeafDegraded", "leaf", "leaf-a5")], incs
    assert incs[0].labels["leaf"] == "leaf-a5" and incs[0].labels["rail"] == "5"
    assert incs[0].absorbed and all(a.endswith("/mlx5_5/1") and a.split("/")[0] in unit1 for a in incs[0].absorbed)


def test_slow_ranks_under_a_named_leaf_are_voted_onto_that_leaf():
    """Communication-late ranks on one rail of two hosts under one (named) leaf: the leaf, by its name."""
    c = _cluster()
    slow = {("node-009", 3), ("node-010", 3)}
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.0,
                              slow_transfer=lambda step, n, g: 0.3 if (n, g) in slow else 0.0)
    c.run(30)
    incs = [(i.alertname, i.component_type, i.component) for i in c.engine.incidents()]
    assert incs == [("StragglerRank", "leaf", "leaf-a3")], incs
    inc = c.engine.incidents()[0]
    assert inc.labels["leaf"] == "leaf-a3" and inc.labels["rail"] == "3" and "node" not in inc.labels
