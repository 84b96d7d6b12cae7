"""The imported topology keeps both ends of each host cable (each NIC's ``leaf_port``) and every switch's
GUID (``switches:``), from real ibnetdiscover output against ibsim; version-2 files without them stay
valid, and bad values are one line naming the field."""

from __future__ import annotations

import pytest
import yaml

from fabricmon.cli import main
from fabricmon.configload import ConfigError
from fabricmon.topology import load_topology
from support.paths import FIXTURES

# ibnetdiscover (infiniband-diags 44.0) against ibsim with opensm: tests/fixtures/ib_switches/README.md
IBNET = FIXTURES / "ib_switches" / "ibnetdiscover-cache.out"


def test_import_keeps_leaf_ports_and_switch_guids(tmp_path):
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", "--ibnetdiscover", str(IBNET), "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    ports = {(n["name"], nic["leaf"], nic["leaf_port"]) for n in doc["nodes"] for nic in n["nics"]}
    assert ports == {("node-000", "leaf-00", 1), ("node-001", "leaf-00", 2),
                     ("node-002", "leaf-01", 1), ("node-003", "leaf-01", 2)}
    assert doc["switches"] == {"leaf-00": {"guid": "0x00000c42b0000000"}, "leaf-01": {"guid": "0x00000c42b0000001"},
                               "spine-00": {"guid": "0x00000c42c0000000"},
                               "spine-01": {"guid": "0x00000c42c0000001"}}
    topo = load_topology(out)
    node, nic = topo.nic_on_leaf_port("leaf-01", 2) or ("", None)
    assert node == "node-003" and nic is not None and nic.device == "mlx5_0"
    assert topo.nic_on_leaf_port("leaf-01", 3) is None  # an uplink, not a host cable
    assert topo.switches["spine-01"] == "0x00000c42c0000001"
    again = tmp_path / "again.yaml"
    topo.write_yaml(again)  # written back with both
    assert load_topology(again).nic_on_leaf_port("leaf-00", 1)[0] == "node-000"  # type: ignore[index]


def _v2(tmp_path, nic_extra: dict, top_extra: dict | None = None):
    doc = {"version": 2, "cluster": "c", "layout": "ib",
           "nodes": [{"name": "h1", "nics": [{"device": "mlx5_0", "leaf": "leaf-a", **nic_extra}]},
                     {"name": "h2", "nics": [{"device": "mlx5_0", "leaf": "leaf-a", "leaf_port": 2}]}],
           "leaves": {"leaf-a": {"spines": ["spine-1"]}}, **(top_extra or {})}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_files_without_them_stay_valid(tmp_path):
    topo = load_topology(_v2(tmp_path, {}))
    assert topo.switches == {} and topo.nic_on_leaf_port("leaf-a", 2)[0] == "h2"  # type: ignore[index]


@pytest.mark.parametrize(("nic", "top", "problem"), [
    ({"leaf_port": 0}, None, "nodes[0].nics[0].leaf_port: must be 1..255"),
    ({"leaf_port": 2}, None, "nodes[1].nics[0].leaf_port: leaf-a port 2 is also h1's"),
    ({}, {"switches": {"leaf-a": {"guid": "zz"}}}, "switches.leaf-a.guid: not a hex GUID"),
    ({}, {"switches": {"a/b": {"guid": "0x1"}}}, "switches.a/b: holds '/'"),
])
def test_bad_cable_ends_are_one_line_naming_the_field(tmp_path, nic, top, problem):
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        load_topology(_v2(tmp_path, nic, top))


def test_leaf_port_without_leaf_is_refused(tmp_path):
    doc = {"version": 2, "nodes": [{"name": "h1", "nics": [{"device": "mlx5_0", "leaf_port": 3}]}]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.nics\[0\]\.leaf_port: given without leaf"):
        load_topology(path)


def test_lldp_import_writes_the_switch_port_and_ethernet_port_names_load(tmp_path):
    """LLDP's port ID (lldpd's captures in tests/fixtures/topology_import/lldp) is the switch's end of each
    host cable: written as ``leaf_port`` (a port name), looked up as the gNMI source's ``port`` label."""
    lldp = FIXTURES / "topology_import" / "lldp"
    out = tmp_path / "roce.yaml"
    assert main(["topology", "import", "--lldp", str(lldp), "--cluster", "roce-a", "-o", str(out),
                 "--log-level", "error"]) == 0
    doc = yaml.safe_load(out.read_text())
    ends = {(n["name"], c["interface"]): (c["leaf"], c.get("leaf_port")) for n in doc["nodes"] for c in n["nics"]}
    assert ends[("gpu-a17-03", "ens3f0np0")] == ("leaf-r0", "swp1")
    assert ends[("gpu-a17-04", "ens3f1np1")] == ("leaf-r1", "swp2")
    topo = load_topology(out)
    assert topo.nic_on_leaf_port("leaf-r0", "swp3")[0] == "gpu-a17-05"  # type: ignore[index]
    # an Ethernet port name with a slash is a valid leaf_port; a name with a space is not
    base = {"version": 2, "nodes": [{"name": "h1", "nics": [{"device": "mlx5_0", "leaf": "leaf-a",
                                                            "leaf_port": "Ethernet1/1"}]}]}
    f = tmp_path / "eth.yaml"
    f.write_text(yaml.safe_dump(base))
    assert load_topology(f).nic_on_leaf_port("leaf-a", "Ethernet1/1")[0] == "h1"  # type: ignore[index]
    base["nodes"][0]["nics"][0]["leaf_port"] = "Ethernet 1"
    f.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"nics\[0\]\.leaf_port: a port number or a switch port name"):
        load_topology(f)
