"""The kernel's standard ethtool statistics groups (``eth-phy``, ``eth-mac``, ``eth-ctrl``, ``rmon``).

They exist only over ethtool netlink (``ETHTOOL_MSG_STATS_GET``; ``ethtool -S <if> --all-groups``
prints them), never in the ``ETH_SS_STATS`` string set the ioctl reads.  Two readers give one
list of ``("<group>/<Stat>", u64)`` pairs:

* ``EthtoolNetlink``: pyroute2's generic-netlink socket and attribute codec.  pyroute2 (0.9.7)
  has no STATS_GET message of its own, so the message layout below is declared on its ``nla``
  classes, from ``include/uapi/linux/ethtool_netlink.h``: the library does the socket, family
  resolution, framing, nesting flags and errors; nothing here packs bytes by hand.
* ``parse_groups_json``: ``<ethtool_dir>/<if>.groups.json``, the output of
  ``ethtool --json -S <if> --all-groups`` (fixture trees and the simulator).

Stat names are the kernel's string sets (``net/ethtool/common.c`` ``stats_eth_phy_names``,
``stats_eth_mac_names``, ``stats_eth_ctrl_names``, ``stats_rmon_names``), which are also what
ethtool prints; the attribute type of a statistic is its index in the uapi enum of its group.
Histograms (``rx-pktsNtoM``) are not read.
"""

from __future__ import annotations

import errno
import json
import threading
from typing import Any

from .bounds import Rejected, counter_value

GROUP_NAMES: tuple[str, ...] = ("eth-phy", "eth-mac", "eth-ctrl", "rmon")  # ETHTOOL_STATS_* order

#: per group, the stat names in the order of the uapi enum (ETHTOOL_A_STATS_ETH_MAC_2_TX_PKT = 0, ...)
STAT_NAMES: dict[str, tuple[str, ...]] = {
    "eth-phy": ("SymbolErrorDuringCarrier",),
    "eth-mac": (
        "FramesTransmittedOK", "SingleCollisionFrames", "MultipleCollisionFrames", "FramesReceivedOK",
        "FrameCheckSequenceErrors", "AlignmentErrors", "OctetsTransmittedOK", "FramesWithDeferredXmissions",
        "LateCollisions", "FramesAbortedDueToXSColls", "FramesLostDueToIntMACXmitError", "CarrierSenseErrors",
        "OctetsReceivedOK", "FramesLostDueToIntMACRcvError", "MulticastFramesXmittedOK",
        "BroadcastFramesXmittedOK", "FramesWithExcessiveDeferral", "MulticastFramesReceivedOK",
        "BroadcastFramesReceivedOK", "InRangeLengthErrors", "OutOfRangeLengthField", "FrameTooLongErrors",
    ),
    "eth-ctrl": ("MACControlFramesTransmitted", "MACControlFramesReceived", "UnsupportedOpcodesReceived"),
    "rmon": ("etherStatsUndersizePkts", "etherStatsOversizePkts", "etherStatsFragments", "etherStatsJabbers"),
}

MAX_GROUP_STATS = 4096  # a reply or a file with more is not what the kernel sends


class GroupsUnavailable(OSError):
    """The standard groups cannot be read here (no ethtool netlink, no pyroute2, no such device)."""


def parse_groups_json(text: str) -> list[tuple[str, int]]:
    """``ethtool --json -S <if> --all-groups`` -> ``[("eth-mac/FrameCheckSequenceErrors", 3), ...]``.

    Raises Rejected (malformed) for text that is not that document; a value that is not a u64
    integer is refused the same way as in ``ethtool -S`` text.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise Rejected("malformed", f"not JSON: {exc}") from None
    if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
        raise Rejected("malformed", "not an array of interface objects")
    out: list[tuple[str, int]] = []
    for dev in doc:
        for group, stats in dev.items():
            if group == "ifname":
                continue
            if not isinstance(stats, dict):
                raise Rejected("malformed", f"group {str(group)[:40]!r} is not an object")
            for name, value in stats.items():
                if isinstance(value, list):
                    continue  # rmon histograms: not read
                out.append((f"{group}/{name}", counter_value(value, 64, f"{group}/{name}")))
                if len(out) > MAX_GROUP_STATS:
                    raise Rejected("too_long", f"more than {MAX_GROUP_STATS} group stats")
    return out


def _messages():  # pragma: no cover - imported lazily: pyroute2 is needed only on a live host
    from pyroute2.netlink import NLA_F_NESTED, genlmsg, nla

    class _header(nla):
        nla_flags = NLA_F_NESTED
        nla_map = (("ETHTOOL_A_HEADER_UNSPEC", "none"), ("ETHTOOL_A_HEADER_DEV_INDEX", "uint32"),
                   ("ETHTOOL_A_HEADER_DEV_NAME", "asciiz"), ("ETHTOOL_A_HEADER_FLAGS", "uint32"))

    class _bitset(nla):
        nla_flags = NLA_F_NESTED
        nla_map = (("ETHTOOL_A_BITSET_UNSPEC", "none"), ("ETHTOOL_A_BITSET_NOMASK", "flag"),
                   ("ETHTOOL_A_BITSET_SIZE", "uint32"), ("ETHTOOL_A_BITSET_BITS", "hex"),
                   ("ETHTOOL_A_BITSET_VALUE", "uint32"), ("ETHTOOL_A_BITSET_MASK", "hex"))

    class _stat(nla):
        # one attribute whose type is the stat's index in its group's enum, u64
        nla_map = tuple((f"STAT_{i}", "uint64") for i in range(max(len(v) for v in STAT_NAMES.values())))

    class _group(nla):
        nla_map = (("ETHTOOL_A_STATS_GRP_UNSPEC", "none"), ("ETHTOOL_A_STATS_GRP_PAD", "none"),
                   ("ETHTOOL_A_STATS_GRP_ID", "uint32"), ("ETHTOOL_A_STATS_GRP_SS_ID", "uint32"),
                   ("ETHTOOL_A_STATS_GRP_STAT", "one_stat"), ("ETHTOOL_A_STATS_GRP_HIST_RX", "hex"),
                   ("ETHTOOL_A_STATS_GRP_HIST_TX", "hex"))
        one_stat = _stat

    class stats_msg(genlmsg):
        nla_map = (("ETHTOOL_A_STATS_UNSPEC", "none"), ("ETHTOOL_A_STATS_PAD", "none"),
                   ("ETHTOOL_A_STATS_HEADER", "dev_header"), ("ETHTOOL_A_STATS_GROUPS", "group_bits"),
                   ("ETHTOOL_A_STATS_GRP", "stats_group"))
        # (not "header": pyroute2 messages keep their netlink header under that name)
        dev_header = _header
        group_bits = _bitset
        stats_group = _group

    return stats_msg


# Importing pyroute2 takes about a second of CPU: done once per process in a background thread, so
# that no poll waits for it (a poll reads the groups only once it is done).
_IMPORTED = threading.Event()
_IMPORT_LOCK = threading.Lock()
_import_error: str | None = None
_import_started = False


def _import_pyroute2() -> None:
    global _import_error
    try:
        import pyroute2.netlink.generic  # noqa: F401
    except ImportError as exc:
        _import_error = str(exc)
    finally:
        _IMPORTED.set()


def warm_up() -> None:
    """Start importing pyroute2 in the background (once per process)."""
    global _import_started
    with _IMPORT_LOCK:
        if _import_started:
            return
        _import_started = True
    threading.Thread(target=_import_pyroute2, name="ethtool-netlink-import", daemon=True).start()


ETHTOOL_MSG_STATS_GET = 32  # position in the ETHTOOL_MSG_* user enum
ETHTOOL_GENL_VERSION = 1


class EthtoolNetlink:
    """``ETHTOOL_MSG_STATS_GET`` for every standard group, over one generic-netlink socket."""

    def __init__(self) -> None:
        self._sock: Any = None
        self._msg: Any = None

    @staticmethod
    def ready() -> bool:
        """pyroute2 is imported (``warm_up``): a read will not stall on the import."""
        return _IMPORTED.is_set()

    def _socket(self):
        if self._sock is None:
            try:
                from pyroute2.netlink.generic import GenericNetlinkSocket
            except ImportError:
                raise GroupsUnavailable(errno.ENOSYS, "pyroute2 is not installed") from None
            msg = _messages()
            sock = GenericNetlinkSocket()
            try:
                sock.bind("ethtool", msg)
            except Exception as exc:  # no ethtool genl family (kernel < 5.6): the ioctl stats still work
                sock.close()
                raise GroupsUnavailable(errno.ENOENT, f"no ethtool netlink family: {exc}") from None
            self._sock, self._msg = sock, msg
        return self._sock

    def read(self, interface: str) -> tuple[frozenset[str], list[tuple[str, int]]]:
        """(groups the kernel answered for, [("<group>/<Stat>", value)]) of one netdev."""
        from pyroute2.netlink import NLM_F_REQUEST
        from pyroute2.netlink.exceptions import NetlinkError

        sock = self._socket()
        m = self._msg()
        m["cmd"] = ETHTOOL_MSG_STATS_GET
        m["version"] = ETHTOOL_GENL_VERSION
        m["attrs"] = [
            ("ETHTOOL_A_STATS_HEADER", {"attrs": [("ETHTOOL_A_HEADER_DEV_NAME", interface)]}),
            ("ETHTOOL_A_STATS_GROUPS", {"attrs": [
                ("ETHTOOL_A_BITSET_NOMASK", True), ("ETHTOOL_A_BITSET_SIZE", len(GROUP_NAMES)),
                ("ETHTOOL_A_BITSET_VALUE", (1 << len(GROUP_NAMES)) - 1)]}),
        ]
        try:
            replies = sock.nlm_request(m, msg_type=sock.prid, msg_flags=NLM_F_REQUEST)
        except NetlinkError as exc:
            raise GroupsUnavailable(exc.code, f"{interface}: ETHTOOL_MSG_STATS_GET: {exc}") from None
        groups: set[str] = set()
        out: list[tuple[str, int]] = []
        for reply in replies:
            for grp in reply.get_attrs("ETHTOOL_A_STATS_GRP"):
                gid = grp.get_attr("ETHTOOL_A_STATS_GRP_ID")
                if gid is None or not 0 <= gid < len(GROUP_NAMES):
                    continue  # a group newer than this table (phydev, ...)
                gname = GROUP_NAMES[gid]
                groups.add(gname)
                names = STAT_NAMES[gname]
                for st in grp.get_attrs("ETHTOOL_A_STATS_GRP_STAT"):
                    for key, value in st["attrs"]:
                        idx = int(key[len("STAT_"):]) if key.startswith("STAT_") else -1
                        if 0 <= idx < len(names) and len(out) < MAX_GROUP_STATS:
                            out.append((f"{gname}/{names[idx]}", int(value)))
        return frozenset(groups), out

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
