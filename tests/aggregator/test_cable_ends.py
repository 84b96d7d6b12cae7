"""A link page names both ends of its cable (issue 36: "no switch port" on pages): the host NIC and the leaf
port the topology import read from ibnetdiscover; an uplink names its leaf and spine ports."""

from __future__ import annotations

from fabricmon import components
from fabricmon.aggregator.cable_ends import annotate, cable_line
from fabricmon.aggregator.incidents import Finding
from fabricmon.cli import main
from fabricmon.topology import Topology, generate_topology, load_topology
from support.paths import FIXTURES

# ibnetdiscover (infiniband-diags 44.0) against ibsim with opensm: tests/fixtures/ib_switches/README.md
IBNET = FIXTURES / "ib_switches" / "ibnetdiscover-cache.out"


def _imported(tmp_path) -> Topology:
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(IBNET), "-o", str(out)]) == 0
    return load_topology(out)


def test_a_link_incident_names_the_leaf_port_at_the_other_end(tmp_path) -> None:
    topo = _imported(tmp_path)
    link = components.link("node-003", "mlx5_0", 1, leaf="leaf-01")
    f = Finding("FabricLinkErrors", link, {"node": "node-003"}, ["symbol errors +120 in 3 s"])
    annotate([f], topo)
    assert f.description == "Cable: node-003 mlx5_0 port 1 <-> leaf-01 port 2"
    # a description a detector wrote stays its own
    g = Finding("FabricLinkDown", link, {}, [], description="waiting for the subnet manager")
    annotate([g], topo)
    assert g.description == "waiting for the subnet manager"


def test_an_uplink_names_both_switch_ports_and_a_generated_leaf_says_its_port_is_unknown(tmp_path) -> None:
    up = components.uplink("leaf-00", 3, "spine-00", 1)
    assert cable_line(up, _imported(tmp_path)) == "Cable: leaf-00 port 3 <-> spine-00 port 1"
    gen = generate_topology(16, nodes_per_unit=8)
    line = cable_line(components.link("node-009", "mlx5_3", 1, rail=3, leaf="leaf-u1-r3"), gen)
    assert line.startswith("Cable: node-009 mlx5_3 port 1 <-> leaf-u1-r3 (port not known")
    assert cable_line(components.gpu("node-009", 3), gen) == ""
