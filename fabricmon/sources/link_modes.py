"""A netdev's speed and lane count from ethtool netlink link modes (``ETHTOOL_MSG_LINKMODES_GET``).

The lane count of an Ethernet port is ``ETHTOOL_A_LINKMODES_LANES`` (kernel 5.11+, "ethtool: Add
lanes parameter", net/ethtool/linkmodes.c ``linkmodes_fill_reply``); 0 or absent means the driver
does not say (veth).  The RDMA port's sysfs ``rate`` ("100 Gb/sec (4X EDR)") carries a lane count
too, but older kernels print a 400 GbE port's rate stale, and its lanes with it: the sources
(infiniband.py, fabric_config.py) take the speed from ``/sys/class/net/<if>/speed``, the lanes from
here, and the sysfs rate's lanes only when link modes have none and the rate agrees with the speed.

pyroute2 (the library the standard statistics groups are read with, ethtool_groups.py) has the
message, up to ``DUPLEX``; its later attributes are declared below in the order of
include/uapi/linux/ethtool_netlink.h.  Replies are read with compact bitsets
(``ETHTOOL_FLAG_COMPACT_BITSETS``): the link-mode masks are not read.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ethtool_groups import EthtoolNetlink as _GroupsReader
from .ethtool_groups import GroupsUnavailable, warm_up

ETHTOOL_MSG_LINKMODES_GET = 4  # position in the ETHTOOL_MSG_* user enum
ETHTOOL_FLAG_COMPACT_BITSETS = 1
SPEED_UNKNOWN = 0xFFFFFFFF  # (u32)-1, as the kernel puts it
MAX_LANES = 8  # ETHTOOL_A_LINKMODES_LANES is validated 1..8 on SET (linkmodes.c)


@dataclass(frozen=True, slots=True)
class LinkModes:
    """What link modes say of a netdev: speed in Mb/s and lanes, None where the driver does not say."""

    speed_mbps: int | None
    lanes: int | None


def _message_class() -> Any:  # pragma: no cover - imported lazily: pyroute2 is needed only on a live host
    from pyroute2.netlink.generic.ethtool import ethtool_linkmode_msg

    class linkmodes_msg(ethtool_linkmode_msg):
        nla_map = (*ethtool_linkmode_msg.nla_map,
                   ("ETHTOOL_A_LINKMODES_MASTER_SLAVE_CFG", "uint8"),
                   ("ETHTOOL_A_LINKMODES_MASTER_SLAVE_STATE", "uint8"),
                   ("ETHTOOL_A_LINKMODES_LANES", "uint32"),
                   ("ETHTOOL_A_LINKMODES_RATE_MATCHING", "uint8"))

    return linkmodes_msg


def from_message(msg: Any) -> LinkModes:
    """The speed and lanes of one decoded ``ETHTOOL_MSG_LINKMODES_GET_REPLY``."""
    speed = msg.get_attr("ETHTOOL_A_LINKMODES_SPEED")
    lanes = msg.get_attr("ETHTOOL_A_LINKMODES_LANES")
    return LinkModes(
        int(speed) if isinstance(speed, int) and 0 < speed < SPEED_UNKNOWN else None,
        int(lanes) if isinstance(lanes, int) and 0 < lanes <= MAX_LANES else None,
    )


def decode_reply(data: bytes) -> LinkModes:
    """A reply as the kernel sent it (netlink header included): a recorded one, in tests."""
    msg = _message_class()(data)
    msg.decode()
    return from_message(msg)


class EthtoolLinkModes(_GroupsReader):
    """``ETHTOOL_MSG_LINKMODES_GET`` over one generic-netlink socket (the groups reader's socket code)."""

    def _socket(self) -> Any:
        if self._sock is None:
            try:
                from pyroute2.netlink.generic import GenericNetlinkSocket
            except ImportError:
                raise GroupsUnavailable(errno.ENOSYS, "pyroute2 is not installed") from None
            msg = _message_class()
            sock = GenericNetlinkSocket()
            try:
                sock.bind("ethtool", msg)
            except Exception as exc:  # no ethtool genl family (kernel < 5.6)
                sock.close()
                raise GroupsUnavailable(errno.ENOENT, f"no ethtool netlink family: {exc}") from None
            self._sock, self._msg = sock, msg
        return self._sock

    def read_raw(self, interface: str) -> list[Any]:
        """The decoded reply messages of one request (``recorded`` bytes: ``msg.data``)."""
        from pyroute2.netlink import NLM_F_REQUEST
        from pyroute2.netlink.exceptions import NetlinkError

        sock = self._socket()
        m = self._msg()
        m["cmd"] = ETHTOOL_MSG_LINKMODES_GET
        m["version"] = 1
        m["attrs"] = [("ETHTOOL_A_LINKMODES_HEADER", {"attrs": [
            ("ETHTOOL_A_HEADER_DEV_NAME", interface), ("ETHTOOL_A_HEADER_FLAGS", ETHTOOL_FLAG_COMPACT_BITSETS)]})]
        try:
            return list(sock.nlm_request(m, msg_type=sock.prid, msg_flags=NLM_F_REQUEST))
        except NetlinkError as exc:
            raise GroupsUnavailable(exc.code, f"{interface}: ETHTOOL_MSG_LINKMODES_GET: {exc}") from None

    def read_modes(self, interface: str) -> LinkModes:
        replies = self.read_raw(interface)
        return from_message(replies[0]) if replies else LinkModes(None, None)


class LaneCache:
    """Lanes per netdev for the port sources, read over netlink at most every ``every_s`` per netdev
    and again as soon as its speed changes (a renegotiated link); never waits: not yet imported,
    another thread reading, or unavailable, the answer is None and the sysfs rate stands."""

    def __init__(self, reader: Callable[[str], LinkModes] | None = None, *, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._own = reader is None
        self._reader: Callable[[str], LinkModes] | None = reader
        self._nl: EthtoolLinkModes | None = None
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, float | None, int | None]] = {}  # netdev -> (when, speed, lanes)
        self._off = False
        if self._own:
            warm_up()

    def lanes(self, netdev: str, speed_gbps: float | None) -> int | None:
        if not netdev or self._off:
            return None
        now = self._clock()
        hit = self._cache.get(netdev)
        if hit is not None and hit[1] == speed_gbps and now - hit[0] < self._every_s:
            return hit[2]
        if self._own and not EthtoolLinkModes.ready():
            return hit[2] if hit is not None and hit[1] == speed_gbps else None
        if not self._lock.acquire(blocking=False):
            return hit[2] if hit is not None and hit[1] == speed_gbps else None
        try:
            if self._reader is None:
                self._nl = EthtoolLinkModes()
                self._reader = self._nl.read_modes
            try:
                lanes = self._reader(netdev).lanes
            except GroupsUnavailable as exc:
                if exc.errno in (errno.ENOSYS, errno.ENOENT, errno.EPROTONOSUPPORT):
                    self._off = True  # this host has none: stop asking
                lanes = None
            except OSError:
                lanes = None
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[netdev] = (now, speed_gbps, lanes)
            return lanes
        finally:
            self._lock.release()

    def close(self) -> None:
        if self._nl is not None:
            self._nl.close()
