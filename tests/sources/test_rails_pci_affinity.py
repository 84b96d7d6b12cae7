"""Discovery's rails by PCI affinity (rail k = the NIC under GPU k's PCIe switch), its fallback to
the model rules, the log line and the metric that say which rule gave the rails and why.

Trees: tests/fixtures/pci_affinity (real NCCL topology dumps, built into sysfs by
support/pcitree.py), the Broadcom driver fixture node, the simulator's mlx5 node."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import Inventory, RailLog, discover
from fabricmon.sources.pci_affinity import NO_GPU, NOT_ONE_TO_ONE, PAIRED, GpuScan
from support.paths import FIXTURES
from support.pcitree import build_sysfs, load, switch_pairs


def _rails(inv: Inventory) -> dict[str, str]:
    return {d.name: d.rail for d in inv.devices}


def _info(inv: Inventory) -> list[tuple[tuple[str, str], ...]]:
    src = InfinibandSource()
    try:
        res = src.poll(inv)
    finally:
        src.close()
    return [r.labels for r in res.readings if r.family == "fabricmon_rail_assignment_info" and r.value == 1]


def test_hgx_h100_rails_follow_the_gpus(tmp_path: Path) -> None:
    root = load("hgx-h100-ibm-gx3d.topo.xml")
    inv = discover(str(build_sysfs(root, tmp_path / "sys")))
    assert (inv.rail_source, inv.rail_affinity) == ("pci_affinity", PAIRED)
    assert _rails(inv) == {nic: str(gpu) for nic, gpu in switch_pairs(root).items()}
    assert _rails(inv)["mlx5_0"] == "7"  # not "0": device order is not the rail order on this node
    assert [p.rail for p in inv.ports if p.device == "mlx5_7"] == ["0"]  # the port series carry it
    assert _info(inv) == [(("source", "pci_affinity"), ("pci_affinity", PAIRED))]


def test_configured_map_still_wins(tmp_path: Path) -> None:
    inv = discover(str(build_sysfs(load("hgx-h100-ibm-gx3d.topo.xml"), tmp_path / "sys")), rails={"mlx5_0": 0})
    assert inv.rail_source == "configured" and _rails(inv)["mlx5_0"] == "0" and _rails(inv)["mlx5_7"] == ""


def test_a100_four_nics_fall_back_to_the_model_and_say_why(tmp_path: Path) -> None:
    inv = discover(str(build_sysfs(load("a100-8gpu-4cx6-simai.topo.xml"), tmp_path / "sys")))
    assert (inv.rail_source, inv.rail_affinity) == ("hca_type", NOT_ONE_TO_ONE)
    # the next rule: all five are MT4125 (15b3:101d), numbered in device order
    assert _rails(inv) == {f"mlx5_bond_{i}": str(i) for i in range(5)}
    assert _info(inv) == [(("source", "hca_type"), ("pci_affinity", NOT_ONE_TO_ONE))]
    rail_log = RailLog()
    with capture_logs() as logs:
        rail_log(inv)
        rail_log(inv)  # the same outcome at the next poll: no second line
    assert len(logs) == 1
    assert logs[0]["event"] == "rails_not_from_pci_affinity" and logs[0]["reason"] == NOT_ONE_TO_ONE
    assert logs[0]["detail"] == "GPU 0's nearest NIC mlx5_bond_1 is nearer GPU 1"
    assert logs[0]["source"] == "hca_type"


def test_bnxt_node_without_gpus_still_gets_rails(tmp_path: Path) -> None:
    node = tmp_path / "node"
    shutil.copytree(FIXTURES / "drivers" / "bnxt-thor2-gen1" / "node", node, symlinks=True)
    inv = discover(str(node / "sys"))
    assert (inv.rail_source, inv.rail_affinity) == ("hca_type", NO_GPU)
    assert _rails(inv) == {"bnxt_re0": "0", "bnxt_re1": "1"}
    with capture_logs() as logs:
        RailLog()(inv)
    assert [(x["event"], x["pci_affinity"]) for x in logs] == [("rails_assigned", NO_GPU)]


@pytest.mark.parametrize("layout", ["roce", "ib"])
def test_simulated_hgx_node_pairs_each_rail_nic_with_its_gpu(make_fixture, layout: str) -> None:
    # the simulator's node (sim.hw.pci_device_path): rail NIC i and GPU i under one PCIe switch, the
    # frontend NIC in a root-port slot, as on an HGX H100 board
    sys_root = str(make_fixture(layout=layout) / "sys")
    gpus = GpuScan().scan(sys_root)
    assert len(gpus) == 8 and all(len(p) == 4 for p in gpus), gpus  # root port, switch up/down, GPU
    inv = discover(sys_root)
    assert (inv.rail_source, inv.rail_affinity) == ("pci_affinity", PAIRED), inv.rail_affinity_detail
    assert {d.name: d.rail for d in inv.devices} == {**{f"mlx5_{i}": str(i) for i in range(8)}, "mlx5_8": ""}


def test_a_nic_unplugged_keeps_the_others_rails(tmp_path: Path) -> None:
    sys_dir = build_sysfs(load("hgx-h100-ibm-gx3d.topo.xml"), tmp_path / "sys")
    memory: dict[str, str] = {}
    before = _rails(discover(str(sys_dir), rail_memory=memory))
    (sys_dir / "class/infiniband/mlx5_3/device").unlink()
    shutil.rmtree(sys_dir / "class/infiniband/mlx5_3")  # hot-unplug: GPU 4 pairs with nothing now
    inv = discover(str(sys_dir), rail_memory=memory)
    assert inv.rail_affinity == NOT_ONE_TO_ONE and inv.rail_source == "hca_type"
    assert _rails(inv) == {n: r for n, r in before.items() if n != "mlx5_3"}
