"""A sysfs PCI tree (``devices/``, ``bus/pci/devices``, ``class/infiniband``) from an NCCL topology dump.

NCCL's topology XML (``NCCL_TOPO_DUMP_FILE``) is the PCIe tree NCCL read from sysfs, with each
function's busid, class, vendor and device, and the RDMA device name of each NIC.  It folds each
PCIe switch into one ``<pci>`` node (its upstream port's busid, the downstream ports dropped) and
leaves out the root ports: this builder puts them back the way the kernel numbers them (a root
port ``<bus-1>:01.0`` under host bridge ``pci<domain>:<bus-1>``; a switch's downstream port i at
``<secondary bus>:<i>.0``, the secondary bus being the upstream port's bus + 1), so a realpath
through ``bus/pci/devices/<bdf>`` or ``class/infiniband/<dev>/device`` looks like a host's.
Nothing else is invented: ``hca_type`` is what mlx5 prints (``MT`` and the PCI device id in
decimal: mlx5 ``hca_type_show``), ``node_guid`` is the dump's NIC guid.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from support.paths import FIXTURES

PCI_AFFINITY = FIXTURES / "pci_affinity"
ATTRS = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device")


def load(name: str) -> ET.Element:
    return ET.parse(PCI_AFFINITY / name).getroot()


def _bus(bdf: str) -> tuple[str, int]:
    dom, bus, _ = bdf.split(":")
    return dom, int(bus, 16)


def _is_switch(elem: ET.Element) -> bool:
    return elem.get("class", "").startswith("0x0604")


def _link(at: Path, target: str) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, at)


class _Builder:
    def __init__(self, sys_dir: Path) -> None:
        self.sys = sys_dir
        self.seen: set[str] = set()

    def function(self, rel: Path, attrs: dict[str, str], numa: str) -> Path:
        bdf = rel.name
        if bdf in self.seen:
            raise ValueError(f"{bdf}: two functions at one BDF (a synthesized port collides with the dump)")
        self.seen.add(bdf)
        d = self.sys / "devices" / rel
        d.mkdir(parents=True)
        for key in ATTRS:
            if key in attrs:
                (d / key).write_text(attrs[key] + "\n")
        (d / "numa_node").write_text(numa + "\n")
        _link(self.sys / "bus/pci/devices" / bdf, f"../../../devices/{rel}")
        return d

    def place(self, elem: ET.Element, parent: Path, numa: str) -> None:
        rel = parent / elem.get("busid", "").lower()
        self.function(rel, dict(elem.attrib), numa)
        kids = elem.findall("pci")
        if _is_switch(elem) and kids:
            dom, bus = _bus(rel.name)
            for i, kid in enumerate(kids):
                port = {"class": "0x060400", "vendor": elem.get("vendor", ""), "device": elem.get("device", "")}
                down = rel / f"{dom}:{bus + 1:02x}:{i:02x}.0"
                self.function(down, port, numa)
                self.place(kid, down, numa)
        for net in elem.findall("nic/net"):
            name = net.get("name", "")
            ib = self.sys / "class/infiniband" / name
            _link(ib / "device", f"../../../devices/{rel}")
            (ib / "hca_type").write_text(f"MT{int(elem.get('device', '0x0'), 16)}\n")
            guid = int(net.get("guid", "0x0"), 16)
            (ib / "node_guid").write_text(":".join(f"{guid:016x}"[i:i + 4] for i in range(0, 16, 4)) + "\n")
            (ib / "ports/1").mkdir(parents=True)
            (ib / "ports/1/link_layer").write_text("Ethernet\n")


def build_sysfs(root: ET.Element, sys_dir: Path) -> Path:
    """Write the dump's tree under ``sys_dir`` (a ``--sysfs-root``); returns ``sys_dir``."""
    b = _Builder(sys_dir)
    for cpu in root.findall("cpu"):
        numa = cpu.get("numaid", "-1")
        for top in cpu.findall("pci"):
            dom, bus = _bus(top.get("busid", "").lower())
            hb = Path(f"pci{dom}:{bus - 1:02x}")
            rp = hb / f"{dom}:{bus - 1:02x}:01.0"
            b.function(rp, {"class": "0x060400"}, numa)  # a root port; the dump names no ids for it
            b.place(top, rp, numa)
    return sys_dir


def switch_pairs(root: ET.Element) -> dict[str, int]:
    """The dump's own answer, read from its nesting: NIC name -> NCCL's ``gpu dev`` for each switch
    node that holds exactly one NIC and one GPU as direct children (the rail pairing)."""
    out: dict[str, int] = {}
    for sw in root.iter("pci"):
        kids = sw.findall("pci")
        nets = [n.get("name", "") for k in kids for n in k.findall("nic/net")]
        gpus = [int(g.get("dev", "-1")) for k in kids for g in k.findall("gpu")]
        if _is_switch(sw) and len(nets) == 1 and len(gpus) == 1:
            out[nets[0]] = gpus[0]
    return out
