"""Rails when ``hca_type`` is the node description (bnxt_re), over the Broadcom fixture tree.

bnxt_re's ``hca_type`` prints the node description, which rdma-ndd makes unique per device.  The
order (sources/inventory.py ``rail_keys``): the configured map; ``hca_type`` less the device's own
name; the PCI vendor:device id; the netdev name's stem; else every device is a rail NIC.  Before,
the most common ``hca_type`` of unique ones was the first device's, so only the first NIC got a rail.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fabricmon.sources.inventory import RailCandidate, discover, plan_rails, rail_keys
from support.paths import FIXTURES

TREE = FIXTURES / "drivers" / "bnxt-thor2-gen1" / "node"
IB = "sys/class/infiniband"


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    out = tmp_path / "node"
    shutil.copytree(TREE, out, symlinks=True)
    return out


def _hca(node: Path, **by_device: str) -> None:
    for dev, text in by_device.items():
        (node / IB / dev / "hca_type").write_text(text + "\n")


def _add_frontend(node: Path, hca_type: str, pci_id: tuple[str, str] | None, netdev: str = "eno1") -> None:
    """A third RDMA device on another PCI function: the node's frontend NIC (an mlx5 here)."""
    pdir = node / "sys/devices/pci0000:00/0000:c1:00.0"
    (pdir / "net" / netdev).mkdir(parents=True)
    if pci_id is not None:
        (pdir / "vendor").write_text(pci_id[0] + "\n")
        (pdir / "device").write_text(pci_id[1] + "\n")
    ddir = node / IB / "mlx5_0"
    (ddir / "ports/1").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:c1:00.0", ddir / "device")
    (ddir / "hca_type").write_text(hca_type + "\n")
    (ddir / "ports/1/link_layer").write_text("Ethernet\n")


def _rails(node: Path, configured: dict[str, int] | None = None) -> dict[str, str]:
    return {d.name: d.rail for d in discover(str(node / "sys"), rails=configured).devices}


def test_fixture_node_description_as_rdma_ndd_writes_it(node: Path) -> None:
    assert (node / IB / "bnxt_re1/hca_type").read_text().strip() == "gpu-b07-02 bnxt_re1"
    assert _rails(node) == {"bnxt_re0": "0", "bnxt_re1": "1"}


def test_device_name_anywhere_in_the_description(node: Path) -> None:
    _hca(node, bnxt_re0="bnxt_re0@gpu-b07-02", bnxt_re1="bnxt_re1@gpu-b07-02")  # a site's "%d@%h"
    assert _rails(node) == {"bnxt_re0": "0", "bnxt_re1": "1"}


def test_description_that_hides_the_model_falls_back_to_the_pci_id(node: Path) -> None:
    # unique per device and without the device name: hca_type tells nothing; both Thor2 functions
    # are 14e4:1760 (the fixture's vendor/device files), the frontend mlx5 15b3:101d serves no rail
    _hca(node, bnxt_re0="gpu-b07-02 port A", bnxt_re1="gpu-b07-02 port B")
    _add_frontend(node, "gpu-b07-02 frontend", ("0x15b3", "0x101d"))
    inv = discover(str(node / "sys"))
    cands = [RailCandidate(d.name, d.hca_type, d.pci_id, min(d.netdevs, default="")) for d in inv.devices]
    assert rail_keys(cands) == ("pci_id", ["0x14e4:0x1760", "0x14e4:0x1760", "0x15b3:0x101d"])
    assert _rails(node) == {"bnxt_re0": "0", "bnxt_re1": "1", "mlx5_0": ""}


def test_without_pci_ids_the_netdev_name_tells(node: Path) -> None:
    # a container that shows no PCI attributes: the slot NICs' ens<N>f0np0 against the onboard eno1
    _hca(node, bnxt_re0="gpu-b07-02 port A", bnxt_re1="gpu-b07-02 port B")
    for pci in ("0000:41:00.0", "0000:42:00.0"):
        for attr in ("vendor", "device"):
            (node / "sys/devices/pci0000:00" / pci / attr).unlink()
    _add_frontend(node, "gpu-b07-02 frontend", None)
    assert _rails(node) == {"bnxt_re0": "0", "bnxt_re1": "1", "mlx5_0": ""}


def test_configured_map_wins(node: Path) -> None:
    assert _rails(node, {"bnxt_re0": 5, "bnxt_re1": 6}) == {"bnxt_re0": "5", "bnxt_re1": "6"}


def test_nothing_shared_every_device_is_a_rail_nic() -> None:
    devices = [RailCandidate("bnxt_re0", "a"), RailCandidate("bnxt_re1", "b"), RailCandidate("bnxt_re2", "c")]
    assert rail_keys(devices)[0] == "none"
    assert plan_rails(devices, {}).rails == {"bnxt_re0": "0", "bnxt_re1": "1", "bnxt_re2": "2"}


def test_mlx5_models_unchanged() -> None:
    devices = [RailCandidate(f"mlx5_{i}", "MT4129", "0x15b3:0x1021") for i in range(8)]
    devices.append(RailCandidate("mlx5_8", "MT4125", "0x15b3:0x101d"))
    assert rail_keys(devices)[0] == "hca_type"
    rails = plan_rails(devices, {}).rails
    assert [rails[f"mlx5_{i}"] for i in range(8)] == [str(i) for i in range(8)] and rails["mlx5_8"] == ""
