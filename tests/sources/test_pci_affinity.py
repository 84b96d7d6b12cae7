"""Rail NIC <-> GPU pairing by the deepest shared PCIe switch (sources/pci_affinity.py), over sysfs
trees built from real NCCL topology dumps (tests/fixtures/pci_affinity/README.md)."""

from __future__ import annotations

import copy
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from fabricmon.sources.pci_affinity import (
    NO_GPU,
    NO_SHARED_SWITCH,
    NOT_ONE_TO_ONE,
    PAIRED,
    GpuScan,
    Pairing,
    pair,
    pci_path,
    shared_depth,
)
from support.paths import FIXTURES
from support.pcitree import build_sysfs, load, switch_pairs

H100 = "hgx-h100-ibm-gx3d.topo.xml"
A100 = "a100-8gpu-4cx6-simai.topo.xml"


def _pairing(sys_dir: Path) -> Pairing:
    ib = sys_dir / "class" / "infiniband"
    nics = {n: pci_path(os.path.realpath(ib / n / "device")) for n in sorted(os.listdir(ib))}
    return pair(nics, GpuScan().scan(str(sys_dir)))


def _with(root: ET.Element, tmp: Path) -> Path:
    return build_sysfs(root, tmp / "sys")


def _bridges(root: ET.Element) -> list[ET.Element]:
    return [e for cpu in root.findall("cpu") for e in cpu.findall("pci")]


def test_hgx_h100_rail_k_is_gpu_k_nic(tmp_path: Path) -> None:
    root = load(H100)
    got = _pairing(_with(root, tmp_path))
    assert got.reason == PAIRED
    # the dump's own nesting says which NIC shares each GPU's bridge, and NCCL's index of that GPU
    assert dict(got.rails) == switch_pairs(root) and len(got.rails) == 8
    # on this node the device order runs against the GPU order: mlx5_0 is GPU 7's NIC
    assert got.rails["mlx5_7"] == 0 and got.rails["mlx5_0"] == 7


def test_the_built_tree_resolves_like_a_host(tmp_path: Path) -> None:
    sys_dir = _with(load(H100), tmp_path)
    nic = os.path.realpath(sys_dir / "class/infiniband/mlx5_7/device")
    gpu = os.path.realpath(sys_dir / "bus/pci/devices/0000:a4:00.0")
    assert pci_path(nic) == ("0000:a0:01.0", "0000:a1:00.0", "0000:a2:00.0", "0000:a3:00.0")
    assert shared_depth(pci_path(nic), pci_path(gpu)) == 2  # root port and the bridge: PXB
    assert (sys_dir / "bus/pci/devices/0000:a4:00.0/class").read_text() == "0x030200\n"


def test_a100_four_nics_for_eight_gpus_does_not_pair(tmp_path: Path) -> None:
    got = _pairing(_with(load(A100), tmp_path))
    assert got.reason == NOT_ONE_TO_ONE and not got.rails
    assert got.detail == "GPU 0's nearest NIC mlx5_bond_1 is nearer GPU 1"


def test_two_nics_under_one_gpus_switch(tmp_path: Path) -> None:
    root = copy.deepcopy(load(H100))
    first, second = _bridges(root)[:2]
    nic = next(k for k in second.findall("pci") if k.find("nic") is not None)  # mlx5_6, GPU 1's
    second.remove(nic)
    first.append(nic)
    got = _pairing(_with(root, tmp_path))
    assert got.reason == NOT_ONE_TO_ONE and not got.rails
    assert got.detail == "GPU 0 is as near NICs mlx5_6, mlx5_7"


def test_nics_on_the_root_complex(tmp_path: Path) -> None:
    root = copy.deepcopy(load(H100))
    for cpu in root.findall("cpu"):
        for bridge in cpu.findall("pci"):
            nic = next(k for k in bridge.findall("pci") if k.find("nic") is not None)
            bridge.remove(nic)
            cpu.append(nic)  # a root-port slot of its own
    got = _pairing(_with(root, tmp_path))
    assert got.reason == NO_SHARED_SWITCH and not got.rails
    assert "none of 8 NICs shares a PCIe switch with any of 8 GPUs" in got.detail


def test_a_frontend_nic_on_a_root_port_serves_no_rail(tmp_path: Path) -> None:
    root = copy.deepcopy(load(H100))
    frontend = ET.fromstring(
        '<pci busid="0000:10:00.0" class="0x020000" vendor="0x15b3" device="0x1021">'
        '<nic><net name="mlx5_8" guid="0x1"/></nic></pci>')
    root.findall("cpu")[0].append(frontend)
    got = _pairing(_with(root, tmp_path))
    assert got.reason == PAIRED and "mlx5_8" not in got.rails and len(got.rails) == 8


def test_no_gpu_on_the_bus() -> None:
    # the Broadcom fixture node: two Thor2 functions, no GPU
    sys_dir = FIXTURES / "drivers" / "bnxt-thor2-gen1" / "node" / "sys"
    assert GpuScan().scan(str(sys_dir)) == []
    assert _pairing(sys_dir).reason == NO_GPU


def test_gpu_index_is_nvmls_when_given(tmp_path: Path) -> None:
    sys_dir = _with(load(H100), tmp_path)
    scan = GpuScan()
    by_bus = [p[-1] for p in scan.scan(str(sys_dir))]
    assert by_bus == sorted(by_bus) and by_bus[0] == "0000:a4:00.0"
    nvml = [f"0000{b[:4]}:{b[5:].upper()}" for b in reversed(by_bus)]  # NVML spells "00000000:EA:00.0"
    assert [p[-1] for p in scan.scan(str(sys_dir), nvml)] == list(reversed(by_bus))
    # NVML seeing another set of GPUs than the bus: its order is not used
    assert [p[-1] for p in scan.scan(str(sys_dir), nvml[:3])] == by_bus


def test_an_nvswitch_is_not_a_gpu(tmp_path: Path) -> None:
    root = copy.deepcopy(load(H100))
    # NVSwitches are NVIDIA functions of class 0x0680 ("bridge, other"): NCCL's nvlink tclass
    root.findall("cpu")[1].append(ET.fromstring('<pci busid="0000:f3:00.0" class="0x068000" vendor="0x10de"/>'))
    sys_dir = _with(root, tmp_path)
    assert "0000:f3:00.0" not in [p[-1] for p in GpuScan().scan(str(sys_dir))]
    assert _pairing(sys_dir).reason == PAIRED


def test_a_gpu_without_a_nic_under_its_switch(tmp_path: Path) -> None:
    root = copy.deepcopy(load(H100))
    cpu = root.findall("cpu")[0]
    second = _bridges(root)[1]
    nic = next(k for k in second.findall("pci") if k.find("nic") is not None)  # mlx5_6 to a root port
    second.remove(nic)
    cpu.append(nic)
    got = _pairing(_with(root, tmp_path))
    assert got.reason == NOT_ONE_TO_ONE and not got.rails
    assert got.detail == "GPU 1 shares a PCIe switch with no NIC"
