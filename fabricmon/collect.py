"""``fabricmon collect``: capture what the agent reads on a node into one archive, for a bug report.

The archive holds one node tree in the layout of the fixture trees (``node/hostname``, ``node/sys/...``,
``node/ethtool/<if>.txt`` and ``<if>.pfc.txt``, ``node/nvml.json`` in the fake-NVML format, and
``node/capture.json`` saying how it was taken), so ``fabricmon agent --once --capture node.tar.gz`` (or
the extracted tree with ``--sysfs-root``, ``--ethtool-dir``, ``--nvml fake:``) exports what the node
exported.

What is taken from sysfs: every ``class/infiniband/<dev>`` entry, that device's directory (ports,
counters, hw_counters, state, rate, GIDs), the identity and PCIe attributes of its PCI function, that
function's netdevs (``net/<if>``: state, MTU, statistics, ECN) and their ``class/net/<if>`` entries.
Symbolic links are recorded as links, never followed, so the loops of real sysfs cost nothing; a link
whose target would leave ``sys/`` is left out.  Every count is bounded (files, bytes per file, bytes in
all), and the archive appears under its name only when complete.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import stat
import tarfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from . import __version__
from .atomic import atomic_output
from .configload import ConfigError

log = structlog.get_logger("fabricmon.collect")

PREFIX = "node"
# Attributes of the PCI function worth having (identity, NUMA, PCIe link); the rest of a PCI function
# directory (config space, BARs, ROM, MSI, power) is large, binary, or has side effects when read.
PCI_ATTRS = ("numa_node", "vendor", "device", "subsystem_vendor", "subsystem_device", "class", "revision",
             "current_link_speed", "current_link_width", "max_link_speed", "max_link_width", "local_cpulist")
# Directories under a device or netdev that the agent never reads and that can be large.
SKIP_DIRS = frozenset({"power", "queues", "msi_irqs", "mlx5_core.sf", "mlx5_core.eth", "mlx5_core.rdma"})


@dataclass(frozen=True)
class Limits:
    max_files: int = 50_000
    max_file_bytes: int = 1 << 20     # an ethtool -S dump of a few thousand stats is ~100 KiB
    max_total_bytes: int = 64 << 20

    def validate(self) -> None:
        for name in ("max_files", "max_file_bytes", "max_total_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"collect: {name}: must be positive, got {getattr(self, name)}")


class CaptureTooLarge(Exception):
    pass


@dataclass
class _Archive:
    """Members built in memory, written to the archive at the end (so a failed capture leaves nothing)."""

    limits: Limits
    members: dict[str, tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=dict)
    total: int = 0
    skipped: list[dict] = field(default_factory=list)
    skipped_count: int = 0
    mtime: int = field(default_factory=lambda: int(time.time()))

    def _check(self, size: int) -> None:
        if len(self.members) >= self.limits.max_files:
            raise CaptureTooLarge(f"more than {self.limits.max_files} files (raise --max-files)")
        if self.total + size > self.limits.max_total_bytes:
            raise CaptureTooLarge(f"more than {self.limits.max_total_bytes} bytes (raise --max-total-bytes)")

    def _dirs(self, rel: str) -> None:
        parent = posixpath.dirname(rel)
        while parent and parent not in self.members:
            self._check(0)
            info = tarfile.TarInfo(parent)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, self.mtime
            self.members[parent] = (info, None)
            parent = posixpath.dirname(parent)

    def add_dir(self, rel: str) -> None:
        self._dirs(rel + "/x")

    def add_file(self, rel: str, data: bytes) -> None:
        if rel in self.members:
            return
        self._dirs(rel)
        self._check(len(data))
        info = tarfile.TarInfo(rel)
        info.size, info.mode, info.mtime = len(data), 0o644, self.mtime
        self.members[rel] = (info, data)
        self.total += len(data)

    def add_link(self, rel: str, target: str) -> None:
        if rel in self.members:
            return
        self._dirs(rel)
        self._check(0)
        info = tarfile.TarInfo(rel)
        info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, self.mtime
        self.members[rel] = (info, None)

    def skip(self, rel: str, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < 200:
            self.skipped.append({"path": rel, "reason": reason})
        log.debug("capture_skipped", path=rel, reason=reason)

    def write(self, out: Path) -> None:
        """Write the archive next to ``out`` and rename it into place."""
        with atomic_output(out) as tmp, tarfile.open(tmp, "w:gz") as tar:
            for rel in sorted(self.members):
                info, data = self.members[rel]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _read_bounded(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CaptureTooLarge(f"larger than {limit} bytes")
    return data


class _SysfsCapture:
    """Copies the RDMA part of a sysfs tree into an _Archive under ``node/sys``."""

    def __init__(self, root: str, archive: _Archive) -> None:
        self.root = os.path.realpath(root)
        self.ar = archive

    def rel(self, real: str) -> str | None:
        """The archive name of a real path under the sysfs root, None outside it."""
        r = os.path.relpath(real, self.root)
        if r == ".." or r.startswith("../") or os.path.isabs(r):
            return None
        return posixpath.join(PREFIX, "sys", *([] if r == "." else r.split(os.sep)))

    def link(self, path: str) -> None:
        rel = self.rel(os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))
        target = os.readlink(path)
        if rel is None:
            return
        # Keep a link only if it stays inside sys/ without following anything.
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if os.path.isabs(target) or not resolved.startswith(f"{PREFIX}/sys/"):
            self.ar.skip(rel, f"link target {target} leaves sys/")
            return
        self.ar.add_link(rel, target)

    def file(self, path: str, rel: str) -> None:
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                return
            if not st.st_mode & 0o444:
                self.ar.skip(rel, "not readable (write-only attribute)")
                return
            data = _read_bounded(path, self.ar.limits.max_file_bytes)
        except CaptureTooLarge as exc:
            self.ar.skip(rel, str(exc))
            return
        except OSError as exc:
            # sysfs answers EINVAL/EIO/EOPNOTSUPP for attributes that do not apply now (speed of a down
            # link): the agent gets the same error from the live tree, so the capture leaves the file out.
            self.ar.skip(rel, os.strerror(exc.errno) if exc.errno else str(exc))
            return
        self.ar.add_file(rel, data)

    def tree(self, top: str) -> None:
        """Everything under the real directory ``top``: files, directories, links as links."""
        top_rel = self.rel(top)
        if top_rel is None:
            return
        self.ar.add_dir(top_rel)
        for dirpath, dirs, files in os.walk(top, followlinks=False):
            rel_dir = self.rel(dirpath)
            if rel_dir is None:  # never: the walk stays under top (no links followed), which is inside
                continue
            keep = []
            for d in sorted(dirs):
                p = os.path.join(dirpath, d)
                if os.path.islink(p):
                    self.link(p)
                elif d not in SKIP_DIRS:
                    keep.append(d)
                    self.ar.add_dir(posixpath.join(rel_dir, d))
            dirs[:] = keep
            for f in sorted(files):
                p = os.path.join(dirpath, f)
                if os.path.islink(p):
                    self.link(p)
                else:
                    self.file(p, posixpath.join(rel_dir, f))

    def pci_functions(self) -> None:
        """Every PCI function's vendor and class (bus/pci/devices/*): the agent's pci source counts the
        node's NVIDIA GPUs from them, so a capture replays FabricmonGPUsUnmonitored's inputs too."""
        top = os.path.join(self.root, "bus", "pci", "devices")
        if not os.path.isdir(top):
            return
        for bdf in sorted(os.listdir(top)):
            entry = os.path.join(top, bdf)
            if os.path.islink(entry):
                self.link(entry)
            fn = os.path.realpath(entry)
            rel = self.rel(fn)
            if rel is None or not os.path.isdir(fn):
                continue
            for attr in ("vendor", "class"):
                p = os.path.join(fn, attr)
                if os.path.isfile(p) and not os.path.islink(p):
                    self.file(p, posixpath.join(rel, attr))

    def device(self, entry: str) -> list[str]:
        """Capture one class/infiniband entry; returns its netdev names."""
        if os.path.islink(entry):
            self.link(entry)
        ibdev = os.path.realpath(entry)
        if self.rel(ibdev) is None:
            self.ar.skip(entry, "device directory outside the sysfs root")
            return []
        self.tree(ibdev)
        netdevs: list[str] = []
        pci = os.path.realpath(os.path.join(ibdev, "device"))
        pci_rel = self.rel(pci) if os.path.isdir(pci) else None
        if pci_rel is not None:
            for attr in PCI_ATTRS:
                p = os.path.join(pci, attr)
                if os.path.isfile(p) and not os.path.islink(p):
                    self.file(p, posixpath.join(pci_rel, attr))
            net = os.path.join(pci, "net")
            if os.path.isdir(net) and not os.path.islink(net):
                for ifname in sorted(os.listdir(net)):
                    self.tree(os.path.join(net, ifname))
                    netdevs.append(ifname)
        ports = os.path.join(ibdev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else ():
            try:
                with open(os.path.join(ports, port, "gid_attrs", "ndevs", "0")) as fh:
                    name = fh.read().strip()
            except OSError:
                continue
            if name and name not in netdevs:
                netdevs.append(name)
        return netdevs

    def netdev_entry(self, ifname: str) -> None:
        entry = os.path.join(self.root, "class", "net", ifname)
        if not os.path.lexists(entry):
            return
        if os.path.islink(entry):
            self.link(entry)
            real = os.path.realpath(entry)
            rel = self.rel(real)
            if rel is not None and rel not in self.ar.members:
                self.tree(real)  # a netdev not below the PCI function (an IPoIB child, a bond)
        else:
            self.tree(entry)


# ------------------------------------------------------------------ ethtool and NVML


def ethtool_text(stats: list[tuple[str, int]]) -> str:
    """``ethtool -S`` output, as the agent's ``--ethtool-dir`` files hold it."""
    return "\n".join(["NIC statistics:"] + [f"     {name}: {value}" for name, value in stats]) + "\n"


def groups_json(ifname: str, groups: frozenset[str], stats: list[tuple[str, int]]) -> str:
    """The standard groups as ``ethtool --json -S <if> --all-groups`` writes them (no histograms)."""
    doc: dict[str, object] = {"ifname": ifname}
    per: dict[str, dict[str, int]] = {g: {} for g in sorted(groups)}
    for name, value in stats:
        group, _, stat = name.partition("/")
        per.setdefault(group, {})[stat] = value
    doc.update(per)
    return json.dumps([doc], indent=4) + "\n"


def pfc_text(trust: str | None, enabled: frozenset[int] | None) -> str:
    """The ``<if>.pfc.txt`` summary (``mlnx_qos -i``-like) the agent's fixture path parses."""
    lines = []
    if trust:
        lines.append(f"Priority trust state: {trust}")
    if enabled is not None:
        lines += ["PFC configuration:", "\tpriority    " + "   ".join(str(p) for p in range(8)),
                  "\tenabled     " + "   ".join("1" if p in enabled else "0" for p in range(8))]
    return "\n".join(lines) + "\n"


def _capture_ethtool(ar: _Archive, netdevs: list[str], ethtool_dir: str | None) -> str:
    if ethtool_dir is not None:
        for ifname in netdevs:
            for suffix in (".txt", ".pfc.txt", ".groups.json"):
                p = os.path.join(ethtool_dir, ifname + suffix)
                if os.path.isfile(p):
                    try:
                        ar.add_file(f"{PREFIX}/ethtool/{ifname}{suffix}", _read_bounded(p, ar.limits.max_file_bytes))
                    except (OSError, CaptureTooLarge) as exc:
                        ar.skip(p, str(exc))
        return "dir"
    from .sources.ethtool import EthtoolIoctl
    from .sources.ethtool_groups import EthtoolNetlink
    from .sources.fabric_config import DcbUnavailable, read_dcb

    reader = EthtoolIoctl()
    groups = EthtoolNetlink()
    try:
        for ifname in netdevs:
            try:
                stats = reader.read(ifname)
            except OSError as exc:
                ar.skip(f"ethtool -S {ifname}", str(exc))
                continue
            ar.add_file(f"{PREFIX}/ethtool/{ifname}.txt", ethtool_text(stats).encode())
            try:
                seen, gstats = groups.read(ifname)
            except OSError as exc:
                ar.skip(f"ethtool netlink stats {ifname}", str(exc))
            else:
                ar.add_file(f"{PREFIX}/ethtool/{ifname}.groups.json", groups_json(ifname, seen, gstats).encode())
            try:
                info = read_dcb(ifname)
            except (DcbUnavailable, OSError) as exc:
                ar.skip(f"dcbnl {ifname}", str(exc) or type(exc).__name__)
                continue
            ar.add_file(f"{PREFIX}/ethtool/{ifname}.pfc.txt", pfc_text(info.trust, info.pfc_enabled).encode())
    finally:
        reader.close()
        groups.close()
    return "ioctl"


def gpu_document(g) -> dict:
    """One ``GpuReading`` in the fake-NVML file format (DESIGN.md "Fake NVML file")."""
    doc: dict = {"index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id}
    for key in ("utilization", "throttle_reasons", "pcie_replay"):
        if getattr(g, key) is not None:
            doc[key] = getattr(g, key)
    doc["xid"] = {str(code): n for code, n in sorted(g.xid_counts.items())}
    ecc = {k: v for k, v in (("corrected", g.ecc_corrected), ("uncorrected", g.ecc_uncorrected)) if v is not None}
    if ecc:
        doc["ecc"] = ecc
    # The NVML paths of a Blackwell (or a GPU without counters), so the fake backend reads the same
    # keys back; a Hopper's default needs no key.  A path not yet decided is the one that gave values.
    traffic = g.traffic_path or ("count_fields" if any(lk.tx_bytes is not None for lk in g.links)
                                 else "throughput_fields")
    errors = g.errors_path or ("count_fields" if any(lk.nvlink5_errors for lk in g.links) else "legacy")
    if g.links and (traffic, errors) != ("throughput_fields", "legacy"):
        doc["nvlink_counters"] = {"traffic": traffic, "errors": errors}
    doc["links"] = [{k: v for k, v in (("state", 1 if lk.state else 0), ("tx_kib", lk.tx_kib), ("rx_kib", lk.rx_kib),
                                       ("tx_bytes", lk.tx_bytes), ("rx_bytes", lk.rx_bytes),
                                       ("replay", lk.replay), ("recovery", lk.recovery), ("crc_flit", lk.crc_flit),
                                       ("crc_data", lk.crc_data), ("remote_pci_bus_id", lk.remote_pci_bus_id),
                                       *sorted(lk.nvlink5_errors.items()))
                     if v is not None} for lk in g.links]
    return doc


def read_nvml_document(backend, deadline_s: float = 10.0) -> dict:
    """Every GPU through an NVML backend, in a worker with a deadline (NVML calls can hang)."""
    from .sources.nvml.backend import GpuLost

    result: dict = {}

    def work() -> None:
        try:
            backend.init()
            try:
                backend.begin_poll()
                gpus = []
                for i in range(backend.device_count()):
                    try:
                        gpus.append(gpu_document(backend.read_gpu(i)))
                    except GpuLost:
                        gpus.append({"index": i, "lost": True})
                result["doc"] = {"gpus": gpus}
            finally:
                backend.shutdown()
        except Exception as exc:  # reported as the capture's NVML status, never fatal
            result["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=work, name="collect-nvml", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        raise TimeoutError(f"NVML did not answer within {deadline_s:g} s")
    if "error" in result:
        raise RuntimeError(result["error"])
    return result["doc"]


def _capture_nvml(ar: _Archive, nvml: str) -> str:
    if nvml == "off":
        return "off"
    from .sources.nvml.backend_fake import FakeNvmlBackend
    from .sources.nvml.backend_pynvml import PynvmlBackend

    backend = FakeNvmlBackend(nvml[5:]) if nvml.startswith("fake:") else PynvmlBackend()
    try:
        doc = read_nvml_document(backend)
    except (TimeoutError, RuntimeError) as exc:
        log.warning("capture_nvml_unavailable", error=str(exc))
        return f"unavailable: {exc}"
    ar.add_file(f"{PREFIX}/nvml.json", ('{"gpus": [\n' + ",\n".join(json.dumps(g) for g in doc["gpus"])
                                         + "\n]}\n").encode())
    log.info("capture_nvml", gpus=len(doc["gpus"]))
    return "fake" if nvml.startswith("fake:") else "nvml"


# ------------------------------------------------------------------ entry points


def collect(sysfs_root: str, out: str, *, ethtool_dir: str | None = None, nvml: str = "auto",
            node_name: str | None = None, limits: Limits = Limits()) -> dict:
    """Capture the node into the archive ``out``; returns the capture summary (``capture.json``)."""
    limits.validate()
    base = os.path.join(sysfs_root, "class", "infiniband")
    if not os.path.isdir(sysfs_root):
        raise ConfigError(f"collect: --sysfs-root {sysfs_root}: not a directory")
    if not os.path.isdir(base):
        raise ConfigError(f"collect: --sysfs-root {sysfs_root}: no class/infiniband directory (no RDMA devices, "
                          "or not a sysfs tree)")
    if ethtool_dir is not None and not os.path.isdir(ethtool_dir):
        raise ConfigError(f"collect: --ethtool-dir {ethtool_dir}: not a directory")
    if not (nvml in ("auto", "off") or (nvml.startswith("fake:") and len(nvml) > 5)):
        raise ConfigError(f"collect: --nvml: must be auto, off or fake:FILE, got {nvml!r}")
    if nvml.startswith("fake:") and not os.path.isfile(nvml[5:]):
        raise ConfigError(f"collect: --nvml {nvml}: no such file")
    out_path = Path(out)
    if not out_path.name.endswith((".tar.gz", ".tgz")):
        raise ConfigError(f"collect: --out {out}: name it .tar.gz")
    if not out_path.parent.is_dir():
        raise ConfigError(f"collect: --out {out}: directory {out_path.parent} does not exist")

    from .agent.runtime import resolve_node_name
    from .config import load_agent_config

    node = resolve_node_name(load_agent_config(None, {"sysfs_root": sysfs_root, "node_name": node_name}))
    ar = _Archive(limits)
    sys_cap = _SysfsCapture(sysfs_root, ar)
    t0 = time.monotonic()
    try:
        ar.add_file(f"{PREFIX}/hostname", (node + "\n").encode())
        netdevs: list[str] = []
        devices = sorted(os.listdir(base))
        for name in devices:
            found = sys_cap.device(os.path.join(base, name))
            netdevs += [n for n in found if n not in netdevs]
            log.info("capture_device", device=name, netdevs=found, files=len(ar.members))
        for ifname in netdevs:
            sys_cap.netdev_entry(ifname)
        sys_cap.pci_functions()
        ethtool_mode = _capture_ethtool(ar, netdevs, ethtool_dir)
        nvml_mode = _capture_nvml(ar, nvml)
    except CaptureTooLarge as exc:
        raise ConfigError(f"collect: capture of {sysfs_root} stopped: {exc}") from exc
    summary = {
        "fabricmon_version": __version__, "node": node,
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "devices": devices, "netdevs": netdevs, "ethtool": ethtool_mode, "nvml": nvml_mode,
        "files": sum(1 for info, _ in ar.members.values() if info.isfile()), "bytes": ar.total,
        "skipped_count": ar.skipped_count, "skipped": ar.skipped,
    }
    ar.add_file(f"{PREFIX}/capture.json", (json.dumps(summary, indent=2) + "\n").encode())
    ar.write(out_path)
    log.info("capture_written", out=str(out_path), node=node, devices=len(devices), netdevs=len(netdevs),
             files=summary["files"], bytes=ar.total, skipped=ar.skipped_count,
             seconds=round(time.monotonic() - t0, 3))
    return summary


def extract_capture(archive: str, dest: str, limits: Limits = Limits()) -> dict:
    """Unpack a capture under ``dest`` (checked: names, links, counts, sizes); returns agent overrides."""
    try:
        tar = tarfile.open(archive, "r:gz")
    except (OSError, tarfile.TarError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"--capture {archive}: not a readable capture archive (.tar.gz): {reason}") from exc
    with tar:
        try:
            listed = tar.getmembers()
        except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--capture {archive}: damaged archive: {reason}") from exc
        members: list[tarfile.TarInfo] = []
        total = 0
        for m in listed:
            if len(members) >= limits.max_files:
                raise ConfigError(f"--capture {archive}: more than {limits.max_files} members")
            if m.name != PREFIX and not m.name.startswith(PREFIX + "/"):
                raise ConfigError(f"--capture {archive}: member {m.name!r} outside {PREFIX}/ (not a capture)")
            total += m.size
            if m.size > limits.max_file_bytes or total > limits.max_total_bytes:
                raise ConfigError(f"--capture {archive}: member {m.name!r} exceeds the size limits")
            members.append(m)
        try:
            # The "data" filter refuses absolute names, links that leave dest, devices and setuid bits.
            tar.extractall(dest, members=members, filter="data")
        except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--capture {archive}: cannot extract: {reason}") from exc
    root = os.path.join(dest, PREFIX)
    if not os.path.isdir(os.path.join(root, "sys")):
        raise ConfigError(f"--capture {archive}: no {PREFIX}/sys in the archive (not a capture)")
    nvml = os.path.join(root, "nvml.json")
    ethtool = os.path.join(root, "ethtool")
    return {"sysfs_root": os.path.join(root, "sys"),
            "ethtool_dir": ethtool if os.path.isdir(ethtool) else None,
            "nvml": f"fake:{nvml}" if os.path.isfile(nvml) else "off"}


__all__ = ["Limits", "collect", "extract_capture", "ethtool_text", "gpu_document", "pfc_text",
           "read_nvml_document"]
