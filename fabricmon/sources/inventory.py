"""Which RDMA devices, ports and netdevs this node has, and which rail each serves.

Discovery is cheap (directory listings and symlink reads, no counter reads), so
it runs at every poll: a hot-unplugged NIC drops out and a re-probed one comes
back without a restart.  Devices are filtered by name *before* anything under
them is read, because on mlx5 some reads cost firmware commands.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from .base_io import list_dir, read_text
from .bounds import valid_ifname, valid_label_text
from .pci_affinity import NO_GPU, PAIRED, GpuScan, Pairing, PciPath, pair, pci_path

log = structlog.get_logger("fabricmon.inventory")


@dataclass(frozen=True, slots=True)
class PortInfo:
    device: str  # mlx5_3
    port: str  # "1"
    path: str  # .../class/infiniband/mlx5_3/ports/1
    link_layer: str  # InfiniBand | Ethernet | "" when unreadable
    netdev: str  # backing netdev ("" when none, e.g. plain IB without IPoIB)
    rail: str  # "3", or "" for a NIC that serves no rail (frontend)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    name: str
    path: str  # .../class/infiniband/mlx5_3
    pci_bdf: str  # 0000:5e:00.0, "" when the device link is missing
    numa_node: int  # -1 when unknown
    hca_type: str
    fw_ver: str
    node_guid: str
    board_id: str
    rail: str
    netdevs: tuple[str, ...]
    pci_id: str = ""  # "<vendor>:<device>" of the PCI function ("0x14e4:0x1760"), "" unreadable
    pci_path: PciPath = ()  # the BDFs from the root port down to the function, () unreadable


@dataclass(frozen=True)
class Inventory:
    sysfs_root: str
    devices: tuple[DeviceInfo, ...] = ()
    ports: tuple[PortInfo, ...] = ()
    errors: tuple[str, ...] = ()  # discovery problems (unreadable device attributes)
    extra_netdevs: tuple[str, ...] = field(default=())  # configured netdevs without an RDMA port
    expected_ports: int = 0  # the config expects at least this many RDMA ports (0: no expectation)
    rail_source: str = ""  # the rule that gave the rails (RailPlan.source); "" no discovery ran
    rail_affinity: str = ""  # the PCI pairing's outcome (pci_affinity.PAIRED or why not)
    rail_affinity_detail: str = ""  # ... in words, for the log

    def discovered_counts(self) -> dict[str, int]:
        """``fabricmon_devices_discovered{kind}``: what discovery found, by kind.

        An empty or wrong ``--sysfs-root`` shows as zeros here instead of as
        silently missing series.
        """
        return {
            "rdma_device": len(self.devices),
            "ib_port": sum(1 for p in self.ports if p.link_layer == "InfiniBand"),
            "roce_port": sum(1 for p in self.ports if p.link_layer == "Ethernet"),
            "roce_netdev": len({p.netdev for p in self.ports if p.link_layer == "Ethernet" and p.netdev}),
        }

    @property
    def expected_but_missing(self) -> str:
        """Why the RDMA ports the config expects are not there; "" when they are (or none are expected).

        For readiness and logs: a wrong ``--sysfs-root`` otherwise looks
        exactly like a healthy node without RDMA hardware.
        """
        if self.expected_ports <= 0 or len(self.ports) >= self.expected_ports:
            return ""
        base = os.path.join(self.sysfs_root, "class", "infiniband")
        if not os.path.isdir(base):
            where = f"{base} does not exist (is the sysfs root right?)"
        elif not self.devices:
            where = f"no RDMA device under {base}"
        else:
            where = f"{len(self.devices)} RDMA device(s) under {base}"
        return f"expected at least {self.expected_ports} RDMA port(s), found {len(self.ports)}: {where}"

    def netdevs(self) -> list[str]:
        """Every netdev to read ethtool stats from: those backing RDMA ports, then configured extras."""
        seen: dict[str, None] = {}
        for p in self.ports:
            if p.netdev:
                seen[p.netdev] = None
        for n in self.extra_netdevs:
            seen[n] = None
        return list(seen)

    def device(self, name: str) -> DeviceInfo | None:
        for d in self.devices:
            if d.name == name:
                return d
        return None


def _natural_key(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _read_or(path: str, default: str = "") -> str:
    try:
        return read_text(path)
    except (OSError, ValueError):
        return default


def _read_label(path: str, errors: list[str]) -> str:
    """A device attribute that becomes a label value; "" (and a discovery error) when it is not short text."""
    text = _read_or(path)
    if text and not valid_label_text(text):
        errors.append(f"{path}: rejected (too_long): not a short printable attribute ({len(text)} characters)")
        return ""
    return text


def _numa(text: str) -> int:
    # -1 (no NUMA) up to a generous node count; anything else is unknown.
    if text.lstrip("-").isdigit() and len(text) <= 5 and -1 <= int(text) <= 4095:
        return int(text)
    return -1


def hca_model(device: str, hca_type: str) -> str:
    """``hca_type`` as a model key: a node description holding the device's own name loses it.

    bnxt_re's ``hca_type`` is the node description, which rdma-ndd makes unique per device (its
    default "%h %d": "gpu-b07-02 bnxt_re0"; a site may write "%d %h" or "%h-%d").  Without the
    device's own name it is the same for every NIC of the node."""
    if device and device in hca_type:
        return " ".join(hca_type.replace(device, " ").split()).strip(" -_.:")
    return hca_type


_PCI_ID = re.compile(r"0x[0-9a-f]{4}")


def netdev_stem(netdev: str) -> str:
    """A netdev name without its numbers: systemd's predictable names say where the NIC sits
    (``ens41f0np0`` and ``ens42f0np0`` in PCIe slots: ``ensfnp``; an onboard ``eno1``: ``eno``)."""
    return re.sub(r"[0-9]+", "", netdev)


@dataclass(frozen=True, slots=True)
class RailCandidate:
    """What discovery knows of one RDMA device that can tell a rail NIC from another."""

    name: str
    hca_type: str
    pci_id: str = ""  # "<vendor>:<device>" of the PCI function, "" unreadable
    netdev: str = ""
    pci_path: PciPath = ()  # root port .. function, for the pairing with GPUs (pci_affinity.py)


def _shared(keys: list[str]) -> bool:
    """The keys tell a model: some model is shared by two devices (or there is one device)."""
    counts = Counter(k for k in keys if k)
    return bool(counts) and (len(keys) == 1 or counts.most_common(1)[0][1] >= 2)


def rail_keys(devices: list[RailCandidate]) -> tuple[str, list[str]]:
    """Which attribute tells the rail NICs apart, and its value per device, in this order:

    1. ``hca_type`` (less the device's own name): a model (``MT4129``) or a node description in a
       fixed format, the same for every NIC of one model;
    2. the PCI function's vendor:device id, when ``hca_type`` is a node description unique per device
       in a format that hides the model ("gpu-b07-02 port-a");
    3. the netdev name's stem (no PCI ids: a container without the device's PCI attributes);
    4. none of them shared: every device is a rail NIC (nothing tells a frontend NIC apart).
    """
    for source, keys in (("hca_type", [hca_model(d.name, d.hca_type) for d in devices]),
                         ("pci_id", [d.pci_id for d in devices]),
                         ("netdev", [netdev_stem(d.netdev) for d in devices])):
        if _shared(keys):
            return source, keys
    return "none", ["" for _ in devices]


@dataclass(frozen=True)
class RailPlan:
    rails: dict[str, str]  # device name -> rail, "" for a device that serves none
    source: str  # configured | pci_affinity | hca_type | pci_id | netdev | none
    affinity: Pairing  # the PCI pairing, whether or not it gave the rails


def plan_rails(
    devices: Sequence[RailCandidate], configured: dict[str, int],
    memory: dict[str, str] | None = None, gpus: Sequence[PciPath] = (),
) -> RailPlan:
    """Map device name -> rail string, by the first rule that applies:

    1. the configured map (``rails:``);
    2. PCI affinity: rail k is the NIC under GPU k's PCIe switch, when every GPU (``gpus``, in GPU
       index order) pairs one-to-one with a NIC (pci_affinity.pair); a NIC under no GPU's switch
       (frontend, storage) serves no rail;
    3. the rail NICs are the devices of the most common model (a DGX-style node has eight
       identical rail NICs and a different frontend NIC), numbered in device order; any other
       device serves no rail.  The model comes from the first of ``rail_keys``' sources that
       tells one (``hca_type``, PCI id, netdev name).

    ``devices`` in natural order.  ``memory`` (kept by the caller across polls) makes the rails
    sticky: when mlx5_3 is hot-unplugged (its GPU then pairs with nothing, and rule 3 decides),
    mlx5_4..7 keep rails 4..7 instead of being renumbered, and a re-probed device gets its old
    rail back.
    """
    cands = list(devices)
    pairing = pair({d.name: d.pci_path for d in cands}, gpus)
    memory = {} if memory is None else memory
    if configured:
        return RailPlan({d.name: str(configured[d.name]) if d.name in configured else "" for d in cands},
                        "configured", pairing)
    if pairing.reason == PAIRED:
        rails = {d.name: str(pairing.rails[d.name]) if d.name in pairing.rails else "" for d in cands}
        used = {r for r in rails.values() if r}
        for name in [n for n, r in memory.items() if n not in rails and r in used]:
            del memory[name]  # an absent device's old rail is a paired NIC's now
        memory.update(rails)
        return RailPlan(rails, "pci_affinity", pairing)
    source, keys = rail_keys(cands)
    counts = Counter(k for k in keys if k)
    common = counts.most_common(1)[0][0] if counts else None
    taken = {r for r in memory.values() if r}
    rails = {}
    for d, key in zip(cands, keys, strict=True):
        name = d.name
        if name in memory:
            rails[name] = memory[name]
        elif common is not None and key != common:
            rails[name] = memory[name] = ""
        else:
            free = next(i for i in range(len(taken) + 1) if str(i) not in taken)
            rails[name] = memory[name] = str(free)
            taken.add(str(free))
    return RailPlan(rails, source, pairing)


class RailLog:
    """One log line per change of the rail rule or the PCI pairing's outcome (discovery runs every
    poll): which rule gave the rails, and where PCI affinity did not, why."""

    def __init__(self) -> None:
        self._last: tuple[str, str, str] | None = None

    def __call__(self, inv: Inventory) -> None:
        key = (inv.rail_source, inv.rail_affinity, inv.rail_affinity_detail)
        if not inv.rail_source or key == self._last:
            return
        self._last = key
        rails = {d.name: d.rail for d in inv.devices if d.rail}
        if inv.rail_affinity == PAIRED or inv.rail_affinity == NO_GPU or inv.rail_source == "configured":
            log.info("rails_assigned", source=inv.rail_source, pci_affinity=inv.rail_affinity,
                     detail=inv.rail_affinity_detail, rails=rails)
        else:  # a GPU node whose rail NICs do not pair with its GPUs: the next rule numbers them
            log.warning("rails_not_from_pci_affinity", reason=inv.rail_affinity, detail=inv.rail_affinity_detail,
                        source=inv.rail_source, rails=rails)


def discover(
    sysfs_root: str,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    rails: dict[str, int] | None = None,
    extra_netdevs: tuple[str, ...] = (),
    rail_memory: dict[str, str] | None = None,
    cache: dict | None = None,
    expected_ports: int = 0,
    gpu_scan: GpuScan | None = None,
) -> Inventory:
    """Discover RDMA devices.  ``cache`` (kept by the caller across polls) skips
    re-reading a device whose sysfs entry is the same one as last time (same
    inode and ctime: a re-probed device gets a new entry and is read afresh)."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    inc = [re.compile(p) for p in include]
    exc = [re.compile(p) for p in exclude]
    names = [
        n for n in sorted(list_dir(base), key=_natural_key)
        if (not inc or any(p.search(n) for p in inc)) and not any(p.search(n) for p in exc)
    ]
    errors: list[str] = []
    raw: list[tuple[str, str, RailCandidate]] = []  # name, path, what tells its rail
    identity: dict[str, tuple[int, int]] = {}
    for name in names:
        dpath = os.path.join(base, name)
        if cache is not None:
            try:
                st = os.lstat(dpath)
                identity[name] = (st.st_ino, st.st_ctime_ns)
            except OSError:
                continue  # vanished between listing and now
            hit = cache.get(name)
            if hit is not None and hit[0] == identity[name]:
                info = hit[1]
                cand = RailCandidate(name, info.hca_type, info.pci_id, min(info.netdevs, default=""), info.pci_path)
                raw.append((name, dpath, cand))
                continue
        dev_dir = os.path.join(dpath, "device")
        vendor, product = _read_or(os.path.join(dev_dir, "vendor")), _read_or(os.path.join(dev_dir, "device"))
        pci_id = f"{vendor}:{product}" if _PCI_ID.fullmatch(vendor) and _PCI_ID.fullmatch(product) else ""
        own = [n for n in list_dir(os.path.join(dev_dir, "net")) if valid_ifname(n)]
        # class/infiniband/<dev>/device links to the PCI function; resolving one
        # link is safe (walking the tree is what loops).
        real = os.path.realpath(dev_dir)
        raw.append((name, dpath, RailCandidate(name, _read_label(os.path.join(dpath, "hca_type"), errors), pci_id,
                                               min(own, default=""), pci_path(real) if os.path.isdir(real) else ())))
    gpus = (gpu_scan or GpuScan()).scan(sysfs_root) if raw else []
    plan = plan_rails([c for _, _, c in raw], rails or {}, rail_memory, gpus)
    rail_of = plan.rails

    devices: list[DeviceInfo] = []
    ports: list[PortInfo] = []
    for name, dpath, cand in raw:
        hit = cache.get(name) if cache is not None else None
        if hit is not None and hit[0] == identity.get(name) and hit[1].rail == rail_of.get(name, ""):
            devices.append(hit[1])
            ports.extend(hit[2])
            continue
        if not os.path.isdir(dpath):
            continue  # vanished between listing and now
        first_port = len(ports)
        real = os.path.realpath(os.path.join(dpath, "device"))
        pci_bdf = os.path.basename(real) if os.path.isdir(real) else ""
        dev_dir = os.path.join(dpath, "device")
        numa_text = _read_or(os.path.join(dev_dir, "numa_node"), "-1")
        numa = _numa(numa_text)
        netdevs = tuple(n for n in list_dir(os.path.join(dev_dir, "net")) if valid_ifname(n))
        info = DeviceInfo(
            name=name, path=dpath, pci_bdf=pci_bdf, numa_node=numa, hca_type=cand.hca_type, pci_id=cand.pci_id,
            pci_path=cand.pci_path,
            fw_ver=_read_label(os.path.join(dpath, "fw_ver"), errors),
            node_guid=_read_label(os.path.join(dpath, "node_guid"), errors),
            board_id=_read_label(os.path.join(dpath, "board_id"), errors),
            rail=rail_of.get(name, ""), netdevs=netdevs,
        )
        devices.append(info)
        for port in sorted(list_dir(os.path.join(dpath, "ports")), key=_natural_key):
            ppath = os.path.join(dpath, "ports", port)
            link_layer = _read_or(os.path.join(ppath, "link_layer"))
            netdev = ""
            if link_layer == "Ethernet":
                # RoCE: the GID table names the netdev; fall back to the PCI function's netdev.
                netdev = _read_or(os.path.join(ppath, "gid_attrs", "ndevs", "0"))
                if netdev and not valid_ifname(netdev):
                    # It names a file under --ethtool-dir: "../x" must not reach open().
                    errors.append(f"{ppath}/gid_attrs/ndevs/0: rejected (malformed): not a netdev name {netdev[:40]!r}")
                    netdev = ""
                if not netdev and len(netdevs) == 1:
                    netdev = netdevs[0]
            ports.append(PortInfo(name, port, ppath, link_layer, netdev, info.rail))
        if cache is not None and name in identity:
            cache[name] = (identity[name], info, tuple(ports[first_port:]))
    if cache is not None:
        for gone in set(cache) - set(identity):
            del cache[gone]
    if not raw:  # no RDMA device: no rail rule to report
        return Inventory(sysfs_root, (), (), tuple(errors), tuple(extra_netdevs), expected_ports)
    return Inventory(sysfs_root, tuple(devices), tuple(ports), tuple(errors), tuple(extra_netdevs), expected_ports,
                     plan.source, plan.affinity.reason, plan.affinity.detail)
