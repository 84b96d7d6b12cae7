"""The "pci" source: how many NVIDIA GPUs the PCI bus shows, whether NVML answers or not.

A GPU node whose NVML is missing (no driver in the container, library not mounted) would
otherwise look exactly like a node without GPUs: NVML absent is final and quiet by design.
This count lets a rule say so (``FabricmonGPUsUnmonitored``: PCI shows GPUs, NVML reports
fewer).  Format (Linux Documentation/ABI/testing/sysfs-bus-pci): ``/sys/bus/pci/devices/<BDF>``
links to the function's directory, whose ``vendor`` reads ``0x10de`` and ``class`` reads a
24-bit class code such as ``0x030200``; NVIDIA is PCI_VENDOR_ID_NVIDIA 0x10de and GPUs are
base class 0x03 (PCI_BASE_CLASS_DISPLAY: 0x0300 VGA, 0x0302 3D controller as on H100 SXM),
both from include/linux/pci_ids.h.  NVIDIA's NVSwitches and Mellanox NICs are other classes.
"""

from __future__ import annotations

import os

from ..model import SourceResult, reading
from .base_io import list_dir, read_text
from .inventory import Inventory
from .pci_affinity import is_nvidia_gpu  # one definition of "a GPU", shared with the rail pairing
from .registry import SourceContext, SourceSpec


class PciGpuSource:
    """Counts NVIDIA GPUs under ``<sysfs>/bus/pci/devices``.  The listing is cheap; the two
    small reads per function run again only when the listing changes (hot-plug), not every poll."""

    name = "pci"

    def __init__(self, sysfs_root: str, timeout: float = 0.5) -> None:
        self.base = os.path.join(sysfs_root, "bus", "pci", "devices")
        self.timeout = timeout
        self._listing: tuple[str, ...] | None = None
        self._count = 0
        self._unreadable = 0

    def poll(self, inventory: Inventory) -> SourceResult:
        res = SourceResult(self.name)
        listing = tuple(list_dir(self.base))
        if listing != self._listing:
            count = unreadable = 0
            for bdf in listing:
                try:
                    vendor = read_text(os.path.join(self.base, bdf, "vendor"))
                    pci_class = read_text(os.path.join(self.base, bdf, "class"))
                except OSError:
                    unreadable += 1  # a function going away mid-scan: counted, the others still count
                    continue
                count += is_nvidia_gpu(vendor, pci_class)
            self._listing, self._count, self._unreadable = listing, count, unreadable
        if self._unreadable:
            res.error(f"pci: {self._unreadable} function(s) under {self.base} unreadable")
        res.readings.append(reading("fabricmon_pci_nvidia_gpus", float(self._count)))
        return res

    def close(self) -> None:
        pass


def _build(config: None, context: SourceContext) -> PciGpuSource:
    # Always: GPUs on the PCI bus that NVML does not report (absent, or nvml: off) say so in a metric.
    return PciGpuSource(context.sysfs_root)


SOURCE: SourceSpec[None] = SourceSpec("pci", None, _build)
