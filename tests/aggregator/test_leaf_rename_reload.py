"""A leaf renamed in the topology (a switch replaced under a new name, RMA) is applied on reload (issue 36):
it used to need a restart, and the refusal named the node's "GPUs or NICs", not the leaf.  Other changes
are still refused, with the field named."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fabricmon.aggregator import topology_reload
from fabricmon.configload import ConfigError
from fabricmon.topology import Topology, generate_topology
from support.enginerig import Cluster, flaky

RAIL = 3


def _renamed(topo: Topology, old_units: set[int], new_name: str, **nic_changes) -> Topology:
    """The topology with the rail-3 NIC of every node of ``old_units`` on leaf ``new_name``."""
    nodes = {}
    for name, spec in topo.nodes.items():
        if spec.unit in old_units:
            nics = tuple(replace(n, leaf=new_name, **nic_changes) if n.rail == RAIL else n for n in spec.nics)
            spec = replace(spec, nics=nics)
        nodes[name] = spec
    return Topology(topo.cluster, topo.layout, topo.nodes_per_unit, topo.spines, nodes)


def test_a_renamed_leaf_is_applied_on_reload_and_its_links_carry_the_new_name():
    c = Cluster(nodes=4, nodes_per_unit=2)
    old_leaf = c.topo.leaf_of("node-000", RAIL)
    c.run(3)
    dev = c.feeds["node-000"].spec.nics[RAIL].device
    c.run(6, flaky("node-000", dev))
    [errs] = [i for i in c.incidents(alertname="FabricLinkErrors") if i.open]
    assert errs.labels["leaf"] == old_leaf
    new = _renamed(c.topo, {0}, "leaf-rma-07")
    change = topology_reload.plan(c.engine.topology, new, "topology.yaml")
    assert change.renamed == ((old_leaf, "leaf-rma-07"),) and set(change.recabled) == {"node-000", "node-001"}
    assert "leaves renamed: leaf-u0-r3 -> leaf-rma-07" in change.summary()
    topology_reload.apply(c.engine, change, c.t)
    c.topo = new
    link = c.engine.nodes["node-000"].links[(dev, "1")]
    assert link.labels["leaf"] == "leaf-rma-07" and link.leaf is not None and link.leaf.id == "leaf-rma-07"
    assert [x.node for x in c.engine.links_by_leaf[link.leaf]] == ["node-000", "node-001"]
    assert not any(k.id == old_leaf for k in c.engine.links_by_leaf)
    c.run(3, flaky("node-000", dev))  # the open incident's next change carries the new leaf
    [errs] = [i for i in c.incidents(alertname="FabricLinkErrors") if i.open]
    assert errs.labels["leaf"] == "leaf-rma-07"
    gpu = c.engine.nodes["node-000"].gpus
    assert all(g.labels.get("leaf") != old_leaf for g in gpu.values())


def test_the_old_leafs_open_incidents_resolve_as_renamed():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(2)
    devs = {n: c.feeds[n].spec.nics[RAIL].device for n in c.feeds}

    def all_flaky(cl):
        for n, d in devs.items():
            flaky(n, d)(cl)
    c.run(8, all_flaky)
    [leaf] = [i for i in c.incidents(alertname="FabricLeafDegraded") if i.open]
    change = topology_reload.plan(c.engine.topology, _renamed(c.topo, {0}, "leaf-rma-07"), "topology.yaml")
    resolved = topology_reload.apply(c.engine, change, c.t)
    assert [(i.component, i.resolved_reason) for i in resolved] == [(leaf.component, "leaf_renamed")]


@pytest.mark.parametrize(("changes", "field"), [
    ({"rail": 5}, "nics[3] (mlx5_3).rail: changed from 3 to 5"),
    ({"rate_gbps": 200.0}, "nics[3] (mlx5_3).rate_gbps: changed from 400.0 to 200.0"),
])
def test_other_nic_changes_are_refused_naming_the_field(changes, field):
    topo = generate_topology(4, nodes_per_unit=2, layout="roce", cluster="test")
    with pytest.raises(ConfigError) as exc:
        topology_reload.plan(topo, _renamed(topo, {0}, "leaf-rma-07", **changes), "topology.yaml")
    assert str(exc.value) == (f"topology.yaml: nodes: node-000: {field}: needs a restart (reload applies added and "
                              "removed nodes and leaf renames)")
    moved = replace(topo.nodes["node-001"], unit=1)
    with pytest.raises(ConfigError, match=r"^topology.yaml: nodes: node-001: unit: moved from 0 to 1"):
        topology_reload.plan(topo, Topology(topo.cluster, topo.layout, topo.nodes_per_unit, topo.spines,
                                            {**topo.nodes, "node-001": moved}), "topology.yaml")
    fewer = replace(topo.nodes["node-001"], gpus=4, nics=topo.nodes["node-001"].nics[:4])
    with pytest.raises(ConfigError, match=r"^topology.yaml: nodes: node-001: gpus: changed from 8 to 4"):
        topology_reload.plan(topo, Topology(topo.cluster, topo.layout, topo.nodes_per_unit, topo.spines,
                                            {**topo.nodes, "node-001": fewer}), "topology.yaml")
