"""Golden exposition per driver family: every fabric-relevant name lands, with its value, in the
curated family the detectors read.

The trees under tests/fixtures/drivers/ are laid out as extracted ``fabricmon collect`` archives
(names generated the way each driver generates them; see the README there).  Each test discovers
the tree like the agent does, polls the real sources, tracks and renders the exposition, and
checks a hand-written expectation (raw name -> family and labels) against the values in the
fixture files: the expectation is written here, independently of fabricmon's driver tables.
Regenerate the .prom goldens after an intended change: ``FABRICMON_UPDATE_GOLDEN=1 pytest
tests/sources/test_driver_families.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fabricmon.agent.exporter import exposition
from fabricmon.counters import CounterTracker
from fabricmon.model import Snapshot
from fabricmon.sources.ethtool import EthtoolSource, parse_ethtool_stats
from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import discover
from support import paths
from support.paths import REPO

FIXTURES = paths.FIXTURES / "drivers"
GOLDEN = paths.GOLDEN / "drivers"  # one per fixture tree (not golden_cases.py)
UPDATE = os.environ.get("FABRICMON_UPDATE_GOLDEN") == "1"
PAUSE_FRAMES = "fabricmon_pfc_pause_frames_total"
PAUSE_SECONDS = "fabricmon_pfc_pause_seconds_total"
RETRIES = "fabricmon_rdma_transport_retries_total"
PHY = "fabricmon_netdev_phy_errors_total"


def poll_tree(tree: str) -> tuple[dict, str, object]:
    """Samples of one poll of a fixture tree: {(family, frozenset(labels)): value}, the exposition, inventory."""
    node = FIXTURES / tree / "node"
    inv = discover(str(node / "sys"))
    assert not inv.errors, inv.errors
    results = [InfinibandSource(timeout=1.0).poll(inv)]
    if (node / "ethtool").is_dir():
        results.append(EthtoolSource(ethtool_dir=str(node / "ethtool")).poll(inv))
    assert [m for r in results for m in r.messages] == []  # the tree reads cleanly, as a collected node would
    readings = [x for r in results for x in r.readings]
    keys = [(x.family, x.labels) for x in readings]
    assert len(keys) == len(set(keys)), "a series exported twice"
    samples, _, sat = CounterTracker().process(readings, 1.0)
    snap = Snapshot("node-x", 1.0, 1, tuple(samples) + tuple(sat), (), 0.0, ())
    got = {(s.family, frozenset(s.labels)): s.value for s in samples}
    return got, exposition(snap, now=1.0).decode(), inv


def ethtool_values(tree: str, iface: str) -> dict[str, int]:
    return dict(parse_ethtool_stats((FIXTURES / tree / "node" / "ethtool" / f"{iface}.txt").read_text()))


def hw_value(tree: str, dev: str, name: str) -> int:
    return int((FIXTURES / tree / "node/sys/class/infiniband" / dev / "ports/1/hw_counters" / name).read_text())


def check(got: dict, family: str, value: float, **labels: str) -> None:
    key = (family, frozenset(labels.items()))
    assert key in got, f"{family}{labels} not exported; have {sorted(k for k in got if k[0] == family)[:6]}"
    assert got[key] == pytest.approx(value, rel=1e-12), (family, labels)


def golden(tree: str, body: str) -> None:
    path = GOLDEN / f"{tree}.prom"
    lines = [ln for ln in body.splitlines() if not ln.startswith("fabricmon_collector_duration")]
    text = "\n".join(lines) + "\n"
    if UPDATE:
        path.write_text(text)
    here = Path(__file__).resolve().relative_to(REPO)
    assert path.exists(), f"{path.name} missing: run FABRICMON_UPDATE_GOLDEN=1 pytest {here}"
    assert text == path.read_text(), f"{path.name} differs (FABRICMON_UPDATE_GOLDEN=1 regenerates it)"


def bnxt_en_expect(got: dict, tree: str, iface: str) -> None:
    v = ethtool_values(tree, iface)
    for p in range(8):
        for d in ("rx", "tx"):
            check(got, PAUSE_FRAMES, v[f"{d}_pfc_ena_frames_pri{p}"], interface=iface, priority=str(p), direction=d)
            check(got, PAUSE_SECONDS, v[f"pfc_pri{p}_{d}_duration_us"] * 1e-6, interface=iface, priority=str(p),
                  direction=d)
        check(got, "fabricmon_pfc_pause_transitions_total", v[f"pfc_pri{p}_rx_transitions"], interface=iface,
              priority=str(p))
        check(got, PHY, v[f"rx_discard_packets_cos{p}"], interface=iface, counter=f"rx_discard_packets_cos{p}")
    for d in ("rx", "tx"):
        check(got, "fabricmon_global_pause_frames_total", v[f"{d}_pause_frames"], interface=iface, direction=d)
        check(got, "fabricmon_netdev_pause_control_frames_total", v[f"{d}_pfc_frames"], interface=iface, direction=d)
    check(got, "fabricmon_pfc_pause_storm_events_total", v["continuous_roce_pause_events"], interface=iface,
          level="continuous_roce")
    check(got, "fabricmon_pfc_pause_storm_events_total", v["continuous_pause_events"], interface=iface,
          level="continuous")
    # FCS and PCS errors under the names the link-error detector reads; FEC over its denominator
    check(got, PHY, v["rx_fcs_err_frames"], interface=iface, counter="rx_crc_errors_phy")
    check(got, PHY, v["rx_pcs_symbol_err"], interface=iface, counter="rx_pcs_symbol_err_phy")
    check(got, PHY, v["link_down_events"], interface=iface, counter="link_down_events_phy")
    check(got, PHY, v["rx_fec_corrected_blocks"], interface=iface, counter="rx_fec_corrected_blocks")
    check(got, PHY, v["rx_fec_uncorrectable_blocks"], interface=iface, counter="rx_fec_uncorrectable_blocks")
    check(got, "fabricmon_netdev_phy_corrected_bit_total", v["rx_corrected_bits"], interface=iface)
    check(got, "fabricmon_netdev_phy_received_bit_total", v["rx_bits"], interface=iface)
    check(got, "fabricmon_ethtool_unclassified_stats", 0, interface=iface, driver="bnxt_en")


@pytest.mark.parametrize("tree,gen", [("bnxt-thor2-gen1", 1), ("bnxt-thor2-gen2", 2)])
def test_broadcom_bnxt_en_and_bnxt_re(tree: str, gen: int) -> None:
    got, body, inv = poll_tree(tree)
    # rails although hca_type is the node description ("gpu-b07-02 bnxt_re0"), one per NIC
    assert {d.name: d.rail for d in inv.devices} == {"bnxt_re0": "0", "bnxt_re1": "1"}
    for i, iface in enumerate(("ens41f0np0", "ens42f0np0")):
        bnxt_en_expect(got, tree, iface)
        dev = f"bnxt_re{i}"
        dp = {"device": dev, "port": "1"}
        # retries and congestion: old names under the names the 2025 rename gave the same counters
        names = ({"to_retransmits": "local_ack_timeout_err", "seq_err_naks_rcvd": "packet_seq_err",
                  "rnr_naks_rcvd": "rnr_nak_retry_err", "missing_resp": "implied_nak_seq_err",
                  "dup_req": "duplicate_request", "oos_drop_count": "out_of_sequence"} if gen == 1 else
                 {n: n for n in ("local_ack_timeout_err", "packet_seq_err", "rnr_nak_retry_err",
                                 "implied_nak_seq_err", "duplicate_request", "out_of_sequence")})
        for raw, canonical in names.items():
            check(got, RETRIES, hw_value(tree, dev, raw), counter=canonical, **dp)
            check(got, "fabricmon_rdma_hw_stat_total", hw_value(tree, dev, raw), counter=raw, **dp)
        cc = ({"tx_cnp_pkts": "fabricmon_roce_cnp_sent_total", "rx_cnp_pkts": "fabricmon_roce_cnp_handled_total",
               "rx_ecn_marked_pkts": "fabricmon_roce_ecn_marked_packets_total"} if gen == 1 else
              {"np_cnp_pkts": "fabricmon_roce_cnp_sent_total", "rp_cnp_handled": "fabricmon_roce_cnp_handled_total",
               "np_ecn_marked_roce_packets": "fabricmon_roce_ecn_marked_packets_total"})
        for raw, family in cc.items():
            check(got, family, hw_value(tree, dev, raw), **dp)
        # levels are gauges, high-water marks too: never in the counter family
        for raw in ("active_qps", "active_cqs", "active_mrs", "db_fifo_register"):
            check(got, "fabricmon_rdma_hw_stat_level", hw_value(tree, dev, raw), counter=raw, **dp)
            assert ("fabricmon_rdma_hw_stat_total", frozenset({**dp, "counter": raw}.items())) not in got
        check(got, "fabricmon_rdma_hw_stat_high_water", hw_value(tree, dev, "watermark_qps"), counter="watermark_qps",
              **dp)
        check(got, "fabricmon_rdma_hw_stat_unclassified", 0, device=dev)
        # the netdev says 400000 Mb/s; the sysfs rate is stale (gen1: 1X SDR, gen2: 4X EDR)
        check(got, "fabricmon_ib_port_data_rate_bytes_per_second", 400e9 / 8, **dp)
        assert ("fabricmon_ib_port_width_lanes", frozenset(dp.items())) not in got
    if gen == 2:
        # a u64 under a name mlx5 has as a 32-bit Q counter: above 2^32, exported, not refused
        v = hw_value(tree, "bnxt_re0", "rx_write_requests")
        assert v > 1 << 32
        check(got, "fabricmon_rdma_hw_stat_total", v, device="bnxt_re0", port="1", counter="rx_write_requests")
    golden(tree, body)


def test_intel_ice_and_irdma() -> None:
    tree, iface, dev = "ice-irdma-e810", "ens801f0np0", "irdma0"
    got, body, _ = poll_tree(tree)
    v = ethtool_values(tree, iface)
    for tc in range(8):  # the priorities of one traffic class count together: labelled traffic_class
        for d in ("rx", "tx"):
            for kind in ("xoff", "xon"):
                check(got, "fabricmon_pfc_frames_by_traffic_class_total", v[f"{d}_priority_{tc}_{kind}.nic"],
                      interface=iface, traffic_class=str(tc), direction=d, type=kind)
    assert not [k for k in got if k[0] == PAUSE_FRAMES and dict(k[1])["interface"] == iface]
    # no pause time: the denominator of pause by frames, 100 Gb/s over the 0x7FFF-quanta XOFF refresh
    check(got, "fabricmon_pfc_xoff_refresh_frames_per_second", 100e9 / (0x7FFF * 512), interface=iface)
    check(got, "fabricmon_global_pause_frames_total", v["link_xoff_rx.nic"], interface=iface, direction="rx")
    check(got, "fabricmon_global_pause_frames_total", v["link_xoff_tx.nic"], interface=iface, direction="tx")
    check(got, PHY, v["rx_crc_errors.nic"], interface=iface, counter="rx_crc_errors_phy")
    for raw in ("mac_local_faults.nic", "mac_remote_faults.nic", "illegal_bytes.nic"):
        check(got, PHY, v[raw], interface=iface, counter=raw)
    for raw, canonical in (("rx_length_errors.nic", "rx_in_range_len_errors_phy"),
                           ("rx_oversize.nic", "rx_oversize_pkts_phy"), ("rx_jabber.nic", "rx_jabbers_phy"),
                           ("rx_fragments.nic", "rx_fragments_phy"), ("rx_undersize.nic", "rx_undersize_pkts_phy")):
        check(got, PHY, v[raw], interface=iface, counter=canonical)
    # the standard groups (ens801f0np0.groups.json): ice fills them from the same registers, so they
    # add one series (RMON oversize) and double none
    check(got, PHY, v["rx_oversize.nic"], interface=iface, counter="rmon/etherStatsOversizePkts")
    check(got, "fabricmon_ethtool_unclassified_stats", 0, interface=iface, driver="ice")
    dp = {"device": dev, "port": "1"}
    check(got, "fabricmon_roce_cnp_sent_total", hw_value(tree, dev, "cnpSent"), **dp)
    check(got, "fabricmon_roce_cnp_handled_total", hw_value(tree, dev, "cnpHandled"), **dp)
    check(got, "fabricmon_roce_cnp_ignored_total", hw_value(tree, dev, "cnpIgnored"), **dp)
    check(got, "fabricmon_roce_ecn_marked_packets_total", hw_value(tree, dev, "RxECNMrkd"), **dp)
    check(got, RETRIES, hw_value(tree, dev, "tcpRetransSegs"), counter="tcpRetransSegs", **dp)
    check(got, "fabricmon_rdma_hw_stat_unclassified", 0, device=dev)
    check(got, "fabricmon_ib_port_data_rate_bytes_per_second", 100e9 / 8, **dp)
    golden(tree, body)


def test_aws_efa() -> None:
    tree, dev = "efa-p5", "efa_0"
    got, body, _ = poll_tree(tree)
    dp = {"device": dev, "port": "1"}
    for raw in ("retrans_pkts", "retrans_timeout_events", "impaired_remote_conn_events", "unresponsive_remote_events"):
        check(got, RETRIES, hw_value(tree, dev, raw), counter=raw, **dp)
    check(got, "fabricmon_rdma_hw_stat_total", hw_value(tree, dev, "rx_drops"), counter="rx_drops", **dp)
    check(got, "fabricmon_rdma_hw_stat_unclassified", 0, device=dev)
    golden(tree, body)


def test_an_unknown_name_is_counted_logged_once_and_raw_only_through_the_allowlist(tmp_path, capsys) -> None:
    import re

    from fabricmon.config import EthtoolConfig
    from fabricmon.sources.inventory import Inventory

    eth = tmp_path / "ethtool"
    eth.mkdir()
    (eth / "eth9.txt").write_text("NIC statistics:\n     rx_fcs_err_frames: 5\n     rx_new_fancy_thing: 42\n")
    inv = Inventory(str(tmp_path), extra_netdevs=("eth9",))
    src = EthtoolSource(config=EthtoolConfig(allow=(r"^rx_new_",)), ethtool_dir=str(eth))
    for _ in range(2):
        res = src.poll(inv)
    vals = {(r.family, r.labels): r.value for r in res.readings}
    assert vals[("fabricmon_ethtool_unclassified_stats", (("interface", "eth9"), ("driver", "unknown")))] == 1
    assert vals[("fabricmon_ethtool_stat", (("interface", "eth9"), ("stat", "rx_new_fancy_thing")))] == 42
    assert vals[(PHY, (("interface", "eth9"), ("counter", "rx_crc_errors_phy")))] == 5
    assert vals[("fabricmon_ethtool_up", (("interface", "eth9"),))] == 1.0
    out = capsys.readouterr().out + capsys.readouterr().err
    assert len(re.findall(r"ethtool_unclassified_stats", out)) == 1, out
    assert "rx_new_fancy_thing" in out


def test_ber_uses_the_drivers_own_denominator_where_it_has_one() -> None:
    """bnxt_en counts rx_bits: BER is rx_corrected_bits over rx_bits, not over the nominal data rate."""
    from fabricmon.agent.margins import BER, link_margins
    from fabricmon.model import CounterDelta, Sample
    from fabricmon.sources.inventory import Inventory, PortInfo

    inv = Inventory("/nonexistent", ports=(PortInfo("bnxt_re0", "1", "/x", "Ethernet", "ens41f0np0", "0"),
                                           PortInfo("mlx5_0", "1", "/y", "Ethernet", "eth0", "1")))
    rate = 400e9 / 8
    samples = (Sample("fabricmon_ib_port_data_rate_bytes_per_second", (("device", "bnxt_re0"), ("port", "1")), rate),
               Sample("fabricmon_ib_port_data_rate_bytes_per_second", (("device", "mlx5_0"), ("port", "1")), rate))
    deltas = (CounterDelta("fabricmon_netdev_phy_corrected_bit_total", (("interface", "ens41f0np0"),), 30.0),
              CounterDelta("fabricmon_netdev_phy_received_bit_total", (("interface", "ens41f0np0"),), 3e11),
              CounterDelta("fabricmon_netdev_phy_corrected_bit_total", (("interface", "eth0"),), 40.0))
    snap = Snapshot("n", 2.0, 2, samples, deltas, 1.0, (), {"inventory": inv})
    ber = {dict(s.labels)["interface"]: s.value for s in link_margins(snap) if s.family == BER}
    assert ber["ens41f0np0"] == pytest.approx(30.0 / 3e11)  # the link carried 3e11 bits, not 4e11
    assert ber["eth0"] == pytest.approx(40.0 / 400e9)  # mlx5: no rx_bits_phy, the data rate stands in


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
@pytest.mark.parametrize("tree", ["bnxt-thor2-gen1", "bnxt-thor2-gen2", "ice-irdma-e810", "efa-p5"])
def test_driver_expositions_are_promtool_clean(tree: str) -> None:
    _, body, _ = poll_tree(tree)
    proc = subprocess.run(["promtool", "check", "metrics"], input=body.encode(), capture_output=True, timeout=60)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), (proc.stdout + proc.stderr).decode()


def test_renamed_rdma_device_is_known_by_its_driver_link_and_unknown_files_are_counted(tmp_path, capsys) -> None:
    """rdma-core's udev rules rename devices (rdmap16s0): the PCI driver link still says efa.  A hw_counters
    file no table knows is exported as a 64-bit counter, counted per device and logged once."""
    node = tmp_path / "node"
    shutil.copytree(FIXTURES / "efa-p5" / "node", node, symlinks=True)
    ib = node / "sys/class/infiniband"
    (ib / "efa_0").rename(ib / "rdmap16s0")
    (ib / "rdmap16s0/ports/1/hw_counters/brand_new_counter").write_text("77\n")
    inv = discover(str(node / "sys"))
    src = InfinibandSource(timeout=1.0)
    for _ in range(2):
        res = src.poll(inv)
    v = {(r.family, r.labels): r.value for r in res.readings}
    dp = (("device", "rdmap16s0"), ("port", "1"))
    assert v[(RETRIES, dp + (("counter", "retrans_timeout_events"),))] == hw_value("efa-p5", "efa_0",
                                                                                     "retrans_timeout_events")
    assert v[("fabricmon_rdma_hw_stat_total", dp + (("counter", "brand_new_counter"),))] == 77
    assert v[("fabricmon_rdma_hw_stat_unclassified", (("device", "rdmap16s0"),))] == 1
    out = capsys.readouterr()
    assert (out.out + out.err).count("rdma_hw_stat_unclassified") == 1
