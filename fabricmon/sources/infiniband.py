"""InfiniBand / RoCE port state and counters from ``/sys/class/infiniband``.

Per discovered port this reads ``state``, ``phys_state``, ``rate``, and every
file of ``counters/``, ``counters_ext/`` (MLNX_OFED, pre-4.5 kernels) and
``hw_counters/``, and turns them into raw ``Reading``s; ``counters.py`` makes
them monotonic.  Three facts drive the shape of this module:

* Widths differ per counter, and so does what happens at the end of the range:
  IBTA PMA error counters SATURATE at 4/8/16 bits, mlx5 Q counters are 32-bit
  and WRAP, data/packet/congestion counters are 64-bit.  The tables below carry
  that, and every counter Reading carries ``group=f"{device}/{port}"`` so a
  driver reload (all 64-bit counters of the port go backwards together) is
  told apart from a 32-bit wrap.
* Isolation: node_exporter loses every InfiniBand metric when one file fails.
  Here a bad file costs its own series plus one ``result.error``; a port that
  disappears mid-poll costs that port's series plus one error.  ``poll`` never
  raises for a per-file or per-port problem.
* Cost: a poll runs every second and reads ~500 files on a 9-HCA node, so it
  is syscall-bound.  Files are opened with ``openat`` relative to a directory
  fd (no repeated path walk through the class symlink) and read with one
  ``os.read``; per-file classification, label tuples and, for a value that did
  not change, the Readings themselves are cached.  Measured: ~3.3 ms CPU per
  poll on a 2-vCPU VM where open+read+close alone costs ~2.8 ms.

Reads that block: a firmware-stuck HCA sleeps in the kernel inside a sysfs
read.  Each device's ports are read on a daemon worker of that device
(``guarded_io.KeyedWorkers``) and waited for with a deadline below the
source's, so a stuck device costs its own series (and ``collector_up 0``, a
``/readyz`` reason naming it) while every other device is served.  It is not
read again until its stuck read returns.  The source bounds its own blocking
(``self_bounded``): the poller calls it inline.  Each device keeps its own
``ReadingMemo``: device workers run in parallel.

Only known directories are listed (``os.listdir`` on the port's three counter
dirs); nothing is walked recursively and counter files are opened with
``O_NOFOLLOW``, so sysfs symlink loops cannot trap the poller.
"""

from __future__ import annotations

import errno
import math
import os
import re
from dataclasses import dataclass
from typing import NamedTuple

import structlog

from ..config import InfinibandConfig
from ..model import Labels, Reading, ReadingMemo, Semantics, SourceResult
from .bounds import RejectCounts, Rejected, counter_from_bytes
from .drivers.families import HW_LIFESPAN, HW_STAT, RETRIES
from .drivers.rdma_tables import DEVICE_PREFIXES as RDMA_DEVICE_PREFIXES
from .drivers.rdma_tables import MODULE_DRIVERS as RDMA_MODULE_DRIVERS
from .drivers.rdma_tables import TABLES as RDMA_TABLES
from .errorlog import ErrorLog
from .guarded_io import KeyedWorkers, read_regular, run_all
from .inventory import DeviceInfo, Inventory, PortInfo
from .link_modes import LaneCache
from .registry import SourceContext, SourceSpec

__all__ = [
    "EXT_SUPERSEDES",
    "PMA_ERROR_WIDTHS",
    "CounterPlan",
    "InfinibandSource",
    "DATA_PER_NOMINAL",
    "Rate",
    "classify",
    "data_rate_gbps",
    "hw_counter_semantics",
    "netdev_speed_gbps",
    "parse_counter",
    "parse_netdev_speed",
    "parse_phys_state",
    "parse_rate",
    "parse_state",
    "rdma_driver",
]

_log = structlog.get_logger("fabricmon.sources")
UNCLASSIFIED = "fabricmon_rdma_hw_stat_unclassified"

# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------

#: IBTA PortCounters error counters and their widths; they pin at 2^w - 1.
PMA_ERROR_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}

#: counters/ files with a family of their own: name -> (family, multiplier).
#: port_{xmit,rcv}_data count 4-octet words whatever the lane count.
_PORT_FAMILIES: dict[str, tuple[str, int]] = {
    "port_rcv_data": ("fabricmon_ib_port_receive_bytes_total", 4),
    "port_xmit_data": ("fabricmon_ib_port_transmit_bytes_total", 4),
    "port_rcv_packets": ("fabricmon_ib_port_receive_packets_total", 1),
    "port_xmit_packets": ("fabricmon_ib_port_transmit_packets_total", 1),
    "port_xmit_wait": ("fabricmon_ib_port_transmit_wait_total", 1),
}

#: counters_ext/ file -> the counters/ name it doubles.  The series keeps the
#: modern name, so upgrading a kernel does not split it.
EXT_SUPERSEDES: dict[str, str] = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}

#: Where a port has counters_ext/ (MLNX_OFED and pre-4.5 kernels with mlx4),
#: neither copy can be trusted alone: before kernel 4.5 ("IB/core: Display
#: extended counter set if available") counters/ held the 32-bit PortCounters,
#: which pin at 2^32 - 1, while on a real mlx4 HCA counters_ext/port_rcv_packets_64
#: and port_xmit_packets_64 read 0 for good while counters/port_rcv_packets
#: holds billions.  Both copies only ever grow, so the exported value is the
#: larger of the two: the live 64-bit one wins over a pinned 32-bit twin, the
#: live counters/ one over a dead _64, and the maximum of two monotonic
#: sequences is itself monotonic, so switching between them never looks like a reset.
_LEGACY_32 = frozenset(_PORT_FAMILIES) | frozenset(EXT_SUPERSEDES.values())
_LEGACY_32_MAX = (1 << 32) - 1

#: hw_counters knowledge per driver (widths, gauges, curated families) lives in drivers/rdma_tables.py.

# --------------------------------------------------------------------------
# Pure parsers
# --------------------------------------------------------------------------


def _parse_id_name(text: str, what: str) -> tuple[int, str]:
    num, sep, name = text.strip().partition(":")
    num = num.strip()
    if not sep or not num.isdigit():
        raise Rejected("malformed", f"not a {what}: {text[:40]!r}")
    if len(num) > 3 or int(num) > 255:  # IB state ids are u8 enums
        raise Rejected("out_of_range", f"{what} id {num[:20]} beyond 255")
    return int(num), name.strip()


def parse_state(text: str) -> tuple[int, str]:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``.  Raises ValueError."""
    return _parse_id_name(text, "port state")


def parse_phys_state(text: str) -> tuple[int, str]:
    """``"5: LinkUp"`` -> ``(5, "LinkUp")`` (names may hold spaces: ``"7: Phy Test"``)."""
    return _parse_id_name(text, "physical port state")


class Rate(NamedTuple):
    bytes_per_second: float
    width_lanes: int
    speed: str  # SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR
    gbps: float


# rate_show(): "%d%s Gb/sec (%dX%s)"; kernels before 4.x printed SDR with an
# empty speed name ("10 Gb/sec (4X)"), so the name is optional.
_RATE_RE = re.compile(r"(\d+(?:\.\d+)?) Gb/sec \((\d+)X(?: ([A-Z][A-Z0-9]*))?\)")
_WIDTHS = frozenset({1, 2, 4, 8, 12})
_MAX_GBPS = 10_000.0  # 12X XDR is 2400 Gb/s; anything past this is a garbled file


def parse_rate(text: str) -> Rate:
    """``"400 Gb/sec (4X NDR)"`` -> ``Rate(50e9, 4, "NDR", 400.0)``.  Raises ValueError."""
    m = _RATE_RE.fullmatch(text.strip())
    if m is None:
        raise Rejected("malformed", f"not a port rate: {text[:40]!r}")
    gbps = float(m[1]) if len(m[1]) <= 12 else math.inf
    width = int(m[2]) if len(m[2]) <= 2 else 0
    if not 0 <= gbps <= _MAX_GBPS:
        raise Rejected("out_of_range", f"port rate {m[1][:20]} Gb/s outside 0..{_MAX_GBPS:g}")
    if width not in _WIDTHS:
        raise Rejected("out_of_range", f"not a port width: {m[2][:20]}X in {text[:40]!r}")
    return Rate(gbps * 1e9 / 8, width, m[3] or "SDR", gbps)


#: Data bits per signalled bit of an InfiniBand lane.  rate_show() prints
#: 2.5/5/10 Gb/s per lane for SDR/DDR/QDR, which are 8b/10b encoded (80% data);
#: FDR10 prints 10 for 10.3125 GBd at 64b/66b (10 Gb/s of data); FDR prints 14
#: for 14.0625 GBd at 64b/66b (13.64 Gb/s of data); EDR and later print the
#: data rate (25.78125 GBd at 64b/66b is 25 Gb/s; HDR/NDR/XDR PAM4 with FEC
#: likewise).  IBTA Vol 2 and drivers/infiniband/core/verbs.c ib_rate_to_mbps().
DATA_PER_NOMINAL: dict[str, float] = {
    "SDR": 0.8, "DDR": 0.8, "QDR": 0.8,
    "FDR10": 1.0, "FDR": 14.0625 * 64 / 66 / 14,
    "EDR": 1.0, "HDR": 1.0, "NDR": 1.0, "XDR": 1.0,
}


def data_rate_gbps(rate: Rate, link_layer: str) -> float:
    """The rate data can flow at: rate_show's number less the line coding.

    An Ethernet (RoCE) port's rate is its Ethernet speed, a data rate already
    (mlx5 only dresses it in IB speed names: 40GbE shows as "4X QDR").
    """
    if link_layer == "Ethernet":
        return rate.gbps
    return rate.gbps * DATA_PER_NOMINAL.get(rate.speed, 1.0)


#: /sys/class/net/<if>/speed values that mean "unknown" (SPEED_UNKNOWN is -1; some drivers print it as u32)
_SPEED_UNKNOWN = frozenset({-1, 0, 4294967295})


def parse_netdev_speed(text: str) -> float | None:
    """``/sys/class/net/<if>/speed`` (Mb/s) -> Gb/s; None when the netdev does not know (link down)."""
    t = text.strip()
    if not t.lstrip("-").isdigit() or len(t) > 12:
        raise Rejected("malformed", f"not a netdev speed: {t[:40]!r}")
    mbps = int(t)
    if mbps in _SPEED_UNKNOWN:
        return None
    if not 0 < mbps <= _MAX_GBPS * 1000:
        raise Rejected("out_of_range", f"netdev speed {mbps} Mb/s outside 1..{_MAX_GBPS * 1000:g}")
    return mbps / 1000.0


def netdev_speed_gbps(sysfs_root: str, netdev: str) -> float | None:
    """The netdev's speed in Gb/s, None when it has none to give (no netdev, unreadable, unknown)."""
    if not netdev or "/" in netdev or netdev in (".", ".."):
        return None
    try:
        with open(os.path.join(sysfs_root, "class", "net", netdev, "speed"), "rb") as f:
            return parse_netdev_speed(f.read(64).decode("ascii", "replace"))
    except (OSError, ValueError):
        return None  # reading speed of a down link fails with EINVAL: the sysfs rate stands


def parse_counter(data: bytes, width: int = 64) -> int:
    """A counter file's content -> int within ``width`` bits.  Raises ``bounds.Rejected`` (a ValueError).

    Stricter than ``int()``, which would take ``-5``, ``+5`` or ``1_000``;
    drivers put ``N/A (no PMA)`` or NUL-padded junk in these files.
    """
    return counter_from_bytes(data, width)


# --------------------------------------------------------------------------
# Counter classification
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CounterPlan:
    """How one counter file becomes Readings."""

    semantics: Semantics
    width: int
    scale: float  # Reading.scale: raw unit -> exported base unit (words -> bytes, ms -> s)
    families: tuple[tuple[str, bool], ...]  # (family, labelled with counter=<name>)
    counter: str  # value of the ``counter`` label (the modern sysfs name)
    legacy_32: bool = False  # beside counters_ext/: may be a 32-bit PortCounter that pins
    unclassified: bool = False  # a hw_counters file no driver table knows
    curated_counter: str | None = None  # ``counter`` of the curated retries family (canonical name)


def rdma_driver(device: str, device_path: str | None = None) -> str:
    """The driver family of an RDMA device: its PCI function's driver link, else its kernel name.

    rdma-core's udev rules may rename devices (``rdmap94s0f0``), so the name alone is a fallback;
    a device neither names is read as mlx5 (what this agent was first built for).
    """
    if device_path:
        try:
            module = os.path.basename(os.readlink(os.path.join(device_path, "device", "driver")))
        except OSError:
            module = ""
        drv = RDMA_MODULE_DRIVERS.get(module)
        if drv:
            return drv
    for prefix, drv in RDMA_DEVICE_PREFIXES:
        if device.startswith(prefix):
            return drv
    return "mlx5"


def classify(subdir: str, name: str, legacy: bool = False, driver: str = "mlx5") -> CounterPlan:
    """Classify a file of ``counters``, ``counters_ext`` or ``hw_counters``.

    Data counters keep their raw 4-octet-word value and carry ``scale=4`` in
    the Reading: the tracker unwraps and reset-checks the integer the hardware
    counts (width 64, in words) and applies the x4 to the exported total and
    delta only.  ``hw_counters`` go by the driver's table (``drivers/rdma_tables.py``):
    a gauge or high-water mark is exported as read, never as a counter; a name
    the table lacks is a 64-bit counter (the safe default: a decrease is a reset,
    not a wrap) and ``unclassified``.
    """
    if subdir == "hw_counters":
        m = RDMA_TABLES.get(driver, RDMA_TABLES["mlx5"]).lookup(name)
        if m is None:
            return CounterPlan(Semantics.MONOTONIC, 64, 1, ((HW_STAT, True),), name, unclassified=True)
        rule = m.rule
        fams: tuple[tuple[str, bool], ...] = ((rule.family, rule.family != HW_LIFESPAN),) if rule.family else ()
        fams += tuple((f, f == RETRIES) for f in rule.also)
        return CounterPlan(rule.semantics, rule.width, rule.scale, fams, name, curated_counter=m.counter)
    if subdir == "counters_ext":
        name = EXT_SUPERSEDES.get(name, name)
        legacy = False  # counters_ext holds the 64-bit values
    elif subdir != "counters":
        raise ValueError(f"unknown counter directory {subdir!r}")
    if name in _PORT_FAMILIES:
        family, scale = _PORT_FAMILIES[name]
        return CounterPlan(Semantics.MONOTONIC, 64, scale, ((family, False),), name, legacy_32=legacy)
    width = PMA_ERROR_WIDTHS.get(name)
    if width is not None:
        return CounterPlan(Semantics.SATURATING, width, 1, (("fabricmon_ib_port_errors_total", True),), name)
    return CounterPlan(Semantics.MONOTONIC, 64, 1, (("fabricmon_ib_port_pma_total", True),), name,
                       legacy_32=legacy and name in _LEGACY_32)


def hw_counter_semantics(name: str, driver: str = "mlx5") -> tuple[Semantics, int]:
    """(semantics, width) of a hw_counters file of ``driver``; unknown names are 64-bit monotonic."""
    plan = classify("hw_counters", name, driver=driver)
    return plan.semantics, plan.width


# --------------------------------------------------------------------------
# I/O
# --------------------------------------------------------------------------

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_O_SUBDIR = _O_DIR | os.O_NOFOLLOW
# The counter loop opens ~500 files a poll: O_NONBLOCK instead of an fstat each (1 us apiece) keeps a
# FIFO from blocking the open; what it reads (nothing) is refused as not a counter.
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_SIZE = 128  # counters are <= 20 digits; attributes ("400 Gb/sec (4X NDR)") are short


def _read_at(dfd: int, name: str) -> bytes:
    """An attribute file: refused unless fstat says regular file (guarded_io)."""
    return read_regular(name, _READ_SIZE, dir_fd=dfd)


_REJECT_REASON = re.compile(r": rejected \((\w+)\)")


def _sysfs_path(subject: str, paths: dict[str, str]) -> str:
    """``mlx5_0/1/counters/x`` (an error's subject) -> the file's sysfs path, for the log."""
    dev, _, rest = subject.partition("/")
    port, _, rel = rest.partition("/")
    base = paths.get(f"{dev}/{port}")
    if base is None:
        return subject
    return os.path.join(base, rel) if rel else base


def _oserror_text(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"


class _FileSlot:
    """One counter file of one port: what it becomes, and the last Readings built.

    Readings are immutable, so when a file reads the same raw value as last
    poll (most error and Q counters, most of the time) the previous Readings
    are reused: building a frozen dataclass costs more than reading the file.
    """

    __slots__ = ("name", "emits", "legacy_32", "labels", "last_raw", "last", "width", "unclassified")

    def __init__(self, name: str, plan: CounterPlan, dp: Labels, group: str) -> None:
        self.name = name
        self.width = plan.width
        self.legacy_32 = plan.legacy_32
        self.unclassified = plan.unclassified
        self.labels: Labels = dp + (("counter", plan.counter),)
        curated = dp + (("counter", plan.curated_counter or plan.counter),)
        self.emits = tuple(
            (family, (curated if family == RETRIES else self.labels) if labelled else dp,
             plan.semantics, plan.width, group if plan.semantics is not Semantics.GAUGE else "", plan.scale)
            for family, labelled in plan.families
        )
        self.last_raw = -1
        self.last: tuple[Reading, ...] = ()

    def readings(self, raw: int) -> tuple[Reading, ...]:
        if raw == self.last_raw:
            return self.last
        out = [Reading(fam, lab, raw, sem, width, group, scale) for fam, lab, sem, width, group, scale in self.emits]
        if self.legacy_32:
            # Pinned means exactly 2^32 - 1: a 64-bit count past it is not pinned.
            out.append(Reading("fabricmon_ib_port_error_saturated", self.labels, 1 if raw == _LEGACY_32_MAX else 0))
        self.last_raw = raw
        self.last = tuple(out)
        return self.last


class _PortPoll:
    """Readings and errors of one port, committed to the result only at the end.

    Buffering lets a port that vanished mid-poll be reported as one error
    instead of one per file, and drop its half-read series.
    """

    __slots__ = ("key", "readings", "errors", "enoent", "rejected", "unclassified")

    def __init__(self, key: str) -> None:
        self.key = key
        self.unclassified: list[str] | None = None  # hw_counters names no driver table knows; None: no such dir
        self.readings: list[Reading] = []
        self.errors: list[str] = []
        self.enoent = False
        self.rejected: list[str] = []  # reasons of values refused by bounds

    def fail(self, what: str, exc: Exception) -> None:
        if isinstance(exc, Rejected):
            self.rejected.append(exc.reason)
        if isinstance(exc, OSError):
            if exc.errno == errno.ENOENT:
                self.enoent = True
            self.errors.append(f"{self.key}/{what}: {_oserror_text(exc)}")
        else:
            self.errors.append(f"{self.key}/{what}: {exc}")


class InfinibandSource:
    """Source ``infiniband``: every RDMA port of the inventory."""

    name = "infiniband"
    self_bounded = True  # every read runs on a device worker, waited for with a deadline

    def __init__(self, config: InfinibandConfig | None = None, *, timeout: float | None = None,
                 lanes: LaneCache | None = None) -> None:
        # Device include/exclude filters live in discovery (make_discover), so
        # excluded devices are never read; only the deadline is needed here.
        # An explicit timeout wins over the section's.
        self.timeout = timeout if timeout is not None else (config or InfinibandConfig()).timeout
        # Ethernet lanes from ethtool netlink link modes (a live host; None: the sysfs rate's lanes)
        self._lanes = lanes
        # (port key, subdir) pairs seen on an earlier poll.  A counter dir that
        # never existed (bnxt_re has no counters/) is not an error; one that
        # existed and is gone now is.
        self._seen_dirs: set[tuple[str, str]] = set()
        # (port key, subdir, legacy) -> (listing, slots); rebuilt when the listing changes.
        self._slots: dict[tuple[str, str, bool], tuple[list[str], list[_FileSlot]]] = {}
        # Per-port attribute Readings (state, rate, info, up): same object while unchanged.
        self._memo = ReadingMemo()  # the poll thread's own readings
        self._device_memos: dict[str, ReadingMemo] = {}  # per device: its worker's readings
        self._workers = KeyedWorkers("ib")
        self._rejects = RejectCounts(self.name)
        self._errlog = ErrorLog(self.name)
        self._missing_log = ErrorLog(self.name, every=600.0, event="expected_devices_missing")
        self._logged: set[tuple[str, str]] = set()  # (device, hw_counters name) logged as unclassified

    def close(self) -> None:
        self._workers.close()  # never waits for a worker blocked in a read
        if self._lanes is not None:
            self._lanes.close()

    # -- poll -----------------------------------------------------------------

    def poll(self, inventory: Inventory) -> SourceResult:
        result = SourceResult(self.name, present=bool(inventory.ports))
        devices = {d.name: d for d in inventory.devices}
        ports_facts: dict[str, dict] = {}
        paths = {f"{p.device}/{p.port}": p.path for p in inventory.ports}
        self._memo.begin()
        for msg in inventory.errors:  # attributes discovery refused (a junk fw_ver, a "../x" netdev)
            result.error(msg)
            m = _REJECT_REASON.search(msg)
            if m:
                self._rejects.add(m.group(1))
        unclassified: dict[str, set[str]] = {}
        by_device: dict[str, list[PortInfo]] = {}
        for port in inventory.ports:
            by_device.setdefault(port.device, []).append(port)
        calls = {}
        for name, ports in by_device.items():
            memo = self._device_memos.get(name)
            if memo is None:
                memo = self._device_memos[name] = ReadingMemo()
            calls[name] = (self._poll_device, (ports, devices.get(name), memo, inventory.sysfs_root))
        done, blocked = run_all(self._workers, calls, 0.7 * self.timeout)
        for name in by_device:
            if name in blocked:
                result.stuck.append(name)
                result.error(f"{name}: {blocked[name]}")
                continue
            if isinstance(done[name], BaseException):  # _poll_device catches per port: a bug of its own
                result.error(f"{name}: unexpected {type(done[name]).__name__}: {done[name]}")
                continue
            for key, pp, fact in done[name]:
                if isinstance(pp, Exception):  # a bug on one odd port must not cost the others
                    result.error(f"{key}: unexpected {type(pp).__name__}: {pp}")
                    continue
                if fact is not None:
                    ports_facts[key] = fact
                if pp.unclassified is not None:
                    unclassified.setdefault(name, set()).update(pp.unclassified)
                result.readings.extend(pp.readings)
                for msg in pp.errors:
                    result.error(msg)
                for reason in pp.rejected:
                    self._rejects.add(reason)
        for dev, names in unclassified.items():
            result.readings.append(self._memo.get(UNCLASSIFIED, (("device", dev),), len(names)))
            fresh = sorted(n for n in names if (dev, n) not in self._logged)
            if fresh and len(self._logged) < 10_000:  # bounded: each name logged once
                self._logged.update((dev, n) for n in fresh)
                _log.info("rdma_hw_stat_unclassified", device=dev, driver=rdma_driver(dev), count=len(fresh),
                          names=fresh[:50])
        if result.stuck:
            result.up = False  # not every device is monitored: say so (collector_up 0, /readyz)
        if len(self._device_memos) > len(by_device):  # unplugged devices: their memo and worker go
            for name in [n for n in self._device_memos if n not in by_device]:
                del self._device_memos[name]
            self._workers.retire(by_device)
        result.readings.extend(
            self._memo.get("fabricmon_devices_discovered", (("kind", kind),), n)
            for kind, n in inventory.discovered_counts().items()
        )
        # Beside what was found, what the config expects: FabricmonDevicesMissing compares them.
        result.readings.append(self._memo.get("fabricmon_devices_expected", (("kind", "rdma_port"),),
                                                    inventory.expected_ports))
        self._memo.commit()
        result.readings.extend(self._rejects.readings())
        if result.messages:
            self._errlog.report(result.messages, lambda subject: _sysfs_path(subject, paths))
        missing = inventory.expected_but_missing
        if missing:
            self._missing_log.report([f"{inventory.sysfs_root}: {missing}"])
        result.facts["ports"] = ports_facts
        if len(self._slots) > 3 * len(inventory.ports) + 3:
            # Forget ports that are gone (unplugged, renamed) so the cache stays bounded.
            live = {f"{p.device}/{p.port}" for p in inventory.ports}
            for k in [k for k in list(self._slots) if k[0] not in live]:  # list(): a late device worker may add
                del self._slots[k]
        return result

    def _poll_device(self, ports: list[PortInfo], dev: DeviceInfo | None, memo: ReadingMemo,
                     sysfs_root: str = "") -> list[tuple[str, _PortPoll | Exception, dict | None]]:
        """Every port of one device, on that device's worker: (port key, its poll or the error, its fact)."""
        out: list[tuple[str, _PortPoll | Exception, dict | None]] = []
        memo.begin()
        for port in ports:
            key = f"{port.device}/{port.port}"
            facts: dict[str, dict] = {}
            try:
                pp: _PortPoll | Exception = self._poll_port(port, dev, facts, memo, sysfs_root)
            except Exception as exc:
                pp = exc
            out.append((key, pp, facts.get(key)))
        memo.commit()
        return out

    def _poll_port(self, port: PortInfo, dev: DeviceInfo | None, facts: dict[str, dict],
                   memo: ReadingMemo, sysfs_root: str = "") -> _PortPoll:
        key = f"{port.device}/{port.port}"
        pp = _PortPoll(key)
        try:
            # Follows the class/infiniband/<dev> link: one known link, not a walk.
            pfd = os.open(port.path, _O_DIR)
        except OSError as exc:
            pp.errors.append(f"{key}: port vanished or unreadable: {_oserror_text(exc)}")
            return pp
        try:
            fact = self._read_attributes(pfd, port, dev, pp, memo, sysfs_root)
            self._read_counters(pfd, port, pp)
        finally:
            os.close(pfd)
        if pp.enoent and not os.path.isdir(port.path):
            # Gone while we read it (hot unplug, driver unbind): its series go
            # away like those of a device absent from discovery; one error.
            pp.readings.clear()
            pp.errors[:] = [f"{key}: port vanished during the poll"]
            return pp
        facts[key] = fact
        return pp

    def _read_attributes(self, pfd: int, port: PortInfo, dev: DeviceInfo | None, pp: _PortPoll,
                         memo: ReadingMemo, sysfs_root: str = "") -> dict:
        dp: Labels = (("device", port.device), ("port", port.port))
        add = pp.readings.append
        mk = memo.get
        fact: dict = {
            "state": None, "state_id": None, "phys_state": None, "phys_state_id": None,
            "rate_gbps": None, "width": None, "speed": None,
            "link_layer": port.link_layer or None, "netdev": port.netdev, "rail": port.rail,
        }
        for attr, parse, family in (
            ("state", parse_state, "fabricmon_ib_port_state"),
            ("phys_state", parse_phys_state, "fabricmon_ib_port_physical_state"),
        ):
            try:
                sid, sname = parse(_read_at(pfd, attr).decode("ascii", "replace"))
            except (OSError, ValueError) as exc:
                pp.fail(attr, exc)
                continue
            fact[attr], fact[attr + "_id"] = sname, sid
            add(mk(family, dp, sid))
        try:
            rate = parse_rate(_read_at(pfd, "rate").decode("ascii", "replace"))
        except (OSError, ValueError) as exc:
            pp.fail("rate", exc)
            rate = None
        link_layer = port.link_layer
        if not link_layer:  # discovery could not read it; try once more, count it if it fails
            try:
                link_layer = _read_at(pfd, "link_layer").decode("ascii", "replace").strip()
                fact["link_layer"] = link_layer
            except OSError as exc:
                pp.fail("link_layer", exc)
        # An Ethernet port's speed is its netdev's: older kernels print a 400GbE RoCE port's sysfs
        # rate as "100 Gb/sec (4X EDR)" (older bnxt_re: "2.5 Gb/sec (1X SDR)").  sysfs rate is the fallback.
        speed = netdev_speed_gbps(sysfs_root, port.netdev) if link_layer == "Ethernet" and sysfs_root else None
        width_known = rate is not None
        if speed is not None:
            # a sysfs rate that disagrees with the netdev is stale, and so is its lane count: the lanes
            # are the netdev's link modes' where it has them
            lanes = self._lanes.lanes(port.netdev, speed) if self._lanes is not None else None
            agrees = rate is not None and abs(rate.gbps - speed) < 1e-6
            width_known = lanes is not None or agrees
            width = lanes if lanes is not None else rate.width_lanes if rate is not None and agrees else 0
            rate = Rate(speed * 1e9 / 8, width, rate.speed if rate is not None else "", speed)
            fact["rate_source"] = "netdev"
        if rate is not None:
            fact.update(rate_gbps=rate.gbps, width=rate.width_lanes if width_known else None, speed=rate.speed)
            add(mk("fabricmon_ib_port_rate_bytes_per_second", dp, rate.bytes_per_second))
            if width_known:
                add(mk("fabricmon_ib_port_width_lanes", dp, rate.width_lanes))
        if fact["rate_gbps"] is not None:
            data = data_rate_gbps(Rate(0.0, fact["width"] or 0, fact["speed"], fact["rate_gbps"]), link_layer)
            fact["data_rate_gbps"] = data
            add(mk("fabricmon_ib_port_data_rate_bytes_per_second", dp, data * 1e9 / 8))
        add(mk("fabricmon_ib_port_info", dp + (
            ("rail", port.rail), ("link_layer", link_layer), ("interface", port.netdev),
            ("hca_type", dev.hca_type if dev else ""), ("fw_ver", dev.fw_ver if dev else ""),
            ("node_guid", dev.node_guid if dev else ""), ("board_id", dev.board_id if dev else ""),
        ), 1))
        add(mk("fabricmon_ib_port_up", dp, 1))
        return fact

    def _read_counters(self, pfd: int, port: PortInfo, pp: _PortPoll) -> None:
        dp: Labels = (("device", port.device), ("port", port.port))
        ext = self._read_ext(pfd, pp)
        legacy = ext is not None
        names = self._read_dir(pfd, "counters", legacy, dp, pp, merge=ext)
        if ext:
            # counters_ext files without a counters/ twin are series of their own.
            have = frozenset(names or ())
            alone = [n for n in ext if EXT_SUPERSEDES.get(n, n) not in have]
            if alone:
                slots = self._file_slots("counters_ext", alone, False, dp, pp.key)
                for slot in slots:
                    pp.readings.extend(slot.readings(ext[slot.name]))
        dev_path = os.path.dirname(os.path.dirname(port.path))
        self._read_dir(pfd, "hw_counters", False, dp, pp, driver=rdma_driver(port.device, dev_path))

    def _read_ext(self, pfd: int, pp: _PortPoll) -> dict[str, int] | None:
        """Raw values of counters_ext/ by file name; None when the port has no such dir."""
        try:
            sfd = os.open("counters_ext", _O_SUBDIR, dir_fd=pfd)
        except FileNotFoundError as exc:
            pp.enoent = True  # lets _poll_port notice a port that vanished
            if (pp.key, "counters_ext") in self._seen_dirs:
                pp.fail("counters_ext", exc)
            return None
        except OSError as exc:
            pp.fail("counters_ext", exc)
            return None
        out: dict[str, int] = {}
        try:
            try:
                names = sorted(os.listdir(sfd))
            except OSError as exc:
                pp.fail("counters_ext", exc)
                return None
            self._seen_dirs.add((pp.key, "counters_ext"))
            for name in names:
                try:
                    out[name] = parse_counter(_read_at(sfd, name))
                except (OSError, ValueError) as exc:
                    pp.fail(f"counters_ext/{name}", exc)
        finally:
            os.close(sfd)
        return out

    def _file_slots(self, subdir: str, names: list[str], legacy: bool, dp: Labels, key: str,
                    driver: str = "mlx5") -> list[_FileSlot]:
        ckey = (key, subdir, legacy)
        cached = self._slots.get(ckey)
        if cached is not None and cached[0] == names:
            return cached[1]
        old = {s.name: s for s in cached[1]} if cached else {}
        slots = [old.get(n) or _FileSlot(n, classify(subdir, n, legacy, driver), dp, key) for n in names]
        self._slots[ckey] = (names, slots)
        return slots

    def _read_dir(
        self, pfd: int, subdir: str, legacy: bool, dp: Labels, pp: _PortPoll,
        merge: dict[str, int] | None = None, driver: str = "mlx5",
    ) -> list[str] | None:
        """Read every file of one counter dir; return its names, None when the dir does not exist.

        A dir that never existed (bnxt_re has no counters/) is not an error;
        one that existed on an earlier poll and is gone now is.  ``merge``:
        counters_ext values by file name; a counters/ file with a twin there
        exports the larger of the two (see EXT_SUPERSEDES).
        """
        twins = {EXT_SUPERSEDES[n]: v for n, v in merge.items() if n in EXT_SUPERSEDES} if merge else None
        key = pp.key
        try:
            sfd = os.open(subdir, _O_SUBDIR, dir_fd=pfd)
        except FileNotFoundError as exc:
            pp.enoent = True  # lets _poll_port notice a port that vanished
            if (key, subdir) in self._seen_dirs:
                pp.fail(subdir, exc)
            return None
        except OSError as exc:
            pp.fail(subdir, exc)
            return None
        try:
            try:
                names = os.listdir(sfd)
            except OSError as exc:
                pp.fail(subdir, exc)
                return None
            self._seen_dirs.add((key, subdir))
            names.sort()  # stable series order in the exposition
            extend = pp.readings.extend
            slots = self._file_slots(subdir, names, legacy, dp, key, driver)
            if subdir == "hw_counters":
                pp.unclassified = [sl.name for sl in slots if sl.unclassified]
            for slot in slots:
                # Inlined _read_at and parse_counter: this loop runs ~500 times a poll.
                try:
                    fd = os.open(slot.name, _O_FILE, dir_fd=sfd)
                    try:
                        data = os.read(fd, _READ_SIZE)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    pp.fail(f"{subdir}/{slot.name}", exc)
                    continue
                # Fast path inline (this loop runs ~500 times a poll); anything
                # else goes through bounds for its reason.  A counter is <= 20
                # digits: a file filling the whole read is something else.
                size = len(data)
                data = data.strip()
                if size < _READ_SIZE and len(data) <= 20 and data.isdigit():
                    value = int(data)
                    if not value >> slot.width:
                        if twins is not None:
                            twin = twins.get(slot.name)
                            if twin is not None and twin > value:
                                value = twin
                        extend(slot.readings(value))
                        continue
                try:
                    if size >= _READ_SIZE:
                        raise Rejected("too_long", f"file holds {_READ_SIZE} bytes or more")
                    value = counter_from_bytes(data, slot.width)
                except Rejected as exc:
                    pp.fail(f"{subdir}/{slot.name}", exc)
                    continue
                if twins is not None:
                    twin = twins.get(slot.name)
                    if twin is not None and twin > value:
                        value = twin
                extend(slot.readings(value))
            return names
        finally:
            os.close(sfd)


def _build(config: InfinibandConfig, context: SourceContext) -> InfinibandSource:
    # a live host (no --ethtool-dir): Ethernet lanes from ethtool netlink link modes
    return InfinibandSource(config, lanes=LaneCache() if context.ethtool_dir is None else None)


SOURCE = SourceSpec("infiniband", InfinibandConfig, _build)
