"""The switch sweep's pure parts against the real tools' outputs (tests/fixtures/ib_switches/README.md:
infiniband-diags 44.0 against ibsim with opensm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricmon.counters import CounterTracker
from fabricmon.sources.ib_switches.fabric_map import merge_cables, switch_map
from fabricmon.sources.ib_switches.parse import (
    ParseError,
    failure_kind,
    parse_iblinkinfo,
    parse_perfquery,
    parse_portinfo,
    port_sample,
)
from fabricmon.sources.ib_switches.source import port_readings
from fabricmon.topology_import.ibnetdiscover import parse_ibnetdiscover

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ib_switches"


def _read(name: str) -> str:
    return (FIX / name).read_text()


def test_per_port_counters_exact_values_and_widths():
    basic = {b.port: b for b in parse_perfquery(_read("perfquery-l.out"))}
    ext = {b.port: b for b in parse_perfquery(_read("perfquery-x-l.out"))}
    assert sorted(basic) == sorted(ext) == list(range(1, 9))
    assert all(b.lid == 2 and not b.extended for b in basic.values())
    assert all(b.extended and not b.errors() for b in ext.values())  # CapMask2 0: no 64-bit error counters
    p3 = port_sample(ext[3], basic[3])
    assert p3.errors["symbol_error"] == (1234, 16)
    assert p3.xmit_wait == (77, 32)
    assert port_sample(ext[1], basic[1]).errors["link_downed"] == (255, 8)  # 300 clamped by ibsim's PMA
    # set to 123456789012 beyond 32 bits, then advanced by the MADs that crossed the port before the read
    value, width = port_sample(ext[2], basic[2]).xmit_data or (0, 0)
    assert width == 64 and 123456789012 <= value < 123456789012 + 10_000
    assert len(p3.errors) == 12


def test_all_port_select_is_one_block_of_sums():
    (block,) = parse_perfquery(_read("perfquery-a.out"))
    assert block.port == 255
    errs = {k: v for k, (v, _w) in block.errors().items()}
    assert errs["symbol_error"] == 1234 and errs["link_downed"] == 255


def test_port_info_states():
    assert parse_portinfo(_read("smpquery-portinfo-active.out")).up
    down = parse_portinfo(_read("smpquery-portinfo-down.out"))
    assert (down.link, down.physical, down.up) == ("Down", "Polling", False)


def test_link_walk_states_of_every_switch_port():
    walked = parse_iblinkinfo(_read("iblinkinfo-switches-line.out"))
    leaf0, spine1 = 0x0C42B0000000, 0x0C42C0000001
    assert len(walked) == 4 and all(sorted(p) == list(range(1, 9)) for p in walked.values())
    assert (walked[leaf0][4].link, walked[leaf0][4].physical) == ("Down", "Polling")  # the unlinked cable
    assert not walked[spine1][1].up and walked[leaf0][3].up and walked[leaf0][1].up
    assert sum(st.up for p in walked.values() for st in p.values()) == 10  # 12 cabled ports, one cable pulled
    with pytest.raises(ParseError):
        parse_iblinkinfo(_read("smpquery-portinfo-active.out"))
    with pytest.raises(ParseError):
        parse_iblinkinfo("")


def test_unreachable_switch_is_a_timeout_and_garbage_is_refused():
    assert failure_kind(_read("perfquery-unreachable.err")) == "timeout"
    assert failure_kind("perfquery: iberror: failed: can't resolve destination port 0") == "error"
    with pytest.raises(ParseError):
        parse_perfquery(_read("smpquery-portinfo-active.out").replace("# Port info", "Port info"))
    with pytest.raises(ParseError):
        parse_perfquery("")


def test_switch_map_names_lids_and_cables_by_the_import_rules():
    switches = {s.name: s for s in switch_map(parse_ibnetdiscover(_read("ibnetdiscover-cache.out")))}
    assert sorted(switches) == ["leaf-00", "leaf-01", "spine-00", "spine-01"]
    leaf = switches["leaf-00"]
    assert leaf.lid == 2 and leaf.guid_text == "0x00000c42b0000000"
    assert {p: (c.peer, c.peer_port, c.peer_type) for p, c in leaf.cables.items()} == {
        1: ("node-000", 1, "host"), 2: ("node-001", 1, "host"), 3: ("spine-00", 1, "switch"),
        4: ("spine-01", 1, "switch")}
    assert all(s.lid > 0 for s in switches.values())


def test_node_name_map_renames_switches_and_a_vanished_cable_is_kept():
    fabric = parse_ibnetdiscover(_read("ibnetdiscover-cache.out"))
    renamed = {s.guid: s.name for s in switch_map(fabric, {0x0C42B0000000: "leaf-a3"})}
    assert renamed[0x0C42B0000000] == "leaf-a3"
    old = switch_map(fabric)
    new = switch_map(fabric)
    leaf = next(s for s in new if s.name == "leaf-00")
    del leaf.cables[4]  # the port went down: a fresh ibnetdiscover no longer shows its link
    merged = {s.name: s for s in merge_cables(new, old)}
    assert merged["leaf-00"].cables[4].peer == "spine-01"


def test_bytes_are_words_times_four_and_a_cleared_counter_is_a_reset():
    ext = {b.port: b for b in parse_perfquery(_read("perfquery-x-l.out"))}
    basic = {b.port: b for b in parse_perfquery(_read("perfquery-l.out"))}
    tracker = CounterTracker()
    samples, _, _ = tracker.process(port_readings("leaf-00", 3, port_sample(ext[3], basic[3])), 0.0)
    by = {(s.family, dict(s.labels).get("counter")): s.value for s in samples}
    assert by[("fabricmon_switch_port_errors_total", "symbol_error")] == 1234
    words = ext[3].values["PortXmitData"]
    assert by[("fabricmon_switch_port_transmit_bytes_total", None)] == 4 * words
    # someone ran perfquery -R (or ibqueryerrors -k): the counter restarts from a small value
    basic[3].values["SymbolErrorCounter"] = 5
    samples, deltas, _ = tracker.process(port_readings("leaf-00", 3, port_sample(ext[3], basic[3])), 1.0)
    by = {(s.family, dict(s.labels).get("counter")): s.value for s in samples}
    assert by[("fabricmon_switch_port_errors_total", "symbol_error")] == 1239  # monotonic, never backwards
    d = next(d for d in deltas if dict(d.labels).get("counter") == "symbol_error")
    assert d.delta == 5 and d.reset
