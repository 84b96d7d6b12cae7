"""Lossless-fabric configuration checks of rail NICs against the expected profile.

For every rail port (a NIC with a rail; the frontend NIC has none) the source
emits ``fabricmon_fabric_config_ok{device,interface,check,port}`` = 1 or 0, or
``fabricmon_fabric_config_unknown{...}`` = 1 where the host answers but cannot
tell (see trust below).  ``port`` keeps the two ports of a dual-port HCA apart
(an IB port without IPoIB has no interface to do it); it comes last in the
label tuple because the aggregator reads ``check`` at position 2.

=========  ====================================================================
check      passes when
=========  ====================================================================
pfc        PFC is enabled on *exactly* ``profile.pfc_priorities`` (RoCE only).
           Exact, not "at least the RoCE priority": PFC on an extra (lossy)
           class lets pauses spread to traffic that was meant to drop, which
           is a drift as real as PFC missing.
trust      the trust mode (dscp or pcp) is ``profile.trust`` (RoCE only);
           unknown when dcbnl's IEEE APP table is empty: that is what a VF,
           or a port without DSCP support, answers, and it reads like pcp
ecn_np     ``class/net/<if>/ecn/roce_np/enable/<roce_priority>`` is 1 (RoCE)
ecn_rp     ``class/net/<if>/ecn/roce_rp/enable/<roce_priority>`` is 1 (RoCE)
mtu        ``class/net/<if>/mtu`` >= ``profile.mtu`` (RoCE)
rate       the port rate in Gb/s equals ``profile.rate_gbps``, ACTIVE ports only
width      the port width in lanes equals ``profile.width``, ACTIVE ports: an
           InfiniBand port's from its sysfs rate, a RoCE port's only from ethtool
           netlink link modes (``ETHTOOL_A_LINKMODES_LANES``, link_modes.py): mlx5
           prints an Ethernet port's lane mode in IB terms in the sysfs rate
           (400GAUI-8 as "8X HDR", 200GAUI-2 as "2X NDR"), which checks nothing
=========  ====================================================================

InfiniBand rail ports get rate and width only.  A check whose input does not
exist on this host (no ``.pfc.txt``, no dcbnl support, no MLNX_OFED ``ecn``
directory, a port that is not ACTIVE) emits nothing and counts no error: a
missing fact is not a misconfiguration.  An input that exists but cannot be
read or parsed is one error for that check.

PFC and trust come from ``<ethtool_dir>/<if>.pfc.txt`` (fixtures, simulator)
or, on real hosts, from dcbnl over rtnetlink (``RTM_GETDCB`` /
``DCB_CMD_IEEE_GET``).  Port state and rate ("4: ACTIVE", "400 Gb/sec (4X
NDR)") go through the parsers of ``sources/infiniband.py``, so the two sources
never disagree about a port.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import FabricConfigConfig, ProfileConfig
from ..model import ReadingMemo, SourceResult
from .base_io import read_text
from .ethtool import PfcInfo, parse_pfc_summary
from .infiniband import netdev_speed_gbps, parse_rate, parse_state
from .inventory import Inventory, PortInfo
from .link_modes import LaneCache
from .registry import SourceContext, SourceSpec

FAMILY = "fabricmon_fabric_config_ok"
UNKNOWN_FAMILY = "fabricmon_fabric_config_unknown"
TRUST_UNKNOWN = "unknown"  # PfcInfo.trust when the host answered without saying
_ACTIVE_STATES = (4, 5)  # ACTIVE, ACTIVE_DEFER: the link is up and reports its real rate


# --- pure parsing and checks -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PortFacts:
    """What was found about one port; None marks a fact that is unavailable here."""

    link_layer: str
    state: int | None = None
    rate_gbps: float | None = None
    width: int | None = None
    mtu: int | None = None
    ecn_np: bool | None = None
    ecn_rp: bool | None = None
    pfc: PfcInfo | None = None
    lanes_from_link_modes: bool = False  # width is the netdev's link-mode lanes (RoCE), not the sysfs rate's


def evaluate(facts: PortFacts, profile: ProfileConfig) -> dict[str, bool | None]:
    """Check results for one rail port: True/False, None when the host cannot
    tell (unknown, not drift); a check without its facts is absent."""
    out: dict[str, bool | None] = {}
    roce = facts.link_layer == "Ethernet"
    if roce:
        if facts.pfc is not None and facts.pfc.pfc_enabled is not None:
            out["pfc"] = facts.pfc.pfc_enabled == frozenset(profile.pfc_priorities)
        if facts.pfc is not None and facts.pfc.trust is not None:
            out["trust"] = None if facts.pfc.trust == TRUST_UNKNOWN else facts.pfc.trust == profile.trust
        if facts.ecn_np is not None:
            out["ecn_np"] = facts.ecn_np
        if facts.ecn_rp is not None:
            out["ecn_rp"] = facts.ecn_rp
        if facts.mtu is not None:
            out["mtu"] = facts.mtu >= profile.mtu
    # A port that is not ACTIVE reports a fallback rate (or none); link state has its own metric.
    if facts.state in _ACTIVE_STATES:
        if facts.rate_gbps is not None:
            out["rate"] = abs(facts.rate_gbps - profile.rate_gbps) < 1e-6
        if facts.width is not None and (not roce or facts.lanes_from_link_modes):
            out["width"] = facts.width == profile.width
    return out


# --- dcbnl over rtnetlink ------------------------------------------------------------------

NETLINK_ROUTE = 0
RTM_GETDCB = 78
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 1
DCB_CMD_IEEE_GET = 21
DCB_ATTR_IFNAME = 1
DCB_ATTR_IEEE = 13
DCB_ATTR_IEEE_PFC = 2
DCB_ATTR_IEEE_APP_TABLE = 3
DCB_ATTR_IEEE_APP = 1
IEEE_8021QAZ_APP_SEL_DSCP = 5


class DcbUnavailable(Exception):
    """dcbnl cannot answer for this interface (driver without DCB, no such device, no netlink)."""


def _attrs(data: bytes) -> dict[int, bytes]:
    """Top-level rtattrs of ``data`` (type -> payload), nested flag bits masked off."""
    out: dict[int, bytes] = {}
    off = 0
    while off + 4 <= len(data):
        length, atype = struct.unpack_from("=HH", data, off)
        if length < 4 or off + length > len(data):
            break
        out.setdefault(atype & 0x3FFF, data[off + 4: off + length])
        off += (length + 3) & ~3
    return out


def _attr_list(data: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    off = 0
    while off + 4 <= len(data):
        length, atype = struct.unpack_from("=HH", data, off)
        if length < 4 or off + length > len(data):
            break
        out.append((atype & 0x3FFF, data[off + 4: off + length]))
        off += (length + 3) & ~3
    return out


def parse_dcb_ieee(payload: bytes) -> PfcInfo:
    """Parse the attributes of an RTM_GETDCB/DCB_CMD_IEEE_GET reply (after struct dcbmsg).

    PFC: ``struct ieee_pfc.pfc_en`` bitmap.  Trust: dcbnl has no trust
    attribute on most kernels; mlx5 keeps the DSCP-to-priority map in the
    IEEE APP table (selector 5) exactly while trust is dscp, so any DSCP
    entry means dscp and a table with other entries but none for DSCP means
    pcp.  An empty table is what a VF or a port without DSCP support answers
    (dcbnl_ieee_fill always nests the table): that is "unknown", not pcp.
    """
    ieee = _attrs(payload).get(DCB_ATTR_IEEE)
    if ieee is None:
        return PfcInfo(None, None)
    nested = _attrs(ieee)
    enabled: frozenset[int] | None = None
    pfc = nested.get(DCB_ATTR_IEEE_PFC)
    if pfc is not None and len(pfc) >= 2:
        bits = pfc[1]
        enabled = frozenset(p for p in range(8) if bits & (1 << p))
    trust: str | None = None
    table = nested.get(DCB_ATTR_IEEE_APP_TABLE)
    if table is not None:
        trust = "pcp" if _attr_list(table) else TRUST_UNKNOWN
        for atype, app in _attr_list(table):
            if atype == DCB_ATTR_IEEE_APP and len(app) >= 1 and app[0] == IEEE_8021QAZ_APP_SEL_DSCP:
                trust = "dscp"
                break
    return PfcInfo(trust, enabled)


def _rta(atype: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, atype) + payload + b"\0" * ((-length) & 3)


def read_dcb(interface: str, timeout: float = 0.2) -> PfcInfo:
    """PFC and trust of ``interface`` from dcbnl.  Raises DcbUnavailable when there is none.

    Best effort by design: veth, lo and most non-DCB drivers answer
    EOPNOTSUPP, which is "no information", never an error.
    """
    msg_body = struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0) + _rta(
        DCB_ATTR_IFNAME, interface.encode() + b"\0"
    )
    seq = int(time.monotonic_ns() & 0x7FFFFFFF) or 1
    msg = struct.pack("=IHHII", 16 + len(msg_body), RTM_GETDCB, NLM_F_REQUEST, seq, 0) + msg_body
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    except OSError as exc:  # no netlink (odd sandboxes)
        raise DcbUnavailable(f"{interface}: dcbnl: {exc}") from None
    try:
        sock.settimeout(timeout)
        sock.bind((0, 0))
        sock.send(msg)
        for _ in range(8):  # bounded: the kernel answers one message (or an error)
            data = sock.recv(65536)
            off = 0
            while off + 16 <= len(data):
                length, mtype, _flags, mseq, _pid = struct.unpack_from("=IHHII", data, off)
                if length < 16:
                    break
                body = data[off + 16: off + length]
                off += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body, 0)[0] if len(body) >= 4 else errno.EIO
                    raise DcbUnavailable(f"{interface}: dcbnl: {os.strerror(code) if code else 'no reply'}")
                if mtype == NLMSG_DONE:
                    raise DcbUnavailable(f"{interface}: dcbnl: empty reply")
                if mtype == RTM_GETDCB:
                    return parse_dcb_ieee(body[4:])  # skip struct dcbmsg
        raise DcbUnavailable(f"{interface}: dcbnl: no reply")
    except OSError as exc:  # timeout, EPERM in a locked-down namespace
        raise DcbUnavailable(f"{interface}: dcbnl: {exc}") from None
    finally:
        sock.close()


# --- the source ------------------------------------------------------------------------------


class _Unavailable(Exception):
    """Internal: the fact does not exist on this host (no series, no error)."""


def _read_file(path: str) -> str:
    try:
        return read_text(path)
    except FileNotFoundError:
        raise _Unavailable(path) from None


class FabricConfigSource:
    """Checks every rail port against the lossless profile (see module docstring)."""

    name = "fabric_config"

    def __init__(
        self,
        config: FabricConfigConfig | None = None,
        *,
        profile: ProfileConfig | None = None,
        ethtool_dir: str | None = None,
        dcb_reader: Callable[[str], PfcInfo] = read_dcb,
        dcb_cache_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        lanes: LaneCache | None = None,
    ) -> None:
        self.config = config or FabricConfigConfig()
        self.profile = profile or ProfileConfig()
        self.timeout = self.config.timeout
        # None: dcbnl on this host; set: <dir>/<if>.pfc.txt (fixtures, simulator)
        self.ethtool_dir = ethtool_dir
        self._dcb_reader = dcb_reader
        # dcbnl GETs on mlx5 become firmware register reads; config drifts on
        # a scale of minutes, so a real host asks at most every few seconds.
        self._dcb_cache_seconds = dcb_cache_seconds
        self._dcb_cache: dict[str, tuple[float, PfcInfo | None]] = {}
        self._clock = clock
        # Ethernet lanes from ethtool netlink link modes (a live host; None: the sysfs rate's lanes)
        self._lanes = lanes
        self._memo = ReadingMemo()
        self._labels: dict[tuple[str, str, str, str], tuple] = {}

    def _pfc_info(self, interface: str) -> PfcInfo | None:
        if self.ethtool_dir is not None:
            try:
                with open(os.path.join(self.ethtool_dir, f"{interface}.pfc.txt"), encoding="utf-8") as fh:
                    parsed = parse_pfc_summary(fh.read())
            except FileNotFoundError:
                return None
            if parsed.trust is None and parsed.pfc_enabled is None:
                raise ValueError(f"{interface}.pfc.txt: neither a trust state nor a PFC table")
            return parsed
        now = self._clock()
        hit = self._dcb_cache.get(interface)
        if hit is not None and now - hit[0] < self._dcb_cache_seconds:
            return hit[1]
        try:
            info: PfcInfo | None = self._dcb_reader(interface)
        except DcbUnavailable:
            info = None
        self._dcb_cache[interface] = (now, info)
        return info

    def port_facts(self, port: PortInfo, sysfs_root: str, result: SourceResult) -> PortFacts:
        """Gather the facts of one port; unreadable ones become one error each."""
        values: dict[str, Any] = {}  # each fact as its reader returned it (PortFacts types them)

        def fact(name: str, fn: Callable[[], object]) -> None:
            try:
                values[name] = fn()
            except _Unavailable:
                pass
            except (OSError, ValueError) as exc:
                result.error(f"{port.device}/{port.port}: {name}: {exc}")

        def state() -> int:
            return parse_state(_read_file(os.path.join(port.path, "state")))[0]

        fact("state", state)
        if values.get("state") in _ACTIVE_STATES:
            def rate() -> tuple[float, int, bool]:
                # an Ethernet port's speed is its netdev's (a stale sysfs rate must not read as drift),
                # its lanes those of its link modes; the sysfs rate is the fallback for both
                speed = netdev_speed_gbps(sysfs_root, port.netdev) if port.link_layer == "Ethernet" else None
                lanes = self._lanes.lanes(port.netdev, speed) if self._lanes is not None and speed else None
                try:
                    parsed = parse_rate(_read_file(os.path.join(port.path, "rate")))
                except (OSError, ValueError):
                    if speed is None:
                        raise
                    return speed, lanes or 0, lanes is not None
                if speed is not None and abs(parsed.gbps - speed) >= 1e-6:
                    return speed, lanes or 0, lanes is not None  # the sysfs lanes are as stale as its rate
                if lanes is not None:
                    return parsed.gbps, lanes, True
                return parsed.gbps, parsed.width_lanes, False

            fact("rate", rate)
        rate_fact = values.get("rate")
        gbps, width, from_modes = rate_fact if isinstance(rate_fact, tuple) else (None, None, False)

        if port.link_layer == "Ethernet" and port.netdev:
            net = os.path.join(sysfs_root, "class", "net", port.netdev)
            prio = str(self.profile.roce_priority)

            def flag(kind: str) -> Callable[[], bool]:
                def read() -> bool:
                    text = _read_file(os.path.join(net, "ecn", kind, "enable", prio))
                    if text not in ("0", "1"):
                        raise ValueError(f"{kind}/enable/{prio}: not 0 or 1: {text[:20]!r}")
                    return text == "1"
                return read

            fact("mtu", lambda: int(_read_file(os.path.join(net, "mtu"))))
            fact("ecn_np", flag("roce_np"))
            fact("ecn_rp", flag("roce_rp"))
            fact("pfc", lambda: self._pfc_info(port.netdev))
        return PortFacts(
            link_layer=port.link_layer,
            state=values.get("state"),
            rate_gbps=gbps,
            width=width,
            lanes_from_link_modes=from_modes,
            mtu=values.get("mtu"),  # type: ignore[arg-type]
            ecn_np=values.get("ecn_np"),  # type: ignore[arg-type]
            ecn_rp=values.get("ecn_rp"),  # type: ignore[arg-type]
            pfc=values.get("pfc"),  # type: ignore[arg-type]
        )

    def poll(self, inventory: Inventory) -> SourceResult:
        result = SourceResult(self.name)
        memo = self._memo
        memo.begin()
        labels = self._labels
        if len(labels) > 4096:  # devices and netdevs come and go: keep the cache bounded
            labels.clear()
        for port in inventory.ports:
            if not port.rail:
                continue  # the profile is for rail NICs; a frontend NIC has its own settings
            if port.link_layer not in ("Ethernet", "InfiniBand"):
                continue
            facts = self.port_facts(port, inventory.sysfs_root, result)
            for check, ok in evaluate(facts, self.profile).items():
                key = (port.device, port.port, port.netdev, check)
                lab = labels.get(key)
                if lab is None:
                    lab = labels[key] = (("device", port.device), ("interface", port.netdev), ("check", check),
                                         ("port", port.port))
                if ok is None:
                    result.readings.append(memo.get(UNKNOWN_FAMILY, lab, 1.0))
                else:
                    result.readings.append(memo.get(FAMILY, lab, 1.0 if ok else 0.0))
        memo.commit()
        return result

    def close(self) -> None:
        self._dcb_cache.clear()
        if self._lanes is not None:
            self._lanes.close()


def _build(config: FabricConfigConfig, context: SourceContext) -> FabricConfigSource:
    # a live host (no --ethtool-dir): lanes from ethtool netlink link modes
    lanes = LaneCache() if context.ethtool_dir is None else None
    return FabricConfigSource(config, profile=context.profile, ethtool_dir=context.ethtool_dir, lanes=lanes)


SOURCE = SourceSpec("fabric_config", FabricConfigConfig, _build)
