"""The kernel's standard ethtool stats groups: ethtool netlink (pyroute2) on a real veth, and the
``<if>.groups.json`` files of fixture trees (``ethtool --json -S <if> --all-groups``)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from fabricmon.sources.bounds import Rejected
from fabricmon.sources.ethtool import EthtoolSource
from fabricmon.sources.ethtool_groups import parse_groups_json
from fabricmon.sources.inventory import Inventory
from support.netns import need_netns
from support.paths import REPO
from support.realformat import fixture

PHY = "fabricmon_netdev_phy_errors_total"


def test_real_veth_output_parses_to_groups_without_stats() -> None:
    # captured from a veth in a namespace (ethtool 6.1, kernel 6.18): every group present, none filled
    assert parse_groups_json(fixture("ethtool", "veth-all-groups.groups.json").read_text()) == []


@pytest.mark.parametrize("text,reason", [
    ("{not json", "malformed"),
    ('{"ifname": "x"}', "malformed"),
    ('[{"ifname": "x", "eth-mac": 5}]', "malformed"),
    ('[{"ifname": "x", "eth-mac": {"FrameCheckSequenceErrors": -1}}]', "out_of_range"),
    ('[{"ifname": "x", "eth-mac": {"FrameCheckSequenceErrors": 1.5}}]', "not_integer"),
    ('[{"ifname": "x", "eth-mac": {"FrameCheckSequenceErrors": true}}]', "not_integer"),
    ('[{"ifname": "x", "eth-mac": {"FrameCheckSequenceErrors": 18446744073709551616}}]', "out_of_range"),
])
def test_a_bad_groups_file_is_refused_with_its_reason(text: str, reason: str) -> None:
    with pytest.raises(Rejected) as exc:
        parse_groups_json(text)
    assert exc.value.reason == reason


def test_groups_fill_what_the_driver_lacks_and_never_double_a_series(tmp_path: Path) -> None:
    eth = tmp_path / "ethtool"
    eth.mkdir()
    (eth / "eth9.txt").write_text("NIC statistics:\n     rx_crc_errors_phy: 11\n")
    (eth / "eth9.groups.json").write_text(json.dumps([{"ifname": "eth9", "eth-mac": {
        "FrameCheckSequenceErrors": 11, "AlignmentErrors": 4, "FramesReceivedOK": 1000},
        "eth-phy": {"SymbolErrorDuringCarrier": 2}, "rmon": {"etherStatsJabbers": 3, "rx-pktsNtoM": []}}]))
    (eth / "eth8.txt").write_text("NIC statistics:\n     rx_crc_errors_phy: 1\n")
    (eth / "eth8.groups.json").write_text("garbage")
    res = EthtoolSource(ethtool_dir=str(eth)).poll(Inventory(str(tmp_path), extra_netdevs=("eth9", "eth8")))
    keys = [(r.family, r.labels) for r in res.readings]
    assert len(keys) == len(set(keys))  # one series per name: the driver's own wins
    v = dict(zip(keys, (r.value for r in res.readings), strict=True))
    assert v[(PHY, (("interface", "eth9"), ("counter", "rx_crc_errors_phy")))] == 11
    assert v[(PHY, (("interface", "eth9"), ("counter", "eth-mac/AlignmentErrors")))] == 4
    assert v[(PHY, (("interface", "eth9"), ("counter", "rx_symbol_err_phy")))] == 2
    assert v[(PHY, (("interface", "eth9"), ("counter", "rx_jabbers_phy")))] == 3
    assert v[("fabricmon_ethtool_unclassified_stats", (("interface", "eth9"), ("driver", "unknown")))] == 0
    # a garbled groups file costs one error, not the interface's -S stats
    assert v[(PHY, (("interface", "eth8"), ("counter", "rx_crc_errors_phy")))] == 1
    assert v[("fabricmon_ethtool_up", (("interface", "eth8"),))] == 1.0
    assert res.errors == 1 and "eth8.groups.json" in res.messages[0]


_NS_SCRIPT = r"""
import json, subprocess, sys
from fabricmon.sources.ethtool_groups import EthtoolNetlink, GroupsUnavailable
nl = EthtoolNetlink()
groups, stats = nl.read("veth0")
try:
    nl.read("nope0")
    missing = None
except GroupsUnavailable as e:
    missing = e.errno
nl.close()
print(json.dumps({"groups": sorted(groups), "stats": stats, "missing": missing}))
"""


@pytest.mark.netns
def test_netlink_read_agrees_with_the_ethtool_binary_on_veth() -> None:
    need_netns("ip", "ethtool")
    ns = f"fm-grp-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=20)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
                       check=True, capture_output=True, timeout=20)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        ours = json.loads(subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _NS_SCRIPT],
                                         check=True, capture_output=True, text=True, timeout=60, env=env,
                                         cwd=str(REPO)).stdout)
        theirs = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "--json", "-S", "veth0", "--all-groups"],
                                check=True, capture_output=True, text=True, timeout=20).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
    doc = json.loads(theirs)
    want_groups = sorted(k for k in doc[0] if k in ("eth-phy", "eth-mac", "eth-ctrl", "rmon"))
    assert ours["groups"] == want_groups == ["eth-ctrl", "eth-mac", "eth-phy", "rmon"]
    assert [tuple(x) for x in ours["stats"]] == parse_groups_json(theirs)
    assert ours["missing"] == 19  # ENODEV, as the kernel said it


def test_collect_writes_groups_as_ethtool_does_and_the_agent_reads_them_back() -> None:
    from fabricmon.collect import groups_json

    stats = [("eth-mac/FrameCheckSequenceErrors", 7), ("rmon/etherStatsJabbers", 1)]
    text = groups_json("ens1", frozenset({"eth-phy", "eth-mac", "eth-ctrl", "rmon"}), stats)
    assert json.loads(text)[0]["eth-phy"] == {} and json.loads(text)[0]["ifname"] == "ens1"
    assert parse_groups_json(text) == stats


class _FakeIoctl:
    def read(self, interface: str) -> list[tuple[str, int]]:
        return [("rx_crc_errors_phy", 1)]

    def driver(self, interface: str) -> str:
        return "mlx5_core"

    def forget(self, keep: set[str]) -> None:
        pass

    def close(self) -> None:
        pass


class _FakeGroups:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def ready(self) -> bool:
        return True

    def read(self, interface: str):
        self.calls.append(interface)
        return frozenset({"eth-mac"}), [("eth-mac/AlignmentErrors", 10 + len(self.calls))]

    def close(self) -> None:
        pass


def test_live_groups_are_read_one_netdev_a_poll_and_every_10_s_each(tmp_path: Path) -> None:
    now = [100.0]
    groups = _FakeGroups()
    src = EthtoolSource(ioctl=_FakeIoctl(), groups=groups, clock=lambda: now[0])
    inv = Inventory(str(tmp_path), extra_netdevs=("eth0", "eth1", "eth2"))

    def aligned(res) -> dict[str, float]:
        return {dict(r.labels)["interface"]: r.value for r in res.readings
                if r.family == PHY and dict(r.labels)["counter"] == "eth-mac/AlignmentErrors"}

    seen = []
    for _ in range(4):
        seen.append(aligned(src.poll(inv)))
        now[0] += 1.0
    assert groups.calls == ["eth0", "eth1", "eth2"]  # one genetlink round trip per poll, never a burst
    assert seen[0] == {"eth0": 11} and seen[2] == seen[3] == {"eth0": 11, "eth1": 12, "eth2": 13}
    now[0] = 110.5  # eth0's values are 10 s old: its turn again
    assert aligned(src.poll(inv))["eth0"] == 14 and groups.calls[-1] == "eth0"
