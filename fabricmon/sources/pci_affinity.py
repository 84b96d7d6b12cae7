"""Rail k is the NIC under GPU k's PCIe switch: NIC-GPU pairing from the PCIe tree.

A rail-optimized GPU node (HGX/DGX) puts each rail NIC under the same PCIe switch as one GPU, so
GPUDirect RDMA never crosses the CPU; NCCL's rail rings follow that pairing, and so does the rail
label.  The pairing here is the one NCCL and ``nvidia-smi topo -m`` show: a NIC's GPU is the one it
shares the deepest PCIe ancestor with (PIX/PXB), and it counts only when it is one-to-one (every
GPU one NIC of its own, no NIC as near two GPUs).  Anything else (no GPU on the bus, NICs on the
root complex, two NICs under one GPU's switch, one NIC between two GPUs as on an 8-GPU/4-NIC
A100 board) is not a rail pairing: ``pair`` says why and inventory's next rule decides.

``pair`` is pure over PCI paths (the BDFs from the root port down to the function, as the
kernel's ``/sys/devices/pci<domain>:<bus>/...`` path spells them); ``GpuScan`` is the I/O.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .base_io import list_dir, read_text

# a PCI function as sysfs names it (domain:bus:device.function), lower-case hex
BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")

NVIDIA_VENDOR = 0x10DE  # include/linux/pci_ids.h PCI_VENDOR_ID_NVIDIA
DISPLAY_BASE_CLASS = 0x03  # PCI_BASE_CLASS_DISPLAY: 0x0300 VGA, 0x0302 3D controller (H100 SXM)


def is_nvidia_gpu(vendor: str, pci_class: str) -> bool:
    """``vendor`` and ``class`` file contents (hex with 0x) of one PCI function.  NVIDIA's
    NVSwitches (class 0x0680) and Mellanox NICs are other classes."""
    try:
        return int(vendor, 16) == NVIDIA_VENDOR and (int(pci_class, 16) >> 16) == DISPLAY_BASE_CLASS
    except ValueError:
        return False


# the metric label values (fabricmon_rail_assignment_info{pci_affinity}): one word per outcome
PAIRED = "paired"
NO_GPU = "no_gpu"
NO_NIC = "no_nic"
NO_SHARED_SWITCH = "no_shared_switch"
NOT_ONE_TO_ONE = "not_one_to_one"

PciPath = tuple[str, ...]


def pci_path(resolved: str) -> PciPath:
    """The BDFs of a resolved ``/sys/devices/...`` path, from the root port down to the function;
    the host bridge (``pci0000:00``) is not a PCI function and is left out."""
    return tuple(part for part in resolved.split("/") if BDF.fullmatch(part))


def shared_depth(a: PciPath, b: PciPath) -> int:
    """How many PCI ancestors two functions share (0: only the root complex).

    One shared function is the root port, and a root port has a single link: two devices below
    one are below a switch there, so any depth >= 1 is a shared PCIe switch (``PIX``/``PXB``)."""
    depth = 0
    for x, y in zip(a[:-1], b[:-1], strict=False):
        if x != y:
            break
        depth += 1
    return depth


@dataclass(frozen=True)
class Pairing:
    """NIC name -> GPU index when ``reason`` is ``PAIRED``, else empty and ``detail`` says why."""

    reason: str
    detail: str = ""
    rails: Mapping[str, int] = field(default_factory=dict)


def _nearest(depths: dict[str, int]) -> tuple[int, list[str]]:
    best = max(depths.values(), default=0)
    return best, sorted(k for k, d in depths.items() if d == best) if best > 0 else []


def pair(nics: Mapping[str, PciPath], gpus: Sequence[PciPath]) -> Pairing:
    """Pair RDMA NICs with GPUs (``gpus`` in GPU index order) by their deepest shared PCIe ancestor.

    A NIC that shares no switch with any GPU (a frontend or storage NIC in a root-port slot)
    serves no rail when the others pair one-to-one; when no NIC shares one, nothing pairs."""
    if not gpus:
        return Pairing(NO_GPU, "no NVIDIA GPU on the PCI bus")
    nics = {name: path for name, path in nics.items() if path}
    if not nics:
        return Pairing(NO_NIC, "no RDMA NIC with a PCI path")
    keys = [str(k) for k in range(len(gpus))]
    depth = {(n, k): shared_depth(p, gpus[int(k)]) for n, p in nics.items() for k in keys}
    nic_best = {n: _nearest({k: depth[n, k] for k in keys}) for n in nics}
    gpu_best = {k: _nearest({n: depth[n, k] for n in nics}) for k in keys}
    near = sorted(n for n, (d, _) in nic_best.items() if d > 0)
    if not near:
        return Pairing(NO_SHARED_SWITCH, f"none of {len(nics)} NICs shares a PCIe switch with any of "
                                         f"{len(gpus)} GPUs (NICs on the root complex)")
    for n in near:
        if len(nic_best[n][1]) > 1:
            return Pairing(NOT_ONE_TO_ONE, f"{n} is as near GPUs {', '.join(nic_best[n][1])}")
    rails: dict[str, int] = {}
    for k in keys:
        mine = gpu_best[k][1]
        if len(mine) > 1:
            return Pairing(NOT_ONE_TO_ONE, f"GPU {k} is as near NICs {', '.join(mine)}")
        if not mine:
            return Pairing(NOT_ONE_TO_ONE, f"GPU {k} shares a PCIe switch with no NIC")
        if nic_best[mine[0]][1] != [k]:
            return Pairing(NOT_ONE_TO_ONE, f"GPU {k}'s nearest NIC {mine[0]} is nearer GPU "
                                           f"{nic_best[mine[0]][1][0]}")
        rails[mine[0]] = int(k)
    owner = {k: n for n, k in rails.items()}
    for n in near:  # a second NIC under a GPU's switch, less deep than the one that paired
        if n not in rails:
            gpu = int(nic_best[n][1][0])
            return Pairing(NOT_ONE_TO_ONE, f"{n} is under GPU {gpu}'s switch too (with {owner[gpu]})")
    return Pairing(PAIRED, f"{len(rails)} NICs paired with {len(gpus)} GPUs", rails)


# -- I/O -------------------------------------------------------------------------------------------


def _attr(dev_dir: str, name: str) -> str:
    try:
        return read_text(os.path.join(dev_dir, name)).strip().lower()
    except (OSError, ValueError):
        return ""


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:1B:00.0`` as sysfs spells it (``0000:1b:00.0``)."""
    dom, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(dom, 16):04x}:{rest}" if dom and rest else bus_id.lower()


class GpuScan:
    """NVIDIA GPUs on the PCI bus (``bus/pci/devices``), as PCI paths in GPU index order.

    The index is NVML's where its PCI bus ids are given (``nvml_bus_ids``, by NVML index), else
    PCI bus order, which is the order NVML and ``nvidia-smi`` number GPUs in on these nodes.  A
    function is read (class, vendor, path) once while it stays listed: the bus is listed at every
    discovery, and a hot-plugged function is read when it appears."""

    def __init__(self) -> None:
        self._seen: dict[str, PciPath | None] = {}  # BDF -> a GPU's PCI path, None: not a GPU

    def scan(self, sysfs_root: str, nvml_bus_ids: Sequence[str] = ()) -> list[PciPath]:
        base = os.path.join(sysfs_root, "bus", "pci", "devices")
        listed = [b for b in list_dir(base) if BDF.fullmatch(b)]
        for gone in set(self._seen) - set(listed):
            del self._seen[gone]
        for bdf in listed:
            if bdf in self._seen:
                continue
            link = os.path.join(base, bdf)
            cls, vendor = _attr(link, "class"), _attr(link, "vendor")
            if not cls or not vendor:
                continue  # unreadable now (vanishing): read again next time
            path = pci_path(os.path.realpath(link)) if is_nvidia_gpu(vendor, cls) else None
            self._seen[bdf] = path if path is None or (path and path[-1] == bdf) else None
        paths = {bdf: p for bdf, p in self._seen.items() if p is not None}
        order = [normalize_bus_id(b) for b in nvml_bus_ids]
        if order and sorted(order) == sorted(paths):
            return [paths[b] for b in order]
        return [paths[b] for b in sorted(paths)]
