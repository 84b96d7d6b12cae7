"""The real agent with ``--ib-switches`` sweeping an ibsim fabric with opensm, through the real
infiniband-diags (tests/support/ibsimrig.py): every cabled switch port exported with the exact values
ibsim's console set, a pulled uplink kept at ``fabricmon_switch_port_up 0`` on both of its ends, and a
switch whose MADs are dropped (ibsim's ``Error``) costing only its own series."""

from __future__ import annotations

import pytest

from support.agentrig import metric
from support.ibsimrig import IbSim, SweeperAgent, missing_tools, two_tier
from support.waiting import wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing_tools()), reason=f"not installed: {missing_tools()}")]

SWITCHES = ("leaf-00", "leaf-01", "spine-00", "spine-01")


def _guid(fabric, name: str) -> int:
    return next(g for g, n in fabric.nodes.items() if n.kind == "switch" and f";{name}:" in n.description)


def test_every_cabled_switch_port_exact_and_a_pulled_uplink_stays_down(tmp_path):
    fabric = two_tier(2, 2, 2)
    expect: dict[tuple[str, int], tuple[int, int, int]] = {}
    with IbSim(fabric, tmp_path / "sim") as sim:
        for k, name in enumerate(SWITCHES):
            guid = _guid(fabric, name)
            for port in sorted(fabric.nodes[guid].links):
                sym, wait, downed = 1000 + 10 * k + port, 70000 + 10 * k + port, 3 + k + port
                sim.performance_set(guid, port, "PortCounters.SymbolErrorCounter", sym)
                sim.performance_set(guid, port, "PortCounters.PortXmitWait", wait)
                sim.performance_set(guid, port, "PortCounters.LinkDownedCounter", downed)
                expect[(name, port)] = (sym, wait, downed)
        assert len(expect) == 12  # 2 hosts + 2 uplinks on each leaf, 2 leaves on each spine
        with SweeperAgent(sim, tmp_path / "agent", rediscover=2.0, timeout_ms=100) as agent:
            def exported():
                m = agent.metrics()
                return m if all(metric(m, "fabricmon_switch_port_up", switch=s, port=str(p)) is not None
                                and metric(m, "fabricmon_switch_port_errors_total", switch=s, port=str(p),
                                           counter="symbol_error") is not None for s, p in expect) else None

            m = wait_until(exported, 60.0, "every cabled switch port on /metrics")
            for (s, p), (sym, wait, downed) in expect.items():
                assert metric(m, "fabricmon_switch_port_errors_total", switch=s, port=str(p),
                              counter="symbol_error") == sym
                assert metric(m, "fabricmon_switch_port_errors_total", switch=s, port=str(p),
                              counter="link_downed") == downed
                assert metric(m, "fabricmon_switch_port_transmit_wait_total", switch=s, port=str(p)) == wait
                assert metric(m, "fabricmon_switch_port_up", switch=s, port=str(p)) == 1
                assert (metric(m, "fabricmon_switch_port_transmit_bytes_total", switch=s, port=str(p)) or 0) % 4 == 0
            names = {dict(labels)["switch"] for (n, labels) in m if n == "fabricmon_switch_port_up"}
            assert names == set(SWITCHES)
            assert metric(m, "fabricmon_switch_port_info", switch="leaf-00", port="4", peer="spine-01",
                          peer_port="1", peer_type="switch") == 1
            assert metric(m, "fabricmon_switch_port_info", switch="leaf-01", port="2", peer="node-003",
                          peer_type="host") == 1
            assert metric(m, "fabricmon_switches_unreachable") == 0
            assert (metric(m, "fabricmon_switch_queries_total", result="ok") or 0) > 0

            maps = agent.log.read_text().count("switch_map_refreshed")
            sim.unlink(_guid(fabric, "leaf-00"), 4)  # leaf-00's uplink to spine-01

            def down():
                mm = agent.metrics()
                return mm if (metric(mm, "fabricmon_switch_port_up", switch="leaf-00", port="4") == 0
                              and metric(mm, "fabricmon_switch_port_up", switch="spine-01", port="1") == 0) else None

            wait_until(down, 30.0, "the pulled uplink's both ends at fabricmon_switch_port_up 0")
            # still there, at 0, after the map was rediscovered without that link (rediscover: 2 s)
            wait_until(lambda: agent.log.read_text().count("switch_map_refreshed") > maps, 30.0, "a rediscovery")
            seen = wait_until(lambda: (mm := agent.metrics()) and (metric(
                mm, "fabricmon_switch_sweep_age_seconds") or 99) < 1 and mm, 30.0, "a fresh sweep")
            assert metric(seen, "fabricmon_switch_port_up", switch="leaf-00", port="4") == 0

            # with leaf-00's uplink to spine-01 pulled, spine-01 is reached only through leaf-01's port 4: every
            # MAD into spine-01 there dropped, its PMA times out; it costs its own series only, counted as
            # unreachable and as timeouts
            sim.error(_guid(fabric, "spine-01"), 2, 100)
            blind = wait_until(lambda: (mm := agent.metrics()) and metric(
                mm, "fabricmon_switches_unreachable") == 1 and mm, 60.0, "spine-01 unreachable")
            assert metric(blind, "fabricmon_switch_port_up", switch="spine-01", port="2") is None
            assert metric(blind, "fabricmon_switch_port_errors_total", switch="leaf-01", port="3",
                          counter="symbol_error") == expect[("leaf-01", 3)][0]
            assert (metric(blind, "fabricmon_switch_queries_total", result="timeout") or 0) >= 2
