"""The fabrics behind tests/fixtures/topology_import/ibsim: each one's ibsim net file (``*.net``) and the
output of Debian's ibnetdiscover against ibsim on it (``*.out``) are committed; the tests check the net
files and ibnetgen's text against them byte for byte."""

from __future__ import annotations

from pathlib import Path

import yaml

from fabricmon.topology_import.ibnetgen import GenFabric, fat_tree, rail_optimized

# Spine and leaf GUIDs in the style of Quantum-2 switches (b8:ce:f6 is an NVIDIA OUI), CAs ConnectX-7's.
FW_DEFAULT = "MT4123 ConnectX6   Mellanox Technologies"


def _hosts(f: GenFabric, base: int, entries: list[tuple[str, int]]) -> list[int]:
    guids = []
    for k, (desc, ports) in enumerate(entries):
        g = base + (k << 4)
        f.add("ca", g, ports, desc)
        guids.append(g)
    return guids


def forms_plane(plane: str) -> GenFabric:
    """One plane of a rail-optimized fabric whose descriptions take every form of the contract: host and
    device, ``host HCA-N`` (GUID matching), an FQDN, firmware defaults, ``localhost``, a dual-port HCA,
    ``MF0;name:model/U1`` leaves, a leaf name with a ``/``, a vendor-default spine, a SHARP aggregation
    node on a spine.  Plane ``a`` carries rails 0-1 (mlx5_0, mlx5_1), plane ``b`` rails 2-3."""
    f = GenFabric()
    a = plane == "a"
    d0, d1 = ("mlx5_0", "mlx5_1") if a else ("mlx5_2", "mlx5_3")
    h0, h1 = ("HCA-1", "HCA-2") if a else ("HCA-3", "HCA-4")
    cab = 0xb8cef60300a10000 if a else 0xb8cef60300b10000
    sw = 0xb8cef60300f00000 if a else 0xb8cef60300e00000
    # the node ibnetdiscover runs on comes first (ibsim attaches its client to the first node)
    start = _hosts(f, cab, [(f"gpu-a17-03 {d0}", 1)])[0]
    hosts = _hosts(f, cab + 0x1000, [
        (f"gpu-a17-03 {d1}", 1),
        (f"gpu-a17-04 {h0}", 1), (f"gpu-a17-04 {h1}", 1),
        (f"gpu-a17-05.cluster.example {d0}", 1), (f"gpu-a17-05.cluster.example {d1}", 1),
        (FW_DEFAULT, 1), (FW_DEFAULT, 1),
        (f"localhost {d0}", 1),
        (f"gpu-b01 mlx4_{0 if a else 1}", 2),
        (f"gpu-b02 {d0}", 1),
    ])
    c03_1, c04_0, c04_1, c05_0, c05_1, fw0, fw1, local, dual, b02 = hosts
    leaf0 = f.add("switch", sw + 0x10, 36, f"MF0;leaf-{plane}0:MQM9700/U1").guid
    leaf1 = f.add("switch", sw + 0x20, 36, f"MF0;leaf-{plane}1:MQM9700/U1").guid
    pod = f.add("switch", sw + 0x30, 36, f"MF0;pod1/leaf-{plane}2:MQM9700/U1").guid
    spine_default = f.add("switch", sw + 0x40, 36, "Quantum Mellanox Technologies").guid
    spine_named = f.add("switch", sw + 0x50, 36, f"MF0;spine-{plane}2:MQM9790/U1").guid
    sharp = f.add("ca", sw + 0x41, 1, "Mellanox Technologies Aggregation Node").guid
    # rail 0 of this plane on leaf0, rail 1 on leaf1
    for port, g in enumerate([start, c04_0, c05_0, fw0, local], 1):
        f.link(g, 1, leaf0, port)
    for port, g in enumerate([c03_1, c04_1, c05_1, fw1], 1):
        f.link(g, 1, leaf1, port)
    f.link(dual, 1, leaf0, 10)  # a dual-port HCA: one port on each rail's leaf
    f.link(dual, 2, leaf1, 10)
    f.link(b02, 1, pod, 1)
    for k, leaf in enumerate([leaf0, leaf1, pod]):
        f.link(leaf, 35, spine_default, 1 + k)
        f.link(leaf, 36, spine_named, 1 + k)
    f.link(sharp, 1, spine_default, 36)
    return f


def fat_tree_small() -> GenFabric:
    """Eight nodes with two NICs each, four nodes on each of two leaves (both NICs of a node on one leaf),
    two vendor-default spines."""
    return fat_tree(8, nics=2, nodes_per_leaf=4, spines=2, ports=12)


def rail_optimized_small() -> GenFabric:
    """The benchmark's fabric at ibsim's size: 32 nodes, 4 rails, 8 nodes per leaf, 2 spines per rail, 2 cores."""
    return rail_optimized(32, rails=4, nodes_per_leaf=8, spines_per_rail=2, cores=2)


def router_fabric() -> GenFabric:
    """A leaf with two hosts and an InfiniBand router (Skyway-style description) on a port, up to a gateway
    switch that carries only the router's second port: neither the router nor the gateway switch makes a
    leaf of its own."""
    f = GenFabric()
    h1 = f.add("ca", 0xb8cef60300d10000, 1, "gpu-r01 mlx5_0").guid
    h2 = f.add("ca", 0xb8cef60300d10010, 1, "gpu-r02 mlx5_0").guid
    leaf = f.add("switch", 0xb8cef60300d20000, 36, "MF0;leaf-r:MQM9700/U1").guid
    gw = f.add("switch", 0xb8cef60300d30000, 36, "MF0;gw-sw:MQM9700/U1").guid
    rt = f.add("router", 0xb8cef60300d40000, 2, "MF0;gw-1:SB7780/U1").guid
    f.link(h1, 1, leaf, 1)
    f.link(h2, 1, leaf, 2)
    f.link(leaf, 35, gw, 1)
    f.link(rt, 1, leaf, 36)
    f.link(rt, 2, gw, 2)
    return f


FABRICS = {"forms-plane-a": lambda: forms_plane("a"), "forms-plane-b": lambda: forms_plane("b"),
           "fat-tree": fat_tree_small, "rail-optimized": rail_optimized_small, "router": router_fabric}


def fat_tree_halves(tmp_path: Path) -> Path:
    """A version-2 fat tree with named leaves, 8 nodes of 8 NICs: node i's lower four NICs on ``leaf-a<i>``,
    its upper four on the next leaf, so ``leaf-a3`` carries the upper NICs of gpu-a17-02 and the lower of
    gpu-a17-03 (eight NICs of two nodes): no node and no GPU index is one leaf's, only the topology's
    cabling says which ranks share it."""
    nodes = [{"name": f"gpu-a17-{i:02d}", "nics": [{"device": f"mlx5_{k}", "port": 1, "rail": None,
                                                     "leaf": f"leaf-a{(i + k // 4) % 8}"} for k in range(8)]}
             for i in range(8)]
    doc = {"version": 2, "cluster": "prod-a", "layout": "ib", "rail_optimized": False, "nodes": nodes,
           "leaves": {f"leaf-a{i}": {"spines": ["spine-01", "spine-02"]} for i in range(8)}}
    path = tmp_path / "fat.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
