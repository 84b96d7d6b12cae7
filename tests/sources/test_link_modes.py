"""Ethernet lanes from ethtool netlink link modes, the sysfs rate's lanes only as fallback.

The netlink path runs against a real kernel (a veth pair in a namespace this test creates) and a
recorded reply (tests/fixtures/ethtool_netlink); the sources use the lanes over the Broadcom and
Intel fixture trees, whose sysfs rate is stale (bnxt) or agrees with the netdev (ice).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import subprocess
import sys

import pytest

from fabricmon.config import ProfileConfig
from fabricmon.sources.ethtool_groups import GroupsUnavailable
from fabricmon.sources.fabric_config import FabricConfigSource
from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import discover
from fabricmon.sources.link_modes import LaneCache, LinkModes, decode_reply
from support.netns import need_netns
from support.paths import FIXTURES, REPO

REPLIES = FIXTURES / "ethtool_netlink"
DRIVERS = FIXTURES / "drivers"


def _reply(name: str) -> LinkModes:
    return decode_reply(bytes.fromhex((REPLIES / f"{name}.linkmodes.hex").read_text().strip()))


def test_recorded_veth_reply_has_its_speed_and_no_lanes() -> None:
    assert _reply("veth0") == LinkModes(10000, None)


def test_a_reply_with_lanes() -> None:
    assert _reply("lanes4-400g") == LinkModes(400000, 4)


class _Reader:
    def __init__(self, modes: LinkModes | Exception) -> None:
        self.modes, self.calls = modes, 0

    def __call__(self, netdev: str) -> LinkModes:
        self.calls += 1
        if isinstance(self.modes, Exception):
            raise self.modes
        return self.modes


def test_lanes_are_cached_and_read_again_when_the_speed_changes() -> None:
    now = [0.0]
    reader = _Reader(_reply("lanes4-400g"))
    cache = LaneCache(reader, every_s=60.0, clock=lambda: now[0])
    assert [cache.lanes("ens41f0np0", 400.0) for _ in range(3)] == [4, 4, 4] and reader.calls == 1
    assert cache.lanes("ens41f0np0", 200.0) == 4 and reader.calls == 2  # renegotiated: asked again
    now[0] = 61.0
    cache.lanes("ens41f0np0", 200.0)
    assert reader.calls == 3  # and again once a minute


def test_a_host_without_ethtool_netlink_is_asked_once() -> None:
    reader = _Reader(GroupsUnavailable(errno.ENOENT, "no ethtool netlink family"))
    cache = LaneCache(reader, every_s=0.0)
    assert cache.lanes("eth0", 100.0) is None and cache.lanes("eth1", 100.0) is None
    assert reader.calls == 1


def _width_and_rate(tree: str, lanes: LaneCache | None) -> tuple[dict, dict]:
    inv = discover(str(DRIVERS / tree / "node" / "sys"))
    res = InfinibandSource(timeout=1.0, lanes=lanes).poll(inv)
    width = {dict(r.labels)["device"]: r.value for r in res.readings if r.family == "fabricmon_ib_port_width_lanes"}
    data = {dict(r.labels)["device"]: r.value for r in res.readings
            if r.family == "fabricmon_ib_port_data_rate_bytes_per_second"}
    return width, data


def test_stale_sysfs_rate_lanes_come_from_link_modes() -> None:
    # bnxt-thor2-gen2: rate "100 Gb/sec (4X EDR)", netdev speed 400000: without link modes the
    # width is unknown (the stale rate's lanes are not believed), with them it is the reply's
    width, data = _width_and_rate("bnxt-thor2-gen2", None)
    assert width == {} and data == {"bnxt_re0": 400e9 / 8, "bnxt_re1": 400e9 / 8}
    width, data = _width_and_rate("bnxt-thor2-gen2", LaneCache(_Reader(_reply("lanes4-400g"))))
    assert width == {"bnxt_re0": 4, "bnxt_re1": 4} and data == {"bnxt_re0": 400e9 / 8, "bnxt_re1": 400e9 / 8}


def test_without_lanes_in_link_modes_the_agreeing_sysfs_rate_tells() -> None:
    # ice: rate "100 Gb/sec (4X EDR)" agrees with the netdev's 100000; a driver that says no lanes (the
    # veth reply) leaves the sysfs rate's 4
    width, _ = _width_and_rate("ice-irdma-e810", LaneCache(_Reader(_reply("veth0"))))
    assert width == {"irdma0": 4}


def _config(tree: str, lanes: LaneCache | None, width: int) -> dict[tuple[str, str], float]:
    inv = discover(str(DRIVERS / tree / "node" / "sys"))
    res = FabricConfigSource(ethtool_dir=str(DRIVERS / tree / "node" / "ethtool"), lanes=lanes,
                             profile=ProfileConfig(rate_gbps=400.0, width=width)).poll(inv)
    return {(dict(r.labels)["device"], dict(r.labels)["check"]): r.value for r in res.readings
            if r.family == "fabricmon_fabric_config_ok"}


def test_config_check_width_of_a_roce_port_from_link_modes_only() -> None:
    four = LaneCache(_Reader(_reply("lanes4-400g")))
    assert _config("bnxt-thor2-gen2", four, 4)[("bnxt_re0", "width")] == 1
    assert _config("bnxt-thor2-gen2", four, 8)[("bnxt_re0", "width")] == 0  # a profile of 8 lanes: drift
    got = _config("bnxt-thor2-gen2", None, 4)
    assert ("bnxt_re0", "width") not in got  # the sysfs rate's lanes of a RoCE port check nothing
    assert got[("bnxt_re0", "rate")] == 1  # the netdev's 400000, not the stale "100 Gb/sec"


_NS_SCRIPT = r"""
import json
from fabricmon.sources.ethtool_groups import GroupsUnavailable
from fabricmon.sources.link_modes import EthtoolLinkModes, LaneCache
nl = EthtoolLinkModes()
modes = nl.read_modes("veth0")
try:
    nl.read_modes("nope0")
    missing = None
except GroupsUnavailable as e:
    missing = e.errno
nl.close()
cache = LaneCache(EthtoolLinkModes().read_modes)
print(json.dumps({"speed": modes.speed_mbps, "lanes": modes.lanes, "missing": missing,
                  "cached": cache.lanes("veth0", 10.0)}))
"""


@pytest.mark.netns
def test_netlink_link_modes_agree_with_ethtool_and_sysfs_on_veth() -> None:
    need_netns("ip", "ethtool")
    ns = f"fm-lm-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=20)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
                       check=True, capture_output=True, timeout=20)
        for dev in ("veth0", "veth1"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True, capture_output=True, timeout=20)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        ours = json.loads(subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _NS_SCRIPT],
                                         check=True, capture_output=True, text=True, timeout=60, env=env,
                                         cwd=str(REPO)).stdout)
        theirs = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "veth0"], check=True, capture_output=True,
                                text=True, timeout=20).stdout
        sysfs = subprocess.run(["ip", "netns", "exec", ns, "cat", "/sys/class/net/veth0/speed"], check=True,
                               capture_output=True, text=True, timeout=20).stdout.strip()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=20)
    assert f"Speed: {ours['speed']}Mb/s" in theirs and str(ours["speed"]) == sysfs == "10000"
    assert ours["lanes"] is None and "Lanes:" not in theirs  # veth says no lane count, ethtool prints none
    assert ours["cached"] is None
    assert ours["missing"] == errno.ENODEV
