"""Config checks against what real mlx5 hosts report (drivers/infiniband/hw/mlx5/main.c, dcbnl, mlnx_qos)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fabricmon.config import ProfileConfig
from fabricmon.metrics import SPECS
from fabricmon.sources.ethtool import PfcInfo, parse_pfc_summary
from fabricmon.sources.fabric_config import (
    FAMILY,
    TRUST_UNKNOWN,
    UNKNOWN_FAMILY,
    FabricConfigSource,
    PortFacts,
    evaluate,
    parse_dcb_ieee,
)
from fabricmon.sources.inventory import Inventory, PortInfo
from support.realformat import fixture, text


def poll(tree: str, ports: list[tuple[str, str, str, str]], **kw) -> dict:
    root = fixture("sysfs", tree)
    infos = tuple(PortInfo(dev, port, str(root / "class/infiniband" / dev / "ports" / port), ll, "", "0")
                  for dev, port, ll, _ in ports)
    res = FabricConfigSource(ethtool_dir=str(fixture("ethtool")), **kw).poll(Inventory(str(root), ports=infos))
    assert res.errors == 0, res.messages
    out = {}
    for r in res.readings:
        assert tuple(k for k, _ in r.labels) == SPECS[r.family].labels
        key = (r.family, dict(r.labels)["device"], dict(r.labels)["port"], dict(r.labels)["check"])
        assert key not in out, f"duplicate series {key}"
        out[key] = r.value
    return out


def test_dual_port_hca_gives_one_series_per_port():
    got = poll("mlx5-dualport-ib", [("mlx5_0", "1", "InfiniBand", ""), ("mlx5_0", "2", "InfiniBand", "")])
    assert got == {(FAMILY, "mlx5_0", p, c): 1.0 for p in ("1", "2") for c in ("rate", "width")}


@pytest.mark.parametrize("tree,gbps", [("mlx5-roce-400gaui8", 400.0), ("mlx5-roce-200gaui2", 200.0)])
def test_roce_lane_modes_in_ib_clothing_are_not_a_width_fault(tree, gbps):
    # mlx5 reports 400GAUI-8 as "8X HDR" and 200GAUI-2 as "2X NDR": healthy links, not degraded ones.
    got = poll(tree, [("mlx5_0", "1", "Ethernet", "")], profile=ProfileConfig(rate_gbps=gbps))
    assert got == {(FAMILY, "mlx5_0", "1", "rate"): 1.0}


def test_dcb_app_table_dscp_pcp_and_empty():
    def trust(name: str) -> str | None:
        return parse_dcb_ieee(bytes.fromhex(text("dcb", name).strip())).trust
    assert trust("ieee-get-pf-trust-dscp.hex") == "dscp"
    assert trust("ieee-get-trust-pcp-ethertype-app.hex") == "pcp"
    # a VF (or a port without DSCP support) answers with an empty APP table
    assert trust("ieee-get-vf-empty-app-table.hex") == TRUST_UNKNOWN
    assert parse_dcb_ieee(bytes.fromhex(text("dcb", "ieee-get-vf-empty-app-table.hex").strip())).pfc_enabled == {3}


def test_unknown_trust_is_not_drift():
    good = PortFacts("Ethernet", 4, 400.0, 4, 9000, True, True, PfcInfo("dscp", frozenset({3})))
    verdict = evaluate(replace(good, pfc=PfcInfo(TRUST_UNKNOWN, frozenset({3}))), ProfileConfig())
    assert verdict["trust"] is None and verdict["pfc"] is True


def test_vf_trust_exported_as_unknown(tmp_path):
    root = fixture("sysfs", "mlx5-roce-400gaui8")
    port = PortInfo("mlx5_0", "1", str(root / "class/infiniband/mlx5_0/ports/1"), "Ethernet", "enp94s0f0np0", "0")
    vf = PfcInfo(TRUST_UNKNOWN, frozenset({3}))
    src = FabricConfigSource(dcb_reader=lambda _i: vf, profile=ProfileConfig(rate_gbps=400.0))
    res = src.poll(Inventory(str(tmp_path), ports=(port,)))
    got = {(r.family, dict(r.labels)["check"]): r.value for r in res.readings}
    assert got[(UNKNOWN_FAMILY, "trust")] == 1.0
    assert (FAMILY, "trust") not in got and got[(FAMILY, "pfc")] == 1.0


def test_mlnx_qos_capture_parses():
    info = parse_pfc_summary(text("ethtool", "mlnx_qos-trust-dscp-pfc3.pfc.txt"))
    assert info == PfcInfo("dscp", frozenset({3}))
