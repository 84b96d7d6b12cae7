"""`fabricmon topology import` on real outputs: public ibnetdiscover files, ibnetdiscover run against
ibsim here, lldpctl JSON from lldpd in namespaces (tests/fixtures/topology_import/README.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fabricmon.cli import main
from fabricmon.configload import ConfigError
from fabricmon.topology import load_topology
from fabricmon.topology_import.build import import_ibnetdiscover
from fabricmon.topology_import.ibnetdiscover import IbnetParseError, parse_ibnetdiscover
from fabricmon.topology_import.naming import CaKind, ca_name, switch_name
from fabricmon.topology_import.nodemap import NodeMapError, parse_node_name_map
from fabricmon.topology_import.run import import_topology
from support.paths import FIXTURES
from support.topology_fabrics import FABRICS

FIX = FIXTURES / "topology_import"
PUBLIC = FIX / "public"
IBSIM = FIX / "ibsim"
LLDP = FIX / "lldp"



def expected_map(out: Path) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(node GUID, port) -> (host, label, leaf) from the awk-derived .expected.tsv beside ``out``."""
    rows = {}
    for line in out.with_suffix(".expected.tsv").read_text().splitlines():
        host, label, guid, port, leaf = line.split("\t")
        rows[(guid, int(port))] = (host, label, leaf)
    return rows


def imported_map(imp) -> dict[tuple[str, int], tuple[str, str, str]]:
    return {(f"0x{n.node_guid:016x}", n.port): (host, n.label or "", n.leaf)
            for host, nics in imp.nodes.items() for n in nics}


# every output but rdma-core's man page example, whose CAs are all firmware defaults (its own test)
ALL_OUTPUTS = sorted(p for p in [*PUBLIC.glob("*.out"), *IBSIM.glob("*.out")] if p.name != "rdma-core-man-example.out")


@pytest.mark.parametrize("out", ALL_OUTPUTS, ids=lambda p: p.name)
def test_every_host_port_lands_on_the_leaf_the_switch_records_name(out: Path) -> None:
    imp, _ = import_topology(ibnetdiscover=[str(out)])
    assert imported_map(imp) == expected_map(out)
    # a device only where the second word has a device's shape; else matched by GUID
    for nics in imp.nodes.values():
        for n in nics:
            assert (n.device is not None) == bool(re.fullmatch(r"(mlx[45]_\d+)", n.label or "")), n


def test_topograph_superpod_rails_agree_with_the_sites_leaf_names() -> None:
    """NVIDIA/topograph's DGX capture names leaves IBLEAF-<rail>-<unit>: the rail the import computes from
    the NIC order must be that number less one for every NIC but the two it reports as miscabled."""
    imp, _ = import_topology(ibnetdiscover=[str(PUBLIC / "topograph-example.out")])
    assert imp.rail_optimized
    wrong = []
    for host, nics in imp.nodes.items():
        for n in nics:
            m = re.search(r"IBLEAF-(\d+)-", n.leaf)
            assert m, n.leaf
            if n.rail != int(m.group(1)) - 1:
                wrong.append(f"{host}/{n.label}")
    assert wrong == []
    notes = "\n".join(imp.notes)
    assert "b08-p1-dgx-08-c01/HCA-5" in notes and "b08-p1-dgx-08-c01/HCA-6" in notes  # index != leaf's rail
    # 40 SHARP aggregation nodes (one per switch) make no leaf: the 9 spines carry only those
    assert len(imp.leaves) == 31 and all("IBLEAF" in leaf for leaf in imp.leaves)
    spines = {s for v in imp.leaves.values() for s in v}
    assert spines == {f"A10-P1-IBSPINE-0{i}" for i in range(1, 5)} | {f"B10-P1-IBSPINE-0{i}" for i in range(5, 10)}
    # firmware defaults (69 x "MT4129 ConnectX7   Mellanox Technologies") and localhost: one note counting them
    assert len(imp.skipped_firmware_default) == 72
    assert sum("firmware default" in n for n in imp.notes) == 1
    # topograph's own test expects these nodes under switch S-2c5eab0300b87a80 (its slurm output)
    text = (PUBLIC / "topograph-example.out").read_text()
    name = re.search(r'"S-2c5eab0300b87a80"\s+# "MF0;([^:]+):', text).group(1)
    for c in ["01", "02", "03", "04", "07", "10", "11", "12", "14", "16", "18"]:
        assert name in {n.leaf for n in imp.nodes[f"a06-p1-dgx-02-c{c}"]}


def test_rdma_core_man_example_needs_the_node_name_map() -> None:
    man = str(PUBLIC / "rdma-core-man-example.out")
    with pytest.raises(ConfigError, match=r"no host found.*4 CAs whose description is a firmware default"):
        import_topology(ibnetdiscover=[man])
    imp, _ = import_topology(ibnetdiscover=[man], node_name_map=str(PUBLIC / "rdma-core-man-example.node-name-map"))
    got = {(h, n.port): n.leaf for h, nics in imp.nodes.items() for n in nics}
    assert got == {("hca-1", 1): "ISR 9024", ("hca-1", 2): "ISR 9024", ("hca-3", 1): "ISR 9024",
                   ("hca-2", 1): "ISR 6000", ("hca-4", 1): "ISR 6000"}
    assert any("leaves link to other leaves" in n for n in imp.notes)


def test_node_name_map_names_firmware_default_cas_and_vendor_default_switches(tmp_path) -> None:
    nmap = tmp_path / "ib-node-name-map"
    nmap.write_text('# site names\n0xb8cef60300a11050 "gpu-a17-09 mlx5_0"\n0xb8cef60300a11060 "gpu-a17-09 mlx5_1"\n'
                    '0xb8cef60300f00040 "spine-a1"\n')
    imp, _ = import_topology(ibnetdiscover=[str(IBSIM / "forms-plane-a.out")], node_name_map=str(nmap))
    assert [(n.device, n.leaf, n.rail) for n in imp.nodes["gpu-a17-09"]] == [("mlx5_0", "leaf-a0", 0),
                                                                                ("mlx5_1", "leaf-a1", 1)]
    assert imp.leaves["leaf-a0"] == ["spine-a1", "spine-a2"]
    assert Counter(" ".join(d.split()) for _, d in imp.skipped_firmware_default) == {"localhost mlx5_0": 1}


def test_the_same_plane_twice_merges_by_guid() -> None:
    a = str(IBSIM / "forms-plane-a.out")
    once, _ = import_topology(ibnetdiscover=[a])
    twice, _ = import_topology(ibnetdiscover=[a, a])
    assert imported_map(twice) == imported_map(once) and twice.leaves == once.leaves


def test_pasted_session_with_prompt_and_ibwarn() -> None:
    imp, _ = import_topology(ibnetdiscover=[str(PUBLIC / "ibsim-session-paste.out")])
    assert {h: [n.leaf for n in nics] for h, nics in imp.nodes.items()} == {"Hca1": ["Switch1"], "Hca2": ["Switch1"]}
    assert imp.leaves == {"Switch1": ["Switch2"]}
    assert not imp.rail_optimized


def test_two_planes_merge_by_host_with_every_description_form() -> None:
    a, b = str(IBSIM / "forms-plane-a.out"), str(IBSIM / "forms-plane-b.out")
    imp, _ = import_topology(ibnetdiscover=[a, b])
    nodes = {h: [(n.device or n.label, n.port, n.leaf, n.rail) for n in nics] for h, nics in imp.nodes.items()}
    assert nodes == {
        "gpu-a17-03": [("mlx5_0", 1, "leaf-a0", 0), ("mlx5_1", 1, "leaf-a1", 1),
                       ("mlx5_2", 1, "leaf-b0", 2), ("mlx5_3", 1, "leaf-b1", 3)],
        "gpu-a17-04": [("HCA-1", 1, "leaf-a0", 0), ("HCA-2", 1, "leaf-a1", 1),
                       ("HCA-3", 1, "leaf-b0", 2), ("HCA-4", 1, "leaf-b1", 3)],
        "gpu-a17-05": [("mlx5_0", 1, "leaf-a0", 0), ("mlx5_1", 1, "leaf-a1", 1),
                       ("mlx5_2", 1, "leaf-b0", 2), ("mlx5_3", 1, "leaf-b1", 3)],
        "gpu-b01": [("mlx4_0", 1, "leaf-a0", 0), ("mlx4_0", 2, "leaf-a1", 1),
                    ("mlx4_1", 1, "leaf-b0", 2), ("mlx4_1", 2, "leaf-b1", 3)],
        "gpu-b02": [("mlx5_0", 1, "pod1_leaf-a2", 0), ("mlx5_2", 1, "pod1_leaf-b2", 2)],
    }
    assert all(n.device is None and n.node_guid for n in imp.nodes["gpu-a17-04"])  # HCA-N: by GUID
    assert imp.rail_optimized
    # the vendor-default spine is switch-<guid>; its SHARP aggregation node did not make it a leaf
    assert imp.leaves["leaf-a0"] == ["spine-a2", "switch-b8cef60300f00040"]
    assert "switch-b8cef60300f00040" not in imp.leaves
    skipped = Counter(" ".join(d.split()) for _, d in imp.skipped_firmware_default)
    assert skipped == {"MT4123 ConnectX6 Mellanox Technologies": 4, "localhost mlx5_0": 1, "localhost mlx5_2": 1}
    assert sum("firmware default" in n for n in imp.notes) == 1
    kept, _ = import_topology(ibnetdiscover=[a], keep_domain=True)
    assert "gpu-a17-05.cluster.example" in kept.nodes


def test_fat_tree_has_no_rails() -> None:
    imp, _ = import_topology(ibnetdiscover=[str(IBSIM / "fat-tree.out")])
    assert not imp.rail_optimized
    assert all(n.rail is None for nics in imp.nodes.values() for n in nics)
    assert all(len({n.leaf for n in nics}) == 1 for nics in imp.nodes.values())
    assert Counter(nics[0].leaf for nics in imp.nodes.values()) == {"leaf-0": 4, "leaf-1": 4}
    assert any("fat tree" in n for n in imp.notes)


def test_router_makes_no_leaf() -> None:
    imp, _ = import_topology(ibnetdiscover=[str(IBSIM / "router.out")])
    assert imp.leaves == {"leaf-r": ["gw-sw"]}  # the gateway switch carries only the router: a spine here
    assert set(imp.nodes) == {"gpu-r01", "gpu-r02"}


def test_progress_is_reported_on_long_inputs() -> None:
    text = (IBSIM / "rail-optimized.out").read_text()
    seen: list[int] = []
    parse_ibnetdiscover(text, progress=seen.append, every=500)
    assert seen == [500, 1000, 1280]


# ---------------------------------------------------------------------------------- robustness


def test_bom_crlf_prompt_comments_give_the_same_topology() -> None:
    clean = (IBSIM / "forms-plane-a.out").read_text()
    lines = clean.splitlines()
    messy = ("\ufeff[root@head-01 ~]# ibnetdiscover --node-name-map /etc/opensm/ib-node-name-map\r\n"
             + "\r\n".join(lines[:6] + ["# a comment someone added", "   "] + lines[6:])
             + "\r\n[root@head-01 ~]# \r\n")
    want = imported_map(import_ibnetdiscover([("x", parse_ibnetdiscover(clean))]))
    got = imported_map(import_ibnetdiscover([("x", parse_ibnetdiscover(messy))]))
    assert got == want and len(want) == 9


@pytest.mark.parametrize("bad,line,problem", [
    ("Switch 36 \"S-00\" # \"x\"\n[1] \"H-01\"[1](01) # \"h mlx5_0\" lid 1 4xHDR\n[1] \"H-02\"[1](02)\n", 3,
     "port 1 of 0x0000000000000000 listed twice"),
    ("[1]\t\"S-0a\"[3]\t\t# \"x\" lid 0 4xSDR\n", 1, "port line outside"),
    ("vendid=0x2c9\nthis is not ibnetdiscover\n", 2, "not ibnetdiscover topology output"),
    ("Switch 36 \"H-00\" # \"x\"\n", 1, 'Switch record with a "H-" id'),
    ("Ca 1 \"H-00\" # \"x\"\n[1](01) \"S-0b\"[999] # lid 0 lmc 0 \"y\" lid 0 4xSDR\n", 2, "out of range"),
    ("# only comments\n\n", 2, "no Switch or Ca records"),
    # the neighbouring tools' outputs (lines from the ib-commands-zh page's ibnodes and iblinkinfo)
    ('Ca  : 0x0002c903000d7aac ports 1 "ip-160 HCA-1"\n', 1, "`ibnodes`/`ibswitches`/`ibhosts` output"),
    ("CA: ip-160 HCA-1:\n", 1, "`iblinkinfo` output"),
    # first line of `ibsim-run ibnetdiscover -p` on ibsim/fat-tree.net, run here
    (("CA     0  1 0x00000c42d1000703 4x SDR - SW     0  8 0x00000c42e0000001 ( 'node07 mlx5_1' - "
      "'MF0;leaf-1:MQM8700/U1' )\n"), 1, "`ibnetdiscover -p` (ports report) output"),
])
def test_bad_input_names_the_line(bad: str, line: int, problem: str) -> None:
    with pytest.raises(IbnetParseError) as exc:
        parse_ibnetdiscover(bad)
    assert exc.value.line == line and problem in str(exc.value), str(exc.value)


def test_cli_bad_input_is_one_line_with_file_and_line(tmp_path, capsys) -> None:
    f = tmp_path / "fabric.txt"
    f.write_text((IBSIM / "fat-tree.out").read_text().replace("[2]\t\"H-", "[2]\tgarbage \"H-", 1))
    assert main(["topology", "import", "--ibnetdiscover", str(f), "-o", str(tmp_path / "t.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{f}: line " in err[0] and "not an ibnetdiscover port line" in err[0], err
    assert not (tmp_path / "t.yaml").exists()


def test_node_name_map_parser() -> None:
    text = '# comment\n0x0008f10400411a08 "SW1  (Rack  3) ISR9024 Voltaire 9024D"\n\n0002c903000cc89a gpu-1 mlx4_0\n'
    assert parse_node_name_map(text) == {0x0008F10400411A08: "SW1  (Rack  3) ISR9024 Voltaire 9024D",
                                         0x0002C903000CC89A: "gpu-1 mlx4_0"}
    with pytest.raises(NodeMapError, match="line 2"):
        parse_node_name_map('0x01 "a"\nnot-a-guid "b"\n')


@pytest.mark.parametrize("desc,kind,host,device", [
    ("gpu-a17-03 mlx5_3", CaKind.HOST, "gpu-a17-03", "mlx5_3"),
    ("gpu-a17-03.cluster.example bnxt_re0", CaKind.HOST, "gpu-a17-03", "bnxt_re0"),
    ("gpu-a17-03 HCA-1", CaKind.HOST, "gpu-a17-03", None),
    ("rack1/gpu-7 irdma1", CaKind.HOST, "rack1_gpu-7", "irdma1"),
    ("MT4129 ConnectX7   Mellanox Technologies", CaKind.FIRMWARE_DEFAULT, None, None),
    ("localhost mlx5_0", CaKind.FIRMWARE_DEFAULT, None, None),
    ("", CaKind.FIRMWARE_DEFAULT, None, None),
    ("Mellanox Technologies Aggregation Node", CaKind.AGGREGATION, None, None),
])
def test_ca_names(desc, kind, host, device) -> None:
    cn = ca_name(desc)
    assert (cn.kind, cn.host, cn.device) == (kind, host, device)


@pytest.mark.parametrize("desc,name", [
    ("MF0;leaf-a3:MQM9700/U1", "leaf-a3"), ("MF0;core-1:CS7520/L05/U1", "core-1_L05"),
    ("QM9700 L07", "QM9700 L07"), ("Quantum Mellanox Technologies", "switch-b8cef60300f00040"),
    ("MellanoxIS5030", "switch-b8cef60300f00040"), ("", "switch-b8cef60300f00040"), ("pod/leaf", "pod_leaf"),
])
def test_switch_names(desc, name) -> None:
    assert switch_name(desc, 0xB8CEF60300F00040)[0] == name


# ---------------------------------------------------------------------------------- generator = ibsim


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_generator_writes_ibsims_input_and_ibnetdiscovers_output_byte_for_byte(name: str) -> None:
    fabric = FABRICS[name]()
    assert fabric.net_file() == (IBSIM / f"{name}.net").read_text()
    real = (IBSIM / f"{name}.out").read_text()
    date = re.search(r"generated on (.*)\n", real).group(1)
    assert fabric.ibnetdiscover(date) == real


def test_ibnetdiscover_against_ibsim_live(tmp_path) -> None:
    """The one test that runs the real tools (Debian ibsim-utils, infiniband-diags)."""
    if not (shutil.which("ibsim") and shutil.which("ibsim-run") and shutil.which("ibnetdiscover")):
        pytest.skip("needs ibsim-utils and infiniband-diags (apt-get install -y ibsim-utils infiniband-diags)")
    net = tmp_path / "forms-plane-a.net"
    net.write_text((IBSIM / "forms-plane-a.net").read_text())
    sim = subprocess.Popen(["ibsim", "-n", "-s", str(net)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            run = subprocess.run(["ibsim-run", "ibnetdiscover"], check=False, cwd=tmp_path, capture_output=True,
                                 text=True,
                                 timeout=10)
            if run.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        sim.terminate()
        sim.wait(timeout=5)
    assert run.returncode == 0, run.stderr
    strip = re.compile(r"generated on .*")
    assert strip.sub("", run.stdout) == strip.sub("", (IBSIM / "forms-plane-a.out").read_text())


# ---------------------------------------------------------------------------------- LLDP


def test_lldp_both_json_shapes() -> None:
    import json

    from fabricmon.topology_import.lldp import parse_lldpctl_json

    json_list = parse_lldpctl_json(json.loads((LLDP / "gpu-a17-03.json").read_text()))  # -f json, 2 interfaces
    json0 = parse_lldpctl_json(json.loads((LLDP / "gpu-a17-04.json").read_text()))  # -f json0
    json_one = parse_lldpctl_json(json.loads((LLDP / "gpu-a17-05.json").read_text()))  # -f json, 1 interface
    assert [(n.interface, n.chassis_name, n.port_id, n.is_switch) for n in json_list] == [
        ("ens3f0np0", "leaf-r0", "swp1", True), ("ens3f1np1", "leaf-r1", "swp1", True)]
    assert [(n.interface, n.chassis_name, n.port_id, n.is_switch) for n in json0] == [
        ("ens3f0np0", "leaf-r0", "swp2", True), ("ens3f1np1", "leaf-r1", "swp2", True)]
    assert [(n.interface, n.chassis_name, n.port_id) for n in json_one] == [("ens3f0np0", "leaf-r0", "swp3")]


def test_lldp_import(tmp_path, capsys) -> None:
    out = tmp_path / "roce.yaml"
    assert main(["topology", "import", "--lldp", str(LLDP), "--cluster", "roce-a", "-o", str(out),
                 "--log-level", "error"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["layout"] == "roce" and doc["rail_optimized"] is True
    nics = {(n["name"], c["interface"]): (c["leaf"], c["rail"], c["device"]) for n in doc["nodes"] for c in n["nics"]}
    assert nics == {("gpu-a17-03", "ens3f0np0"): ("leaf-r0", 0, None),
                    ("gpu-a17-03", "ens3f1np1"): ("leaf-r1", 1, None),
                    ("gpu-a17-04", "ens3f0np0"): ("leaf-r0", 0, None),
                    ("gpu-a17-04", "ens3f1np1"): ("leaf-r1", 1, None),
                    ("gpu-a17-05", "ens3f0np0"): ("leaf-r0", 0, None)}
    # leaf-r0.json is the switch's own capture: its uplink neighbor is its spine; leaf-r1 gave none
    assert doc["leaves"] == {"leaf-r0": {"spines": ["spine-1"]}, "leaf-r1": {"spines": []}}
    topo = load_topology(out)
    assert topo.nodes["gpu-a17-03"].nics == () and len(topo.nodes["gpu-a17-03"].unbound) == 2
    assert topo.binding.bind_devices("gpu-a17-03", {"ens3f0np0": "mlx5_0", "ens3f1np1": "mlx5_1"}) == 2
    assert topo.leaf_of_nic("gpu-a17-03", "mlx5_1") == "leaf-r1"
    assert topo.labels_of_link("gpu-a17-03", "mlx5_1") == {"node": "gpu-a17-03", "rail": "1", "leaf": "leaf-r1"}


def test_lldp_bad_json_names_the_file(tmp_path) -> None:
    (tmp_path / "gpu-1.json").write_text('{"lldp": {"interface": ')
    with pytest.raises(ConfigError, match=r"gpu-1.json: line 1: invalid JSON"):
        import_topology(lldp=str(tmp_path))


def _with_storage_nic(capture: dict, port: str, storage_switch: str) -> dict:
    """A real ``lldpctl -f json`` capture (lldp/gpu-a17-03.json, several interfaces: a list) with the
    compute ports moved to ``port`` and a third interface, ``ens1f0np0``, whose neighbor is
    ``storage_switch``: the same record lldpd wrote for ens3f0np0, renamed."""
    import copy

    doc = copy.deepcopy(capture)
    ifaces = doc["lldp"]["interface"]
    for entry in ifaces:
        for body in entry.values():
            body["port"]["id"]["value"] = body["port"]["descr"] = port
    (first,) = ifaces[0].values()
    storage = copy.deepcopy(first)
    ((_, chassis),) = storage["chassis"].items()
    storage["chassis"] = {storage_switch: chassis}
    ifaces.insert(0, {"ens1f0np0": storage})  # first in name order, as the import had it
    return doc


def test_a_storage_nic_on_a_switch_of_its_own_is_on_no_rail(tmp_path) -> None:
    """Each node's storage NIC on a storage switch no other node reaches: before, it sorted first and
    became rail 0 (its switch "leaf" of rail 0, every GPU NIC one rail off); it is on no rail, and the
    GPU NICs keep rails 0 and 1."""
    import json

    capture = json.loads((LLDP / "gpu-a17-03.json").read_text())
    (tmp_path / "gpu-a17-03.json").write_text(json.dumps(_with_storage_nic(capture, "swp1", "stor-sw-1")))
    (tmp_path / "gpu-a17-04.json").write_text(json.dumps(_with_storage_nic(capture, "swp2", "stor-sw-2")))
    shutil.copy(LLDP / "gpu-a17-05.json", tmp_path / "gpu-a17-05.json")
    out = tmp_path / "roce.yaml"
    assert main(["topology", "import", "--lldp", str(tmp_path), "--cluster", "roce-a", "-o", str(out),
                 "--log-level", "error"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["rail_optimized"] is True
    nics = {(n["name"], c["interface"]): (c["leaf"], c["rail"]) for n in doc["nodes"] for c in n["nics"]}
    assert nics == {("gpu-a17-03", "ens1f0np0"): ("stor-sw-1", None),
                    ("gpu-a17-03", "ens3f0np0"): ("leaf-r0", 0),
                    ("gpu-a17-03", "ens3f1np1"): ("leaf-r1", 1),
                    ("gpu-a17-04", "ens1f0np0"): ("stor-sw-2", None),
                    ("gpu-a17-04", "ens3f0np0"): ("leaf-r0", 0),
                    ("gpu-a17-04", "ens3f1np1"): ("leaf-r1", 1),
                    ("gpu-a17-05", "ens3f0np0"): ("leaf-r0", 0)}
    # rail null in a rail-optimized file: the storage NIC serves no GPU, even in the name-order fallback
    # (before an agent's hello pairs them by PCI affinity): GPU 0 depends on leaf-r0, not the storage switch
    topo = load_topology(out)
    names = {"ens1f0np0": "mlx5_2", "ens3f0np0": "mlx5_0", "ens3f1np1": "mlx5_1"}
    assert topo.binding.bind_devices("gpu-a17-03", names) == 3
    assert topo.labels_of_link("gpu-a17-03", "mlx5_0")["rail"] == "0"
    assert topo.nic("gpu-a17-03", "mlx5_2").gpu == -1
    assert topo.leaf_of_nic("gpu-a17-03", topo.nic_for_gpu("gpu-a17-03", 0).device) == "leaf-r0"


def test_a_node_alone_on_its_leaves_keeps_its_rails() -> None:
    """The rule takes only a node's extra NICs: a node whose every NIC is alone on its leaf (the last,
    partly cabled unit) is still on rails."""
    from fabricmon.topology_import.build import Imported, Nic, assign_rails

    imp = Imported("roce")
    for h in ("a", "b"):
        imp.nodes[h] = [Nic(h, "leaf-r0", interface="eth0"), Nic(h, "leaf-r1", interface="eth1")]
    imp.nodes["c"] = [Nic("c", "leaf-u2-r0", interface="eth0"), Nic("c", "leaf-u2-r1", interface="eth1")]
    assert assign_rails(imp) is True
    assert [n.rail for n in imp.nodes["c"]] == [0, 1]
