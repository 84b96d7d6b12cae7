"""ethtool statistics: PFC pause per priority, pause storms, PHY errors and discards.

Two readers feed one parser-free path of ``(name, value)`` pairs:

* the SIOCETHTOOL ioctl (``ETHTOOL_GSSET_INFO`` / ``GSTRINGS`` / ``GSTATS``)
  from pure Python, on real hosts;
* ``<ethtool_dir>/<if>.txt`` in ``ethtool -S`` format, in fixture trees and the
  simulator, so tests run the same classification and export path.

``classify_stat`` maps a stat name to a metric family of ``metrics.SPECS``;
everything not curated is exported as ``fabricmon_ethtool_stat`` only when it
matches the configured allowlist (mlx5 has hundreds of stats per netdev).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from ..config import EthtoolConfig
from ..model import Labels, Reading, ReadingMemo, Semantics, SourceResult
from .bounds import RejectCounts, Rejected, counter_from_text, read_bounded, valid_ifname
from .drivers import DriverTable, Match, XoffRefresh
from .drivers.ethtool_tables import ALL as ALL_ETHTOOL_TABLES
from .drivers.ethtool_tables import LEGACY_NAMES, STANDARD_GROUPS
from .drivers.ethtool_tables import TABLES as ETHTOOL_TABLES
from .drivers.families import (
    ECN_MARKED,
    GLOBAL_PAUSE_FRAMES,
    GLOBAL_PAUSE_SECONDS,
    GLOBAL_PAUSE_TRANSITIONS,
    PAUSE_CONTROL_FRAMES,
    PAUSE_FRAMES,
    PAUSE_FRAMES_TC,
    PAUSE_SECONDS,
    PAUSE_TRANSITIONS,
    PCI_STALLED,
    PHY_BITS,
    PHY_CORRECTED,
    PHY_ERRORS,
    STORM_EVENTS,
    XOFF_FULL_RATE,
)
from .errorlog import ErrorLog
from .ethtool_groups import EthtoolNetlink, GroupsUnavailable, parse_groups_json, warm_up
from .guarded_io import KeyedWorkers, run_all
from .infiniband import netdev_speed_gbps
from .inventory import Inventory
from .registry import SourceContext, SourceSpec

__all__ = [
    "ECN_MARKED", "ETHTOOL_STAT", "ETHTOOL_UNCLASSIFIED", "ETHTOOL_UP", "GLOBAL_PAUSE_FRAMES", "GLOBAL_PAUSE_SECONDS",
    "GLOBAL_PAUSE_TRANSITIONS", "LEGACY_NAMES", "PAUSE_CONTROL_FRAMES", "PAUSE_FRAMES", "PAUSE_FRAMES_TC",
    "PAUSE_SECONDS", "PAUSE_TRANSITIONS", "PCI_STALLED", "PHY_BITS", "PHY_CORRECTED", "PHY_ERRORS", "STORM_EVENTS",
    "EthtoolDump", "EthtoolError", "EthtoolIoctl", "EthtoolSource", "PfcInfo", "StatClass", "classify_match",
    "classify_stat", "lookup_stat", "parse_ethtool_dump", "parse_ethtool_stats", "parse_gstats", "parse_gstrings",
    "parse_pfc_summary", "read_stats_ioctl", "stat_readings", "tables_for",
]

_log = structlog.get_logger("fabricmon.sources")
MAX_LOGGED_NAMES = 10_000  # names already logged as unclassified, kept to log each once; bounded
GROUPS_EVERY_S = 10.0  # ethtool netlink standard groups: read at most this often per netdev (one netdev a poll)

# --- SIOCETHTOOL ioctl (include/uapi/linux/ethtool.h, sockios.h) ---------------

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETHTOOL_GSSET_INFO = 0x00000037
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
_IFREQ_SIZE = 40  # sizeof(struct ifreq) on LP64: 16-byte name + 24-byte union

# Bounds on what a driver or a dump may hand us.  mlx5 with 256 channels has a
# few thousand stats; past MAX_STATS the count is garbage, and honouring it
# would size the GSTRINGS buffer from it (2 * 2^32 * 32 bytes).
MAX_STATS = 65536
MAX_DUMP_BYTES = 4 << 20  # an ethtool -S dump of MAX_STATS lines fits easily
MAX_NAME_LEN = 64  # the ioctl caps names at ETH_GSTRING_LEN - 1 = 31; the text path gets some slack

# struct ethtool_drvinfo: cmd, 5 x char[32], reserved2[12], then n_priv_flags, n_stats, ...
_DRVINFO_SIZE = 196
_DRVINFO_N_STATS_OFF = 4 + 5 * 32 + 12 + 4


class EthtoolError(OSError):
    """An ethtool ioctl failed for one interface (no such device, not supported, ...)."""

    def __init__(self, interface: str, op: str, err: int) -> None:
        reason = {
            errno.ENODEV: "no such device",
            errno.EOPNOTSUPP: "statistics not supported by the driver",
        }.get(err, os.strerror(err))
        super().__init__(err, f"{interface}: ethtool {op}: {reason}")
        self.interface = interface
        self.op = op


def _ifreq(interface: str, buf: ctypes.Array) -> bytearray:
    """struct ifreq whose ifr_data points at ``buf`` (which the kernel reads and writes)."""
    name = interface.encode()
    if not name or len(name) >= IFNAMSIZ:
        raise EthtoolError(interface, "ifreq", errno.EINVAL)
    req = bytearray(_IFREQ_SIZE)
    req[: len(name)] = name
    struct.pack_into("P", req, IFNAMSIZ, ctypes.addressof(buf))
    return req


class EthtoolIoctl:
    """Reads ``ethtool -S`` statistics of one network namespace through SIOCETHTOOL.

    Holds one datagram socket (the ioctl needs any socket of the namespace) and,
    per interface, the stat names: GSTRINGS copies 32 bytes per stat and names
    change only when the driver's stat set changes (channel count, driver
    reload), so each poll asks the cheap count first and refreshes names only
    when it moved.  GSTATS is the hot call.
    """

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._names: dict[str, list[str]] = {}
        self.string_refreshes = 0  # how often GSTRINGS ran (tests check the cache)
        self._sock_lock = threading.Lock()  # interfaces are read from their own workers

    def _fd(self) -> int:
        with self._sock_lock:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            return self._sock.fileno()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._names.clear()

    def _ioctl(self, interface: str, op: str, buf: ctypes.Array) -> None:
        try:
            fcntl.ioctl(self._fd(), SIOCETHTOOL, _ifreq(interface, buf))
        except OSError as exc:
            raise EthtoolError(interface, op, exc.errno or errno.EIO) from None

    def stats_count(self, interface: str) -> int:
        """Size of the ETH_SS_STATS string set; GDRVINFO n_stats on drivers without GSSET_INFO."""
        # struct ethtool_sset_info: u32 cmd, u32 reserved, u64 sset_mask, u32 data[]
        buf = ctypes.create_string_buffer(16 + 4)
        struct.pack_into("=IIQ", buf, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
        try:
            self._ioctl(interface, "GSSET_INFO", buf)
        except EthtoolError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            return _checked_count(interface, "GDRVINFO", self.drvinfo_n_stats(interface))
        (mask,) = struct.unpack_from("=Q", buf, 8)
        if not mask & (1 << ETH_SS_STATS):
            return 0  # the kernel clears the bit of a set the driver lacks
        return _checked_count(interface, "GSSET_INFO", struct.unpack_from("=I", buf, 16)[0])

    def drvinfo_n_stats(self, interface: str) -> int:
        buf = ctypes.create_string_buffer(_DRVINFO_SIZE)
        struct.pack_into("=I", buf, 0, ETHTOOL_GDRVINFO)
        self._ioctl(interface, "GDRVINFO", buf)
        return struct.unpack_from("=I", buf, _DRVINFO_N_STATS_OFF)[0]

    def driver(self, interface: str) -> str:
        """The driver's name (``struct ethtool_drvinfo.driver``: ``mlx5_core``, ``bnxt_en``, ``ice``, ``veth``)."""
        buf = ctypes.create_string_buffer(_DRVINFO_SIZE)
        struct.pack_into("=I", buf, 0, ETHTOOL_GDRVINFO)
        self._ioctl(interface, "GDRVINFO", buf)
        return buf.raw[4:36].split(b"\0", 1)[0].decode("ascii", "replace")

    def stat_names(self, interface: str, count: int) -> list[str]:
        # struct ethtool_gstrings: u32 cmd, u32 string_set, u32 len, u8 data[len * 32].
        # The kernel writes as many strings as the driver has *now*, whatever len
        # we pass, so the buffer gets headroom against a set that grew meanwhile.
        room = _headroom(count)
        buf = ctypes.create_string_buffer(12 + room * ETH_GSTRING_LEN)
        struct.pack_into("=III", buf, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._ioctl(interface, "GSTRINGS", buf)
        try:
            return parse_gstrings(buf.raw, room)
        except Rejected:
            raise EthtoolError(interface, "GSTRINGS", errno.EOVERFLOW) from None

    def stat_values(self, interface: str, count: int) -> list[int]:
        # struct ethtool_stats: u32 cmd, u32 n_stats, u64 data[n_stats]; same headroom reason.
        room = _headroom(count)
        buf = ctypes.create_string_buffer(8 + room * 8)
        struct.pack_into("=II", buf, 0, ETHTOOL_GSTATS, count)
        self._ioctl(interface, "GSTATS", buf)
        try:
            return parse_gstats(buf.raw, room)
        except Rejected:
            raise EthtoolError(interface, "GSTATS", errno.EOVERFLOW) from None

    def read(self, interface: str) -> list[tuple[str, int]]:
        """All ETH_SS_STATS of ``interface`` as (name, value), in driver order."""
        for _ in range(3):  # bounded: the set changes at most on a reconfiguration
            count = self.stats_count(interface)
            names = self._names.get(interface)
            if names is None or len(names) != count:
                names = self.stat_names(interface, count)
                self.string_refreshes += 1
                self._names[interface] = names
            values = self.stat_values(interface, len(names))
            if len(values) == len(names):
                return list(zip(names, values, strict=True))
            self._names.pop(interface, None)  # the set changed between the calls: names are stale
        raise EthtoolError(interface, "GSTATS", errno.EAGAIN)

    def forget(self, keep: set[str]) -> None:
        """Drop cached names of interfaces no longer polled (hot-unplug, rename)."""
        for name in [n for n in list(self._names) if n not in keep]:  # list(): a late worker may add
            self._names.pop(name, None)


def _headroom(count: int) -> int:
    return 2 * count + 64


def _checked_count(interface: str, op: str, count: int) -> int:
    if count > MAX_STATS:
        raise EthtoolError(interface, op, errno.E2BIG)
    return count


def parse_gstrings(raw: bytes, room: int) -> list[str]:
    """Names from a ``struct ethtool_gstrings`` buffer the kernel filled (room: strings it can hold).

    Rejected(too_long) when the kernel's count exceeds the buffer (the set grew
    past the headroom) or the buffer is shorter than the count says.
    """
    if len(raw) < 12:
        raise Rejected("too_long", "gstrings buffer shorter than its header")
    n = struct.unpack_from("=I", raw, 8)[0]
    if n > room or 12 + n * ETH_GSTRING_LEN > len(raw):
        raise Rejected("too_long", f"gstrings count {n} exceeds the buffer ({room})")
    return [
        raw[off: off + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
        for off in range(12, 12 + n * ETH_GSTRING_LEN, ETH_GSTRING_LEN)
    ]


def parse_gstats(raw: bytes, room: int) -> list[int]:
    """u64 values from a ``struct ethtool_stats`` buffer; Rejected(too_long) as ``parse_gstrings``."""
    if len(raw) < 8:
        raise Rejected("too_long", "gstats buffer shorter than its header")
    n = struct.unpack_from("=I", raw, 4)[0]
    if n > room or 8 + 8 * n > len(raw):
        raise Rejected("too_long", f"gstats count {n} exceeds the buffer ({room})")
    return list(struct.unpack_from(f"={n}Q", raw, 8))  # "Q": u64 by construction


def read_stats_ioctl(interface: str) -> list[tuple[str, int]]:
    """One-shot ioctl read (opens and closes its own socket)."""
    reader = EthtoolIoctl()
    try:
        return reader.read(interface)
    finally:
        reader.close()


# --- text formats ----------------------------------------------------------------------


@dataclass(slots=True)
class EthtoolDump:
    """One parsed ``ethtool -S`` dump: the stats kept and the values refused, with why."""

    stats: list[tuple[str, int]]
    rejected: list[tuple[str, Rejected]]


def parse_ethtool_dump(text: str) -> EthtoolDump:
    """Parse ``ethtool -S`` output into (name, u64) pairs in file order, plus what was refused.

    The value is the text after the *last* ``": "`` (a few drivers put colons
    in names).  Headers (``NIC statistics:``) have no value and are skipped.
    A value that is not a u64 integer (``n/a``, ``-1``, ``1e38``, 21 digits), a
    name longer than ``MAX_NAME_LEN`` or a name seen before is refused, not
    exported: the ioctl only ever gives unique names and u64 values, and the
    text path must not be looser.  Past ``MAX_STATS`` lines the rest are
    refused as ``too_long``.
    """
    out: list[tuple[str, int]] = []
    rejected: list[tuple[str, Rejected]] = []
    seen: set[str] = set()
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(": ")
        if not sep or not name:
            continue
        if len(out) >= MAX_STATS:
            rejected.append((name[:MAX_NAME_LEN], Rejected("too_long", f"more than {MAX_STATS} stats")))
            break
        if len(name) > MAX_NAME_LEN:
            rejected.append((name[:MAX_NAME_LEN], Rejected("too_long", f"stat name of {len(name)} characters")))
            continue
        try:
            v = counter_from_text(value, 64, name)
        except Rejected as exc:
            rejected.append((name, exc))
            continue
        if name in seen:
            rejected.append((name, Rejected("malformed", f"{name} appears twice")))
            continue
        seen.add(name)
        out.append((name, v))
    return EthtoolDump(out, rejected)


def parse_ethtool_stats(text: str) -> list[tuple[str, int]]:
    """The stats of ``parse_ethtool_dump`` (what was refused dropped)."""
    return parse_ethtool_dump(text).stats


@dataclass(frozen=True, slots=True)
class PfcInfo:
    """Lossless configuration of one netdev; None where the source did not say."""

    trust: str | None
    pfc_enabled: frozenset[int] | None


def parse_pfc_summary(text: str) -> PfcInfo:
    """Parse a ``mlnx_qos -i <if>``-style summary (the fixtures' ``<if>.pfc.txt``).

    ``Priority trust state: dscp`` gives the trust mode; the ``priority`` row of
    the PFC table names the columns of the ``enabled`` row.
    """
    trust: str | None = None
    prios: list[int] | None = None
    enabled: frozenset[int] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        low = line.lower()
        if low.startswith("priority trust state:"):
            trust = line.split(":", 1)[1].strip().lower() or None
            continue
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "priority" and len(fields) > 1 and all(f.isdigit() for f in fields[1:]):
            prios = [int(f) for f in fields[1:]]
        elif fields[0] == "enabled" and prios is not None and enabled is None:
            flags = fields[1:]
            if len(flags) == len(prios) and all(f in ("0", "1") for f in flags):
                enabled = frozenset(p for p, f in zip(prios, flags, strict=True) if f == "1")
    return PfcInfo(trust, enabled)


# --- classification ---------------------------------------------------------------------

ETHTOOL_STAT = "fabricmon_ethtool_stat"
ETHTOOL_UP = "fabricmon_ethtool_up"
ETHTOOL_UNCLASSIFIED = "fabricmon_ethtool_unclassified_stats"


@dataclass(frozen=True, slots=True)
class StatClass:
    """Where one ethtool stat goes: family, labels besides ``interface`` (spec order), semantics, scale."""

    family: str
    labels: tuple[tuple[str, str], ...]
    semantics: Semantics = Semantics.MONOTONIC
    scale: float = 1.0
    width: int = 64


def tables_for(driver: str | None) -> tuple[DriverTable, ...]:
    """The driver's own table; every table (mlx5 first) for a driver no table knows or an unknown one."""
    table = ETHTOOL_TABLES.get(driver or "")
    return (table,) if table is not None else ALL_ETHTOOL_TABLES


def xoff_refresh_for(driver: str | None, families: set[str]) -> XoffRefresh | None:
    """How the driver refreshes XOFF, for a netdev whose pause comes in frames only; None otherwise.

    A driver no table knows is read with every table: its XOFF refresh is that of the one table whose
    frames-only pause family its stats landed in."""
    for table in tables_for(driver):
        if table.xoff_refresh is not None and (driver in ETHTOOL_TABLES or PAUSE_FRAMES_TC in families):
            return table.xoff_refresh
    return None


def lookup_stat(name: str, driver: str | None = None) -> Match | None:
    """The table row of one stat name, None when no table knows it (unclassified)."""
    if "/" in name:  # "<group>/<Stat>": a standard group (ethtool_groups.py), the same for every driver
        return STANDARD_GROUPS.lookup(name)
    for table in tables_for(driver):
        m = table.lookup(name)
        if m is not None:
            return m
    return None


def classify_match(name: str, m: Match | None, allow: tuple[re.Pattern[str], ...] = ()) -> StatClass | None:
    """The export of one stat from its table row: its curated family, else the allowlist, else nothing."""
    rule = m.rule if m is not None else None
    if rule is not None and rule.family is not None:
        return StatClass(rule.family, m.labels(), rule.semantics, rule.scale,  # type: ignore[union-attr]  # rule: m's
                         rule.width)
    if any(p.search(name) for p in allow):
        # Raw, as read: semantics unknown or not curated (some are gauges, some counters).
        return StatClass(ETHTOOL_STAT, (("stat", name),), Semantics.GAUGE)
    return None


def classify_stat(name: str, allow: tuple[re.Pattern[str], ...] = (), driver: str | None = None) -> StatClass | None:
    """Map an ethtool stat name to its metric family through the driver tables; None: not exported."""
    return classify_match(name, lookup_stat(name, driver), allow)


def stat_readings(
    interface: str,
    stats: list[tuple[str, int]],
    classify: Callable[[str], StatClass | None],
    memo: ReadingMemo | None = None,
    labels: dict[tuple[str, str], Labels] | None = None,
) -> list[Reading]:
    """Readings for one interface's stats.  Counters share ``group=interface`` so a
    driver reload (every counter restarting) is recognised as one reset.

    ``memo`` and ``labels`` (kept by the source across polls) reuse the label
    tuples and, for an unchanged value, the Reading itself."""
    out: list[Reading] = []
    if memo is None:
        for name, value in stats:
            cls = classify(name)
            if cls is None:
                continue
            out.append(Reading(
                cls.family, (("interface", interface), *cls.labels), value,
                cls.semantics, cls.width, interface if cls.semantics is not Semantics.GAUGE else "", cls.scale,
            ))
        return out
    if labels is None:
        labels = {}
    mk = memo.get
    for name, value in stats:
        cls = classify(name)
        if cls is None:
            continue
        lab = labels.get((interface, name))
        if lab is None:
            lab = labels[(interface, name)] = (("interface", interface), *cls.labels)
        out.append(mk(cls.family, lab, value, cls.semantics, cls.width,
                      interface if cls.semantics is not Semantics.GAUGE else "", cls.scale))
    return out


# --- the source --------------------------------------------------------------------------


class EthtoolSource:
    """``ethtool`` statistics of every netdev backing an RDMA port, plus configured extras."""

    name = "ethtool"
    # Each interface's ioctl (a firmware command on mlx5) or dump read runs on that interface's own
    # daemon worker with a deadline (guarded_io): a netdev stuck in its driver costs its own series
    # (collector_up 0, /readyz names it), is not asked again until the stuck call returns, and the
    # poll keeps its deadline, so the poller calls it inline.
    self_bounded = True

    def __init__(
        self,
        config: EthtoolConfig | None = None,
        *,
        ethtool_dir: str | None = None,
        ioctl: EthtoolIoctl | None = None,
        groups: EthtoolNetlink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or EthtoolConfig()
        self.timeout = self.config.timeout
        # None: the ioctl on this host; set: <dir>/<if>.txt (fixtures, simulator)
        self.ethtool_dir = ethtool_dir
        self._ioctl = ioctl or EthtoolIoctl()
        # the standard stats groups over ethtool netlink; None once the host showed it has none
        self._groups: EthtoolNetlink | None = groups or EthtoolNetlink()
        self._groups_cache: dict[str, tuple[float, list[tuple[str, int]]]] = {}
        self._groups_reads_left = 0  # per poll: one genetlink round trip at most (~3 ms through pyroute2)
        self._clock = clock
        if self.ethtool_dir is None and groups is None:
            warm_up()
        self._allow = tuple(re.compile(p) for p in self.config.allow)
        # Classification is pure in (driver, name, allowlist): memoised, since the
        # same few hundred names come back every second.  Value: (export, known to a table).
        self._classes: dict[tuple[str, str], tuple[StatClass | None, bool]] = {}
        self._memo = ReadingMemo()
        self._workers = KeyedWorkers("ethtool")
        self._labels: dict[tuple[str, str], Labels] = {}
        self._drivers: dict[str, str] = {}  # interface -> driver name, "" unknown
        self._logged: set[tuple[str, str]] = set()  # (driver, name) logged as unclassified
        self._rejects = RejectCounts(self.name)
        self._errlog = ErrorLog(self.name)

    def _classify(self, driver: str, name: str) -> tuple[StatClass | None, bool]:
        key = (driver, name)
        try:
            return self._classes[key]
        except KeyError:
            if len(self._classes) > 65536:  # drivers and names come and go: keep the cache bounded
                self._classes.clear()
            m = lookup_stat(name, driver or None)
            got = self._classes[key] = (classify_match(name, m, self._allow), m is not None)
            return got

    def _driver(self, interface: str, inventory: Inventory) -> str:
        """The netdev's driver: GDRVINFO on a live host, the sysfs driver link in a fixture tree; "" unknown."""
        drv = self._drivers.get(interface)
        if drv is not None:
            return drv
        drv = ""
        if self.ethtool_dir is None:
            try:
                drv = self._ioctl.driver(interface)
            except OSError:
                drv = ""
        root = getattr(inventory, "sysfs_root", None)
        if not drv and root and valid_ifname(interface):
            try:
                link = os.readlink(os.path.join(root, "class", "net", interface, "device", "driver"))
                drv = os.path.basename(link)
            except OSError:
                drv = ""
        if len(self._drivers) > 4096:
            self._drivers.clear()
        self._drivers[interface] = drv
        return drv

    def _unclassified(self, interface: str, driver: str, stats: list[tuple[str, int]]) -> int:
        """How many stats no driver table knows; each new name logged once at info."""
        unknown = [n for n, _ in stats if not self._classify(driver, n)[1]]
        fresh = [n for n in unknown if (driver, n) not in self._logged]
        if fresh and len(self._logged) < MAX_LOGGED_NAMES:
            self._logged.update((driver, n) for n in fresh)
            _log.info("ethtool_unclassified_stats", interface=interface, driver=driver or "unknown",
                      count=len(fresh), names=fresh[:50])
        return len(unknown)

    def interfaces(self, inventory: Inventory) -> list[str]:
        seen = dict.fromkeys(inventory.netdevs())
        seen.update(dict.fromkeys(self.config.interfaces))
        return list(seen)

    def _read(self, interface: str) -> EthtoolDump | None:
        """Stats of one interface; None when it has none to read (not an error).

        Raises OSError (unreadable) or Rejected (a dump that is too large or
        holds no statistics at all): either costs this interface its series
        and sets its ``fabricmon_ethtool_up`` to 0.
        """
        if self.ethtool_dir is None:
            stats = self._ioctl.read(interface)
            # The ioctl's values are u64 by construction; only repeated names
            # (a driver bug) are dropped so the exposition has no duplicates.
            seen: set[str] = set()
            dups: list[tuple[str, Rejected]] = []
            for n, _ in stats:
                if n in seen:
                    dups.append((n, Rejected("malformed", f"{n} appears twice")))
                seen.add(n)
            if dups:
                kept: dict[str, int] = {}
                for n, v in stats:
                    kept.setdefault(n, v)
                return EthtoolDump(list(kept.items()), dups)
            return EthtoolDump(stats, [])
        if not valid_ifname(interface):  # the name becomes a path: "../x" must not reach open()
            raise Rejected("malformed", f"not a netdev name: {interface[:40]!r}")
        path = os.path.join(self.ethtool_dir, f"{interface}.txt")
        try:
            data = read_bounded(path, MAX_DUMP_BYTES)
        except FileNotFoundError:
            return None  # DESIGN: a missing file for one netdev is not an error (IB netdevs have none)
        dump = parse_ethtool_dump(data.decode("utf-8", "replace"))
        if not dump.stats:
            # A dump with no statistics in it (binary junk, a truncated write,
            # the wrong file) is a failed read, not an interface with nothing to say.
            raise Rejected("malformed", f"{path}: no statistics in {len(data)} bytes")
        return dump

    def _read_groups(self, interface: str, result: SourceResult) -> list[tuple[str, int]]:
        """The standard groups of one netdev: ``<if>.groups.json`` in a fixture tree, ethtool netlink
        on a host (at most every GROUPS_EVERY_S per netdev: the error counters they add need no 1 s
        resolution, and a genetlink round trip through pyroute2 costs more than the ioctl)."""
        if self.ethtool_dir is not None:
            path = os.path.join(self.ethtool_dir, f"{interface}.groups.json")
            try:
                return parse_groups_json(read_bounded(path, MAX_DUMP_BYTES).decode("utf-8", "replace"))
            except FileNotFoundError:
                return []  # optional, like <if>.pfc.txt
            except (OSError, Rejected) as exc:
                if isinstance(exc, Rejected):
                    self._rejects.add(exc.reason)
                result.error(f"{path}: {exc}")
                return []
        if self._groups is None or not self._groups.ready():
            return []
        now = self._clock()
        hit = self._groups_cache.get(interface)
        if hit is not None and (now - hit[0] < GROUPS_EVERY_S or self._groups_reads_left <= 0):
            return hit[1]
        if self._groups_reads_left <= 0:
            return []  # its turn comes in a later poll: the reads are spread, one per poll
        self._groups_reads_left -= 1
        try:
            _, stats = self._groups.read(interface)
        except GroupsUnavailable as exc:
            if exc.errno in (errno.ENOSYS, errno.ENOENT, errno.EPROTONOSUPPORT):
                _log.info("ethtool_groups_unavailable", reason=str(exc))  # this host has none: stop asking
                self._groups = None
            stats = []
        except OSError as exc:
            result.error(f"{interface}: ethtool netlink stats: {exc}")
            stats = []
        if len(self._groups_cache) > 4096:
            self._groups_cache.clear()
        self._groups_cache[interface] = (now, stats)
        return stats

    def poll(self, inventory: Inventory) -> SourceResult:
        result = SourceResult(self.name)
        self._groups_reads_left = 1
        ifaces = self.interfaces(inventory)
        memo = self._memo
        memo.begin()
        if len(self._labels) > 4096:  # interfaces come and go (renames): keep the cache bounded
            self._labels.clear()
        read = 0
        done, blocked = run_all(self._workers, {i: (self._read, (i,)) for i in ifaces}, 0.7 * self.timeout)
        for iface in ifaces:
            if iface in blocked:
                result.stuck.append(iface)
                result.error(f"{iface}: {blocked[iface]}")
                result.readings.append(memo.get(ETHTOOL_UP, (("interface", iface),), 0.0))
                continue
            try:
                dump = done[iface]
                if isinstance(dump, BaseException):
                    raise dump
            except (OSError, Rejected) as exc:  # EthtoolError included: costs this interface only
                if isinstance(exc, Rejected):
                    self._rejects.add(exc.reason)
                result.error(str(exc) if isinstance(exc, EthtoolError) else f"{iface}: {exc}")
                result.readings.append(memo.get(ETHTOOL_UP, (("interface", iface),), 0.0))
                continue
            if dump is None:
                continue
            read += 1
            if dump.rejected:
                for _, rej in dump.rejected:
                    self._rejects.add(rej.reason)
                bad = [(n, r) for n, r in dump.rejected if r.reason != "malformed"]
                if bad:  # not u64 integers: a garbled dump, one error per interface and poll
                    result.error(f"{iface}: {len(bad)} value(s) rejected, first {bad[0][0]}: {bad[0][1]}")
            driver = self._driver(iface, inventory)

            def export(name: str, driver: str = driver) -> StatClass | None:
                return self._classify(driver, name)[0]

            own = stat_readings(iface, dump.stats, export, memo, self._labels)
            result.readings.extend(own)
            group_stats = self._read_groups(iface, result)
            if group_stats:
                # a series the driver's own stats already give keeps the driver's value
                have = {(r.family, r.labels) for r in own}
                result.readings.extend(r for r in stat_readings(iface, group_stats, export, memo, self._labels)
                                       if (r.family, r.labels) not in have)
            result.readings.append(memo.get(ETHTOOL_UP, (("interface", iface),), 1.0))
            refresh = xoff_refresh_for(driver, {r.family for r in own})
            speed = netdev_speed_gbps(inventory.sysfs_root, iface) if refresh is not None else None
            if refresh is not None and speed is not None:  # no speed (link down): no denominator, no series
                result.readings.append(memo.get(
                    XOFF_FULL_RATE, (("interface", iface),), refresh.frames_per_second(speed)))
            result.readings.append(memo.get(
                ETHTOOL_UNCLASSIFIED, (("interface", iface), ("driver", driver or "unknown")),
                self._unclassified(iface, driver, dump.stats + group_stats)))
        result.readings.extend(self._rejects.readings())
        result.readings.append(memo.get("fabricmon_devices_discovered", (("kind", "netdev"),), read))
        memo.commit()
        if result.stuck:
            result.up = False  # not every interface is monitored: say so
        self._ioctl.forget(set(ifaces))
        for name in [n for n in self._drivers if n not in ifaces]:
            del self._drivers[name]  # a netdev that went away may come back with another driver
        self._workers.retire(ifaces)
        if result.messages:
            self._errlog.report(result.messages, self._path_of)
        return result

    def _path_of(self, subject: str) -> str:
        if self.ethtool_dir is None or os.sep in subject:
            return subject
        return os.path.join(self.ethtool_dir, f"{subject}.txt")

    def close(self) -> None:
        self._workers.close()  # never waits for a worker blocked in an ioctl
        self._ioctl.close()
        if self._groups is not None:
            self._groups.close()


def _build(config: EthtoolConfig, context: SourceContext) -> EthtoolSource:
    return EthtoolSource(config, ethtool_dir=context.ethtool_dir)


SOURCE = SourceSpec("ethtool", EthtoolConfig, _build)
