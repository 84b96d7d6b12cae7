"""Lossless-config checks: pure checks, dcbnl parsing, fixture faults, and dcbnl on veth."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fabricmon.config import ProfileConfig
from fabricmon.metrics import SPECS
from fabricmon.sources.ethtool import PfcInfo
from fabricmon.sources.fabric_config import (
    FAMILY,
    DcbUnavailable,
    FabricConfigSource,
    PortFacts,
    evaluate,
    parse_dcb_ieee,
    read_dcb,
)
from fabricmon.sources.inventory import discover
from support.fixturegen import gen_fixture
from support.netns import need_netns
from support.paths import REPO

RAILS = [f"mlx5_{i}" for i in range(8)]


def checks(root: Path, **kw) -> tuple[dict[tuple[str, str], float], FabricConfigSource, object]:
    """(device, check) -> value for one poll of a single-snapshot tree."""
    src = FabricConfigSource(ethtool_dir=str(root / "ethtool"), **kw)
    res = src.poll(discover(str(root / "sys")))
    out: dict[tuple[str, str], float] = {}
    for r in res.readings:
        assert r.family == FAMILY
        assert tuple(k for k, _ in r.labels) == SPECS[FAMILY].labels
        lab = dict(r.labels)
        out[(lab["device"], lab["check"])] = r.value
    return out, src, res


# --- pure ----------------------------------------------------------------------------------------


P = ProfileConfig()


def test_evaluate_roce_all_ok_and_each_drift() -> None:
    good = PortFacts("Ethernet", 4, 400.0, 4, 9000, True, True, PfcInfo("dscp", frozenset({3})))
    assert evaluate(good, P) == dict.fromkeys(("pfc", "trust", "ecn_np", "ecn_rp", "mtu", "rate"), True)
    from dataclasses import replace
    assert not evaluate(replace(good, pfc=PfcInfo("dscp", frozenset())), P)["pfc"]
    # exact set: PFC on an extra, lossy priority is drift too
    assert not evaluate(replace(good, pfc=PfcInfo("dscp", frozenset({3, 4}))), P)["pfc"]
    assert not evaluate(replace(good, pfc=PfcInfo("pcp", frozenset({3}))), P)["trust"]
    assert not evaluate(replace(good, mtu=1500), P)["mtu"]
    assert evaluate(replace(good, mtu=9216), P)["mtu"]  # larger is fine
    assert not evaluate(replace(good, ecn_np=False), P)["ecn_np"]
    assert not evaluate(replace(good, rate_gbps=200.0), P)["rate"]
    assert "width" not in evaluate(replace(good, width=2), P)  # RoCE: mlx5 prints lane modes as IB widths


def test_evaluate_skips_what_is_unknown() -> None:
    facts = PortFacts("Ethernet", 1, 40.0, 4, None, None, None, None)  # DOWN: fallback rate
    assert evaluate(facts, P) == {}
    half = PortFacts("Ethernet", 4, 400.0, 4, 9000, True, True, PfcInfo(None, frozenset({3})))
    assert "trust" not in evaluate(half, P) and evaluate(half, P)["pfc"]


def test_evaluate_ib_has_rate_and_width_only() -> None:
    facts = PortFacts("InfiniBand", 4, 400.0, 4, 2044, False, False, PfcInfo("pcp", frozenset()))
    assert evaluate(facts, P) == {"rate": True, "width": True}


def _rta(atype: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, atype) + payload + b"\0" * ((-n) & 3)


def _ieee_pfc(pfc_en: int) -> bytes:
    # struct ieee_pfc: pfc_cap, pfc_en, mbc (u8), delay (u16, aligned), requests[8], indications[8] (u64)
    return struct.pack("=BBBxH2x", 8, pfc_en, 0, 0) + b"\0" * 128


def test_parse_dcb_ieee_reply() -> None:
    dscp_app = _rta(1, struct.pack("=BBH", 5, 3, 26))  # selector DSCP, prio 3, dscp 26
    ether_app = _rta(1, struct.pack("=BBH", 1, 3, 0x8915))  # ethertype selector
    payload = _rta(1, b"eth0\0") + _rta(13 | 0x8000, _rta(2, _ieee_pfc(0x08)) + _rta(3, ether_app + dscp_app))
    assert parse_dcb_ieee(payload) == PfcInfo("dscp", frozenset({3}))
    payload = _rta(13, _rta(2, _ieee_pfc(0x18)) + _rta(3, ether_app))
    assert parse_dcb_ieee(payload) == PfcInfo("pcp", frozenset({3, 4}))
    assert parse_dcb_ieee(_rta(1, b"eth0\0")) == PfcInfo(None, None)
    assert parse_dcb_ieee(b"\x01") == PfcInfo(None, None)  # truncated: no crash


def test_dcbnl_not_available_on_loopback() -> None:
    # RTM_GETDCB needs no privilege; lo has no dcbnl_ops, so the kernel answers EOPNOTSUPP.
    with pytest.raises(DcbUnavailable):
        read_dcb("lo")
    with pytest.raises(DcbUnavailable):
        read_dcb("fm-no-such-if0")


# --- fixture trees ----------------------------------------------------------------------------


def test_none_all_ok_and_frontend_unchecked(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "none", "--seed", "2")
    got, _, res = checks(root)
    assert res.errors == 0, res.messages
    assert set(got) == {(d, c) for d in RAILS for c in ("pfc", "trust", "ecn_np", "ecn_rp", "mtu", "rate")}
    assert set(got.values()) == {1.0}
    assert not any(d == "mlx5_8" for d, _ in got)  # the frontend NIC serves no rail


def test_config_drift_fails_pfc_and_ecn_on_the_drifted_nic_only(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "config_drift", "--fault-dev", "mlx5_5",
                       "--seed", "4")
    assert json.loads((root / "fixture.json").read_text())["fault_device"] == "mlx5_5"
    got, _, res = checks(root)
    assert res.errors == 0
    bad = {k for k, v in got.items() if v == 0.0}
    assert bad == {("mlx5_5", "pfc"), ("mlx5_5", "ecn_np"), ("mlx5_5", "ecn_rp")}
    assert len(got) == 8 * 6


def test_config_drift_over_snapshots(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "config_drift", "--snapshots", "3",
                       "--fault-start", "1", "--fault-end", "2", "--seed", "4")
    series = []
    for t in ("t0", "t1", "t2"):
        got, _, _ = checks(root / t)
        series.append(got[("mlx5_3", "pfc")])
    assert series == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("degrade,failing", [("width", {"rate"}), ("speed", {"rate"})])
def test_link_degraded(tmp_path: Path, degrade: str, failing: set[str]) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "link_degraded", "--degrade", degrade,
                       "--seed", "6")
    got, _, res = checks(root)
    assert res.errors == 0
    assert {k for k, v in got.items() if v == 0.0} == {("mlx5_3", c) for c in failing}


def test_link_down_port_gets_no_rate_or_width_verdict(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "link_down", "--seed", "6")
    got, _, res = checks(root)
    assert res.errors == 0
    assert ("mlx5_3", "rate") not in got and ("mlx5_3", "width") not in got
    assert got[("mlx5_3", "pfc")] == 1.0 and got[("mlx5_2", "rate")] == 1.0


def test_ib_layout_rate_and_width_only(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "ib", "--fault", "link_degraded", "--seed", "1")
    got, _, res = checks(root)
    assert res.errors == 0
    assert set(got) == {(d, c) for d in RAILS for c in ("rate", "width")}
    assert {k for k, v in got.items() if v == 0.0} == {("mlx5_3", "rate"), ("mlx5_3", "width")}


def test_unavailable_facts_emit_nothing_and_count_no_error(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "none", "--seed", "2")
    manifest = json.loads((root / "fixture.json").read_text())
    ifname = {d["name"]: d["ifname"] for d in manifest["devices"]}
    (root / "ethtool" / f"{ifname['mlx5_1']}.pfc.txt").unlink()
    shutil.rmtree(os.path.realpath(root / "sys" / "class" / "net" / ifname["mlx5_2"] / "ecn"))
    got, _, res = checks(root)
    assert res.errors == 0
    assert {c for d, c in got if d == "mlx5_1"} == {"ecn_np", "ecn_rp", "mtu", "rate"}
    assert {c for d, c in got if d == "mlx5_2"} == {"pfc", "trust", "mtu", "rate"}
    assert set(got.values()) == {1.0}


def test_garbage_costs_one_error_and_only_its_check(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "none", "--seed", "2")
    ifname = {d["name"]: d["ifname"] for d in json.loads((root / "fixture.json").read_text())["devices"]}
    mtu = Path(os.path.realpath(root / "sys" / "class" / "net" / ifname["mlx5_4"] / "mtu"))
    mtu.write_text("jumbo\n")
    rate = Path(os.path.realpath(root / "sys" / "class" / "infiniband" / "mlx5_6" / "ports" / "1" / "rate"))
    rate.write_text("unknown\n")
    (root / "ethtool" / f"{ifname['mlx5_7']}.pfc.txt").write_text("nothing useful\n")
    got, _, res = checks(root)
    assert res.errors == 2 and res.up
    assert ("mlx5_4", "mtu") not in got and ("mlx5_6", "width") not in got
    # a RoCE port's rate is its netdev's speed: a garbled sysfs rate (only a fallback) costs nothing
    assert got[("mlx5_6", "rate")] == 1.0
    assert ("mlx5_7", "pfc") not in got and ("mlx5_7", "trust") not in got
    assert len(got) == 8 * 6 - 3 and set(got.values()) == {1.0}


def test_dcbnl_mode_uses_reader_and_caches(tmp_path: Path) -> None:
    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "none", "--seed", "2")
    calls: list[str] = []
    now = {"t": 0.0}

    def reader(ifname: str) -> PfcInfo:
        calls.append(ifname)
        if ifname.startswith("enp24"):
            raise DcbUnavailable("no dcb")
        return PfcInfo("pcp", frozenset({3}))

    src = FabricConfigSource(dcb_reader=reader, clock=lambda: now["t"], dcb_cache_seconds=10.0)
    inv = discover(str(root / "sys"))
    res = src.poll(inv)
    got = {(dict(r.labels)["device"], dict(r.labels)["check"]): r.value for r in res.readings}
    assert res.errors == 0
    assert ("mlx5_0", "pfc") not in got and ("mlx5_0", "trust") not in got  # dcbnl unavailable there
    assert got[("mlx5_1", "pfc")] == 1.0 and got[("mlx5_1", "trust")] == 0.0  # pcp, profile wants dscp
    assert len(calls) == 8  # rail NICs only
    now["t"] = 5.0
    src.poll(inv)
    assert len(calls) == 8  # cached
    now["t"] = 11.0
    src.poll(inv)
    assert len(calls) == 16


# --- dcbnl on a real veth in a private namespace ----------------------------------------------


_NS_SCRIPT = r"""
import json
from fabricmon.sources.fabric_config import FabricConfigSource, DcbUnavailable, read_dcb
from fabricmon.sources.inventory import Inventory, PortInfo
out = {}
try:
    out["read"] = repr(read_dcb("veth0"))
except DcbUnavailable as e:
    out["unavailable"] = str(e)
# A RoCE-like rail port backed by veth0: state/rate live in a directory that does not exist,
# so only the netdev facts and dcbnl are consulted.
port = PortInfo("mlx5_0", "1", "/nonexistent/ports/1", "Ethernet", "veth0", "0")
res = FabricConfigSource().poll(Inventory(sysfs_root="/sys", ports=(port,)))
out["errors"] = res.errors
out["messages"] = res.messages
out["checks"] = {dict(r.labels)["check"]: r.value for r in res.readings}
print(json.dumps(out))
"""


@pytest.mark.netns
def test_dcbnl_not_available_on_veth_means_no_pfc_checks() -> None:
    need_netns("ip")
    ns = f"fm-test-{secrets.token_hex(4)}"
    run = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True, text=True, timeout=20)  # noqa: E731
    run("netns", "add", ns)
    try:
        run("-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
        run("-n", ns, "link", "set", "veth0", "up")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _NS_SCRIPT], check=True,
                             capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO))
        got = json.loads(out.stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
    assert "unavailable" in got and "not supported" in got["unavailable"].lower()
    assert got["errors"] == 0, got["messages"]
    # veth has an mtu (1500 < 9000) but no MLNX_OFED ecn directory and no dcbnl
    assert got["checks"] == {"mtu": 0.0}


def test_agent_config_supplies_profile_and_ethtool_dir(tmp_path: Path) -> None:
    from fabricmon.agent.runtime import source_context
    from fabricmon.config import AgentConfig
    from fabricmon.sources.fabric_config import SOURCE

    root = gen_fixture(tmp_path / "fx", "--layout", "roce", "--fault", "none", "--seed", "2")
    cfg = AgentConfig(sysfs_root=str(root / "sys"), ethtool_dir=str(root / "ethtool"),
                      profile=ProfileConfig(trust="pcp", mtu=9216))
    src = SOURCE.build(cfg.sources.fabric_config, source_context(cfg))  # as agent/runtime.py builds it
    assert src.ethtool_dir == cfg.ethtool_dir and src.profile.trust == "pcp"
    res = src.poll(discover(cfg.sysfs_root))
    bad = {dict(r.labels)["check"] for r in res.readings if r.value == 0.0}
    assert bad == {"trust", "mtu"} and res.errors == 0
