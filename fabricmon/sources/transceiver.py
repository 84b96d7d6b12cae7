"""Transceiver (module) diagnostics: temperature, Vcc, per-lane TX bias, TX and RX optical power, and
the module's own alarm/warning flags, from the module EEPROM.

Pure parsers (``parse_module``, ``parse_sff8636``, ``parse_cmis``) take the raw bytes; the thin I/O
(``ModuleEepromIoctl``, ``read_module_file``, ``ModuleReader``) fetches them.

Memory layouts (offsets are bytes of the 256-byte address space: 0-127 lower page, 128-255 the
selected upper page):

SFF-8636 rev 2.10a (QSFP+/QSFP28, identifier 0Ch/0Dh/11h), lower page 00h:
  Table 6-2  byte 0 identifier; byte 2 bit 2 Flat_mem (no upper pages)
  Table 6-4  bytes 3-5 channel status flags: byte 3 L-Tx LOS (bits 7-4, ch 4..1) and L-Rx LOS (bits 3-0)
  Table 6-5  byte 6 temperature flags (bit 7 high alarm, 6 low alarm, 5 high warning, 4 low warning),
             byte 7 Vcc flags (same bits)
  Table 6-6  bytes 9-10 Rx power flags, 11-12 Tx bias flags, 13-14 Tx power flags: two channels per byte,
             ch 1 (and 3) in bits 7-4, ch 2 (and 4) in bits 3-0, each nibble high alarm, low alarm,
             high warning, low warning
  Table 6-7  bytes 22-23 temperature (signed, 1/256 C), bytes 26-27 Vcc (unsigned, 100 uV)
  Table 6-8  bytes 34-41 Rx power ch 1-4 (0.1 uW), 42-49 Tx bias ch 1-4 (2 uA), 50-57 Tx power (0.1 uW)

OIF CMIS 5.2 (QSFP-DD/OSFP, identifier 18h/19h and others declaring CMIS), lower memory:
  Table 8-4  byte 2 bit 7 MemoryModel (1: flat, no upper pages)
  Table 8-9  byte 9 module flags: bit 0 L-TempMonHighAlarm, 1 low alarm, 2 high warning, 3 low warning,
             bit 4 L-VccMonHighAlarm, 5 low alarm, 6 high warning, 7 low warning
  Table 8-10 bytes 14-15 TempMonValue (signed, 1/256 C), bytes 16-17 VccMonVoltage (unsigned, 100 uV)
Page 11h (lane dynamic status, bank 0 = lanes 1-8):
  Table 8-80 bytes 135 L-TxFailure, 136 L-TxLOS, 139-142 Tx power high/low alarm, high/low warning,
             143-146 Tx bias flags (same order); Table 8-81 147 L-RxLOS, 149-152 Rx power flags;
             bit i = lane i+1
  Table 8-82 bytes 154-169 TxPower lanes 1-8 (0.1 uW), 170-185 TxBias (2 uA, times the multiplier of
             page 01h byte 160 bits 4-3), 186-201 RxPower (0.1 uW)

The raw bytes a fixture or the simulator writes (``ethtool/<if>.module.bin``) and what the ioctl
returns are the same image: 128-byte blocks, lower page first, then upper page 00h; a CMIS image
carries pages 01h, 02h, 10h and 11h after it (640 + 128 bytes, ``CMIS_IMAGE_PAGES``).  The legacy
ioctl (ETHTOOL_GMODULEEEPROM) gives at most lower + 00h for CMIS modules on most drivers: module
readings then come without lanes (temperature, Vcc, module flags only).
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import TransceiverConfig
from ..model import Reading, SourceResult
from .errorlog import ErrorLog
from .ethtool import SIOCETHTOOL, EthtoolError, _ifreq
from .inventory import Inventory
from .registry import SourceContext, SourceSpec

ETHTOOL_GMODULEINFO = 0x00000042
ETHTOOL_GMODULEEEPROM = 0x00000043
# include/uapi/linux/ethtool.h ETH_MODULE_* types
ETH_MODULE_SFF_8079 = 0x1
ETH_MODULE_SFF_8472 = 0x2
ETH_MODULE_SFF_8636 = 0x3
ETH_MODULE_SFF_8436 = 0x4
MAX_EEPROM = 4096  # a bounded read: no module image is larger than a few pages

SFF8636_IDS = frozenset({0x0C, 0x0D, 0x11})
# SFF-8024 identifiers of modules managed through CMIS (QSFP-DD 18h, OSFP 19h, SFP-DD 1Ah, DSFP 1Bh,
# QSFP+ with CMIS 1Eh, SFP+ with CMIS 1Fh, ...)
CMIS_IDS = frozenset({0x18, 0x19, 0x1A, 0x1B, 0x1E, 0x1F, 0x20, 0x21})
PAGE = 128
CMIS_IMAGE_PAGES = (0x00, 0x01, 0x02, 0x10, 0x11)  # upper pages after the lower page, in file order


class ModuleFormatError(ValueError):
    """The bytes are not a module image this parser knows."""


@dataclass(frozen=True)
class LaneReading:
    lane: int  # 0-based
    rx_power_w: float | None
    tx_power_w: float | None
    tx_bias_a: float | None
    flags: tuple[str, ...] = ()  # e.g. ("rx_power_low_warning", "rx_los")


@dataclass(frozen=True)
class ModuleReading:
    spec: str  # sff8636 | cmis
    identifier: int
    temperature_c: float | None
    vcc_v: float | None
    lanes: tuple[LaneReading, ...] = ()
    flags: tuple[str, ...] = ()  # module-level flags

    def alarm_count(self) -> int:
        return sum(1 for f in self.all_flags() if f.endswith("_alarm") or f.endswith("_los"))

    def all_flags(self) -> list[str]:
        return list(self.flags) + [f for ln in self.lanes for f in ln.flags]


def _u16(b: bytes, off: int) -> int:
    return (b[off] << 8) | b[off + 1]


def _s16(b: bytes, off: int) -> int:
    v = _u16(b, off)
    return v - 0x10000 if v & 0x8000 else v


# order of the four flags in a nibble (SFF-8636) or in four consecutive bytes (CMIS)
_AW = ("high_alarm", "low_alarm", "high_warning", "low_warning")


def parse_sff8636(b: bytes) -> ModuleReading:
    if len(b) < PAGE:
        raise ModuleFormatError(f"SFF-8636 lower page needs 128 bytes, got {len(b)}")
    flags: list[str] = []
    for off, what in ((6, "temperature"), (7, "vcc")):
        for i, name in enumerate(_AW):
            if b[off] & (0x80 >> i):
                flags.append(f"{what}_{name}")
    lanes = []
    for ch in range(4):
        lf: list[str] = []
        if b[3] & (0x10 << ch):
            lf.append("tx_los")
        if b[3] & (0x01 << ch):
            lf.append("rx_los")
        for base, what in ((9, "rx_power"), (11, "tx_bias"), (13, "tx_power")):
            byte = b[base + ch // 2]
            nib = (byte >> 4) if ch % 2 == 0 else (byte & 0x0F)
            for i, name in enumerate(_AW):
                if nib & (0x8 >> i):
                    lf.append(f"{what}_{name}")
        lanes.append(LaneReading(
            ch,
            rx_power_w=_u16(b, 34 + 2 * ch) * 1e-7,
            tx_bias_a=_u16(b, 42 + 2 * ch) * 2e-6,
            tx_power_w=_u16(b, 50 + 2 * ch) * 1e-7,
            flags=tuple(lf)))
    return ModuleReading("sff8636", b[0], _s16(b, 22) / 256.0, _u16(b, 26) * 1e-4, tuple(lanes), tuple(flags))


def _cmis_page(b: bytes, page: int) -> bytes | None:
    """The 128 bytes of upper page ``page`` in an image laid out as CMIS_IMAGE_PAGES, or None."""
    if b[2] & 0x80:  # flat memory: lower page + page 00h only
        return None
    try:
        idx = CMIS_IMAGE_PAGES.index(page)
    except ValueError:
        return None
    start = PAGE * (1 + idx)
    if len(b) < start + PAGE:
        return None
    return b[start:start + PAGE]


def parse_cmis(b: bytes, lanes: int = 8) -> ModuleReading:
    if len(b) < PAGE:
        raise ModuleFormatError(f"CMIS lower memory needs 128 bytes, got {len(b)}")
    flags = []
    for i, name in enumerate(_AW):
        if b[9] & (1 << i):
            flags.append(f"temperature_{name}")
        if b[9] & (0x10 << i):
            flags.append(f"vcc_{name}")
    temp = _s16(b, 14) / 256.0
    vcc = _u16(b, 16) * 1e-4
    p11 = _cmis_page(b, 0x11)
    out: list[LaneReading] = []
    if p11 is not None:
        p01 = _cmis_page(b, 0x01)
        # page 01h byte 160 bits 4-3: Tx bias multiplier 1, 2 or 4 (Table 8-43)
        mult = 1 << ((p01[160 - PAGE] >> 3) & 0x3) if p01 is not None else 1

        def at(absolute: int) -> int:
            return p11[absolute - PAGE]

        for ln in range(lanes):
            bit = 1 << ln
            lf: list[str] = []
            if at(135) & bit:
                lf.append("tx_failure")
            if at(136) & bit:
                lf.append("tx_los")
            if at(147) & bit:
                lf.append("rx_los")
            for base, what in ((139, "tx_power"), (143, "tx_bias"), (149, "rx_power")):
                for i, name in enumerate(_AW):
                    if at(base + i) & bit:
                        lf.append(f"{what}_{name}")
            out.append(LaneReading(
                ln,
                rx_power_w=_u16(p11, 186 - PAGE + 2 * ln) * 1e-7,
                tx_power_w=_u16(p11, 154 - PAGE + 2 * ln) * 1e-7,
                tx_bias_a=_u16(p11, 170 - PAGE + 2 * ln) * 2e-6 * mult,
                flags=tuple(lf)))
    return ModuleReading("cmis", b[0], temp, vcc, tuple(out), tuple(flags))


def parse_module(b: bytes) -> ModuleReading:
    """A module image (SFF-8636 or CMIS, told by the SFF-8024 identifier in byte 0)."""
    if not b:
        raise ModuleFormatError("empty module image")
    ident = b[0]
    if ident in SFF8636_IDS:
        return parse_sff8636(b)
    if ident in CMIS_IDS:
        return parse_cmis(b)
    raise ModuleFormatError(f"identifier {ident:#04x} is neither SFF-8636 nor CMIS")


def watts_to_dbm(w: float | None) -> float | None:
    if w is None or w <= 0:
        return None
    return 10.0 * math.log10(w * 1e3)


# --- I/O ---------------------------------------------------------------------------------


class ModuleEepromIoctl:
    """ETHTOOL_GMODULEINFO + ETHTOOL_GMODULEEEPROM through SIOCETHTOOL (needs CAP_NET_ADMIN)."""

    def __init__(self) -> None:
        import socket

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def close(self) -> None:
        self._sock.close()

    def _ioctl(self, interface: str, op: str, buf: ctypes.Array) -> None:
        import fcntl

        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, _ifreq(interface, buf))
        except OSError as exc:
            raise EthtoolError(interface, op, exc.errno or errno.EIO) from None

    def read(self, interface: str) -> bytes:
        # struct ethtool_modinfo: cmd, type, eeprom_len, reserved[8]
        info = ctypes.create_string_buffer(44)
        struct.pack_into("=I", info, 0, ETHTOOL_GMODULEINFO)
        self._ioctl(interface, "GMODULEINFO", info)
        _cmd, _type, length = struct.unpack_from("=III", info, 0)
        length = min(length, MAX_EEPROM)
        if length <= 0:
            raise EthtoolError(interface, "GMODULEINFO", errno.ENODATA)
        # struct ethtool_eeprom: cmd, magic, offset, len, then data[len]
        buf = ctypes.create_string_buffer(16 + length)
        struct.pack_into("=IIII", buf, 0, ETHTOOL_GMODULEEEPROM, 0, 0, length)
        self._ioctl(interface, "GMODULEEEPROM", buf)
        return bytes(buf.raw[16:16 + length])


def read_module_file(ethtool_dir: str, interface: str) -> bytes | None:
    """``<dir>/<if>.module.bin`` (fixtures and simulation); None when there is none."""
    path = os.path.join(ethtool_dir, f"{interface}.module.bin")
    try:
        with open(path, "rb") as f:
            return f.read(MAX_EEPROM + 1)[:MAX_EEPROM]
    except FileNotFoundError:
        return None


@dataclass
class ModuleSnapshot:
    """The last readings per interface, with the time they were taken; errors by interface."""

    taken_at: float = 0.0
    readings: dict[str, ModuleReading] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    denied: set[str] = field(default_factory=set)  # interfaces whose read the kernel refused (EPERM)


# Why module EEPROM reads are refused, for the log and /metrics: the kernel checks CAP_NET_ADMIN in
# the effective set (net/ethtool/ioctl.c: ETHTOOL_GMODULEEEPROM is not on the unprivileged list), and
# a non-root process never gets an added capability into its effective set without ambient
# capabilities, which container runtimes do not set: the agent must run as uid 0 with NET_ADMIN.
DENIED_REASON = ("module EEPROM reads refused (EPERM): they need CAP_NET_ADMIN, which a non-root agent "
                 "never holds; run it as uid 0 with capabilities drop ALL, add NET_ADMIN "
                 "(deploy/kubernetes/overlays/optics) or turn sources.transceiver off")


def _denied(exc: OSError) -> bool:
    return exc.errno in (errno.EPERM, errno.EACCES)


class ModuleReader:
    """Reads every interface's module on its own thread at a slow interval (30-60 s): a module read is
    an I2C transaction of tens to hundreds of milliseconds and must never delay the 1 s poll, which
    takes ``snapshot()`` (the last complete read) instead."""

    def __init__(self, interfaces: Callable[[], list[str]], read: Callable[[str], bytes | None],
                 interval_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self._interfaces = interfaces
        self._read = read
        self.interval_s = interval_s
        self._clock = clock
        self._snap = ModuleSnapshot()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_once(self) -> ModuleSnapshot:
        snap = ModuleSnapshot(taken_at=self._clock())
        for ifname in self._interfaces():
            try:
                raw = self._read(ifname)
                if raw is None:
                    continue
                snap.readings[ifname] = parse_module(raw)
            except (OSError, ModuleFormatError) as exc:
                # one bad module costs its own readings only
                snap.errors[ifname] = str(exc)
                if isinstance(exc, OSError) and _denied(exc):
                    snap.denied.add(ifname)
        with self._lock:
            self._snap = snap
        return snap

    def snapshot(self) -> ModuleSnapshot:
        with self._lock:
            return self._snap

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fabricmon-transceiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval_s)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


# --- the agent source ------------------------------------------------------------------------


def module_readings(device: str, port: str, m: ModuleReading, age_s: float) -> list[Reading]:
    """Gauges of one port's module (metrics.SPECS fabricmon_transceiver_*)."""
    dp = (("device", device), ("port", port))
    out: list[Reading] = []
    if m.temperature_c is not None:
        out.append(Reading("fabricmon_transceiver_temperature_celsius", dp, m.temperature_c))
    if m.vcc_v is not None:
        out.append(Reading("fabricmon_transceiver_supply_voltage_volts", dp, m.vcc_v))
    out.append(Reading("fabricmon_transceiver_reading_age_seconds", dp, max(0.0, age_s)))
    for flag in m.flags:
        out.append(Reading("fabricmon_transceiver_flag", dp + (("lane", ""), ("flag", flag)), 1.0))
    for ln in m.lanes:
        lab = dp + (("lane", str(ln.lane)),)
        for fam, v in (("fabricmon_transceiver_rx_power_watts", ln.rx_power_w),
                       ("fabricmon_transceiver_tx_power_watts", ln.tx_power_w),
                       ("fabricmon_transceiver_tx_bias_amperes", ln.tx_bias_a)):
            if v is not None:
                out.append(Reading(fam, lab, v))
        for flag in ln.flags:
            out.append(Reading("fabricmon_transceiver_flag", lab + (("flag", flag),), 1.0))
    return out


def _module_netdev(port, inventory: Inventory) -> str:
    """The netdev whose module EEPROM is this port's: the port's own (RoCE), else the PCI function's
    only netdev (IPoIB on an IB port).  A port with neither has no readable module here."""
    if port.netdev:
        return port.netdev
    for d in inventory.devices:
        if d.name == port.device and len(d.netdevs) == 1:
            return d.netdevs[0]
    return ""


class TransceiverSource:
    """Serves the last module snapshot to the 1 s poll; never reads a module itself.

    Real hosts: a ``ModuleReader`` thread reads every port's module through the ioctl every
    ``sources.transceiver.interval`` seconds.  Fixtures and simulation (``ethtool_dir`` set): the
    ``<if>.module.bin`` files are read on the poll (a small file read; the simulator rewrites
    them at the module cadence), so simulated runs stay deterministic.
    """

    name = "transceiver"
    self_bounded = True  # poll only copies a snapshot

    def __init__(self, config: TransceiverConfig | None = None, *, ethtool_dir: str | None = None,
                 ioctl: ModuleEepromIoctl | None = None, clock: Callable[[], float] = time.time) -> None:
        self.interval = (config or TransceiverConfig()).interval
        self.timeout = 1.0
        self.ethtool_dir = ethtool_dir
        self._clock = clock
        self._ports: list[tuple[str, str, str]] = []  # (device, port, netdev) of the last inventory
        self._lock = threading.Lock()
        self._ioctl = ioctl
        self._reader: ModuleReader | None = None
        self._errlog = ErrorLog(self.name)

    def _netdevs(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(n for _, _, n in self._ports if n))

    def _read_ioctl(self, ifname: str) -> bytes | None:
        if self._ioctl is None:
            self._ioctl = ModuleEepromIoctl()
        try:
            return self._ioctl.read(ifname)
        except EthtoolError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENODATA):
                return None  # no pluggable module (a backplane port, a driver without module access)
            raise

    def poll(self, inventory: Inventory) -> SourceResult:
        result = SourceResult(self.name)
        ports = [(p.device, p.port, _module_netdev(p, inventory)) for p in inventory.ports]
        with self._lock:
            self._ports = ports
        if self.ethtool_dir is not None:
            snap = ModuleSnapshot(taken_at=self._clock())
            for ifname in self._netdevs():
                try:
                    raw = read_module_file(self.ethtool_dir, ifname)
                    if raw is not None:
                        snap.readings[ifname] = parse_module(raw)
                except (OSError, ModuleFormatError) as exc:
                    snap.errors[ifname] = str(exc)
            age = 0.0
        else:
            if self._reader is None:
                self._reader = ModuleReader(self._netdevs, self._read_ioctl, self.interval, self._clock)
                self._reader.start()
            snap = self._reader.snapshot()
            age = self._clock() - snap.taken_at
        denied = snap.denied & set(snap.errors)
        if denied and not snap.readings:
            # Not one module readable and the kernel said why: the whole source is down, with that reason.
            result.up = False
            result.error(DENIED_REASON)
            for ifname, msg in snap.errors.items():
                if ifname not in denied:
                    result.error(f"{ifname}: module: {msg}")
        else:
            for ifname, msg in snap.errors.items():
                result.error(f"{ifname}: module: {msg}")
        self._errlog.report(result.messages)
        # Only while reads are refused: other failures are fabricmon_collector_errors_total already.
        if denied:
            result.readings.append(Reading("fabricmon_transceiver_modules_unreadable",
                                           (("reason", "permission"),), float(len(denied))))
        for device, port, ifname in ports:
            m = snap.readings.get(ifname)
            if m is not None:
                result.readings.extend(module_readings(device, port, m, age))
        return result

    def close(self) -> None:
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        if self._ioctl is not None:
            self._ioctl.close()
            self._ioctl = None


def _build(config: TransceiverConfig, context: SourceContext) -> TransceiverSource:
    return TransceiverSource(config, ethtool_dir=context.ethtool_dir)


SOURCE = SourceSpec("transceiver", TransceiverConfig, _build)
