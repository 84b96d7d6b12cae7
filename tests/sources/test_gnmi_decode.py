"""The gNMI decoders, pure: paths with ``/`` inside keys, RFC 7951 JSON (module prefixes, uint64 as
strings), SONiC DB rows (``<port>:<queue>``, CONFIG_DB ``<ports>|<queues>`` lists and ranges) and what
counts as malformed.  Values and shapes from the fixtures (tests/fixtures/gnmi/README.md)."""

from __future__ import annotations

import json

from fabricmon.proto import gnmi_pb2
from fabricmon.sources.gnmi_switches import profiles
from fabricmon.sources.gnmi_switches.decode import decode, parse_path, path_text
from support.gnmitarget import load_fixture


def _note(prefix: str, updates: dict, target: str = "") -> gnmi_pb2.Notification:
    n = gnmi_pb2.Notification(prefix=parse_path(prefix, target=target))
    for path, value in updates.items():
        val = (gnmi_pb2.TypedValue(uint_val=value) if isinstance(value, int) else
               gnmi_pb2.TypedValue(string_val=value) if isinstance(value, str) else
               gnmi_pb2.TypedValue(json_ietf_val=json.dumps(value).encode()))
        n.update.add(path=parse_path(path), val=val)
    return n


def test_a_slash_inside_a_key_does_not_split_the_path():
    p = parse_path("/interfaces/interface[name=Ethernet1/1]/state/counters")
    assert [e.name for e in p.elem] == ["interfaces", "interface", "state", "counters"]
    assert dict(p.elem[1].key) == {"name": "Ethernet1/1"}
    assert path_text(p) == "/interfaces/interface[name=Ethernet1/1]/state/counters"


def test_openconfig_fixture_decodes_every_modelled_leaf():
    points = []
    for n in load_fixture("openconfig"):
        d = decode("openconfig", _note(n["prefix"], n["updates"]), "")
        assert d.malformed == 0, d.notes
        points += d.points
    fams = {(p.family, dict(p.labels).get("counter")) for p in points}
    assert {(profiles.ERRORS, c) for c in ("in_errors", "in_discards", "out_discards", "fcs",
                                          "fec_uncorrectable")} <= fams
    assert {(profiles.QUEUE_DROPS, None), (profiles.ECN_MARKED, None), (profiles.PAUSE, None),
            (profiles.RX_POWER, None), (profiles.PRE_FEC_BER, None), (profiles.PORT_UP, None)} <= fams
    # in-pkts, carrier-transitions, out-errors: leaves no family reads are skipped, not malformed
    assert all(p.port in ("Ethernet1/1", "Ethernet1/2") for p in points)


def test_sonic_rows_lists_and_ranges():
    d = decode("sonic", _note("", {"QUEUE": {"Ethernet0,Ethernet4|3-4": {"wred_profile": "[WRED_PROFILE|LOSSLESS]"},
                                             "Ethernet8|0": {"scheduler": "s0"}}}, "CONFIG_DB"), "CONFIG_DB")
    assert d.queue_wred == {("Ethernet0", 3): "LOSSLESS", ("Ethernet0", 4): "LOSSLESS",
                            ("Ethernet4", 3): "LOSSLESS", ("Ethernet4", 4): "LOSSLESS", ("Ethernet8", 0): ""}
    d = decode("sonic", _note("", {"PORT_QOS_MAP": {"Ethernet0": {"pfc_enable": "3,4"},
                                                    "Ethernet4": {"pfc_enable": "9"}}}, "CONFIG_DB"), "CONFIG_DB")
    assert d.pfc_enable == {"Ethernet0": frozenset({3, 4})} and d.malformed == 1
    # one field of one row (gnmi_get of COUNTERS/Ethernet9/SAI_PORT_STAT_PFC_7_RX_PKTS: a string_val)
    d = decode("sonic", _note("", {"COUNTERS/Ethernet9/SAI_PORT_STAT_PFC_7_RX_PKTS": "12"}, "COUNTERS_DB"),
               "COUNTERS_DB")
    assert [(p.family, p.labels, p.value) for p in d.points] == [
        (profiles.PFC, (("port", "Ethernet9"), ("priority", "7"), ("direction", "rx")), 12)]


def test_malformed_values_are_counted_and_the_rest_kept():
    n = _note("/interfaces/interface[name=Ethernet1/1]/state/counters",
              {"in-errors": "-3", "in-discards": 5, "out-discards": "18446744073709551616"})
    n.update.add(path=parse_path("in-fcs-errors"), val=gnmi_pb2.TypedValue(json_ietf_val=b"{oops"))
    d = decode("openconfig", n, "")
    assert d.malformed == 3 and len(d.notes) == 3
    assert [(dict(p.labels)["counter"], p.value) for p in d.points] == [("in_discards", 5)]
    d = decode("sonic", _note("", {"COUNTERS/Ethernet*/Queues": {"Ethernet0": {"SAI_QUEUE_STAT_DROPPED_PACKETS": "1"}}},
                              "COUNTERS_DB"), "COUNTERS_DB")
    assert d.malformed == 1 and not d.points  # a queue row must be <port>:<queue>


def test_every_profile_subscribes_a_bounded_set_of_paths():
    for groups in profiles.PROFILE_GROUPS.values():
        assert 0 < sum(len(g.paths) for g in groups) <= profiles.MAX_PATHS <= 16


def test_a_switch_sending_more_series_than_max_series_is_bounded_and_counted():
    from fabricmon.sources.gnmi_switches.decode import Decoded, Point
    from fabricmon.sources.gnmi_switches.store import SwitchStore

    store = SwitchStore("leaf-01", "sonic", max_series=100)
    d = Decoded(points=[Point(profiles.QUEUE_DROPS, (("port", f"Ethernet{i}"), ("queue", "3")), i, profiles.COUNTER,
                              f"Ethernet{i}") for i in range(150)])
    notes = store.apply(d, 1000.0)
    view = store.view()
    assert len(view.readings) == 100 and view.failures["series_limit"] == 50
    assert notes == ["50 series refused: max_series 100 reached"]
    # a known series still updates at the bound; the refused ones stay refused
    store.apply(Decoded(points=[Point(profiles.QUEUE_DROPS, (("port", "Ethernet0"), ("queue", "3")), 7,
                                      profiles.COUNTER, "Ethernet0")]), 1001.0)
    assert [r.value for r in store.view().readings if dict(r.labels)["port"] == "Ethernet0"] == [7]
    store.lost("stalled", "no message")  # a session that ended costs every series of the switch
    assert store.view().readings == [] and store.view().failures["stalled"] == 1
