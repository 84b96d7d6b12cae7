"""The sweep schedule with the tools' real outputs served by a stand-in runner (fixtures:
tests/fixtures/ib_switches/README.md): bounded queries in flight, one deadline per query, never a
clearing flag, the map not rediscovered per sweep, an unreachable switch costing only its own series."""

from __future__ import annotations

from fabricmon.config import IbSwitchesConfig
from fabricmon.sources.ib_switches.source import IbSwitchesSource, sweep_readings
from fabricmon.sources.ib_switches.tools import ToolRun
from fabricmon.sources.inventory import Inventory
from support.ibtools import CLEARING, Clock, FakeTools, make_sweeper


def test_queries_are_bounded_have_deadlines_and_never_clear():
    tools, clock = FakeTools(), Clock()
    sw = make_sweeper(tools, clock, concurrency=2, timeout_ms=250)
    snap = sw.sweep_once()
    assert len(snap.switches) == 4 and snap.unreachable == 0
    assert tools.max_in_flight <= 2
    assert all(d == 4 * 0.25 + 2.0 for a, d in tools.calls if a[0] != "iblinkinfo")
    assert [d for a, d in tools.calls if a[0] == "iblinkinfo"] == [10.0]  # the walk: one health interval
    assert not any(CLEARING & set(argv) for argv, _ in tools.calls)
    assert not any("-G" in argv for argv, _ in tools.calls)  # by LID from the map, no SA query per call
    assert all(["-t", "250"] == argv[argv.index("-t"):argv.index("-t") + 2] for argv, _ in tools.calls)
    sw.stop()


def test_map_kept_between_sweeps_and_full_read_only_when_due():
    tools, clock = FakeTools(), Clock()
    sw = make_sweeper(tools, clock, health_interval=10, full_interval=60, rediscover_interval=300,
                  port_state="smpquery")
    sw.sweep_once()
    first = len(tools.calls)
    clock.t += 10
    sw.sweep_once()
    second = [a for a, _ in tools.calls[first:]]
    assert not any(a[0] == "ibnetdiscover" for a in second)
    assert not any("-l" in a for a in second)  # AllPortSelect sums did not move, full read not due
    assert sum(1 for a in second if "-a" in a) == 4
    # between full reads PortInfo of the four leaf-spine cables, each at its leaf end only
    assert sorted((a[-2], a[-1]) for a in second if a[0] == "smpquery") == [
        ("2", "3"), ("2", "4"), ("4", "3"), ("4", "4")]
    clock.t += 60
    sw.sweep_once()
    third = [a for a, _ in tools.calls[first + len(second):]]
    assert sum(1 for a in third if "-x" in a and "-l" in a) == 4
    assert sum(1 for a in third if a[0] == "smpquery") == 12  # every cabled port on a full read
    clock.t += 300
    sw.sweep_once()
    assert sum(1 for a, _ in tools.calls if a[0] == "ibnetdiscover") == 2
    sw.stop()


def test_unreachable_switch_costs_only_its_own_series():
    tools, clock = FakeTools(dead=frozenset({3})), Clock()  # spine-00 has LID 3 in the fixture
    sw = make_sweeper(tools, clock, retries=1)
    snap = sw.sweep_once()
    assert snap.unreachable == 1
    readings = sweep_readings(snap, clock())
    switches = {dict(r.labels).get("switch") for r in readings if r.labels}
    assert "spine-00" not in switches and {"leaf-00", "leaf-01", "spine-01"} <= switches
    assert {r.family: r.value for r in readings if not r.labels}["fabricmon_switches_unreachable"] == 1
    assert sw.queries["timeout"] == 2  # one query, tried again once (retries: 1)
    src = IbSwitchesSource(IbSwitchesConfig(enabled=True), sweeper=sw, clock=clock, start_thread=False)
    result = src.poll(Inventory("/nonexistent"))
    assert result.up and result.errors == 1 and "spine-00" in result.messages[0]
    sw.stop()


def test_no_map_is_a_failing_sweep_that_says_so():
    class NoFabric(FakeTools):
        def _answer(self, argv):
            return ToolRun(255, "", "ibwarn: [1] mad_rpc_open_port: can't open UMAD port ((null):0)\n", 0.01)

    tools, clock = NoFabric(), Clock()
    sw = make_sweeper(tools, clock, retries=0)
    snap = sw.sweep_once()
    assert snap.problem.startswith("ibnetdiscover failed") and not snap.switches
    assert sw.queries == {"ok": 0, "timeout": 0, "error": 1}
    result = IbSwitchesSource(IbSwitchesConfig(enabled=True), sweeper=sw, clock=clock,
                              start_thread=False).poll(Inventory("/nonexistent"))
    assert not result.up and "ibnetdiscover failed" in result.messages[0]
    sw.stop()


def test_stop_ends_a_sweep_in_flight_within_one_query():
    class StopAfterMap(FakeTools):
        def _answer(self, argv):
            if argv[0] == "perfquery":
                sweeper._stop.set()  # what stop() does, from the agent's shutdown, mid-sweep
            return super()._answer(argv)

    tools, clock = StopAfterMap(), Clock()
    sweeper = make_sweeper(tools, clock, concurrency=1)
    sweeper.sweep_once()
    assert [a[0] for a, _ in tools.calls] == ["ibnetdiscover", "iblinkinfo", "perfquery"]
    sweeper.stop()


def _states(snap) -> dict[tuple[str, int], bool]:
    return {(r.switch.name, p): st.up for r in snap.switches for p, st in r.states.items()}


def test_port_state_is_one_walk_per_health_sweep_not_a_process_per_port():
    """Every cabled port's PortInfo each health sweep from one iblinkinfo run (live, never --load-cache,
    which prints a cache's old states): no smpquery at all, and the unlinked cable down at both ends."""
    tools, clock = FakeTools(), Clock()
    sw = make_sweeper(tools, clock, health_interval=10, full_interval=60)
    for _ in range(3):
        snap = sw.sweep_once()
        clock.t += 10
    walks = [a for a, _ in tools.calls if a[0] == "iblinkinfo"]
    assert len(walks) == 3 and all("--load-cache" not in a for a in walks)
    assert not any(a[0] == "smpquery" for a, _ in tools.calls)
    states = _states(snap)
    assert len(states) == 12  # every cabled port, host cables included, every health sweep
    assert not states[("leaf-00", 4)] and not states[("spine-01", 1)]
    assert all(up for k, up in states.items() if k not in {("leaf-00", 4), ("spine-01", 1)})
    sw.stop()


def test_a_failed_walk_falls_back_to_portinfo_per_port():
    tools, clock = FakeTools(), Clock()
    tools.walk_fails = True
    sw = make_sweeper(tools, clock, retries=1)
    snap = sw.sweep_once()
    assert sum(1 for a, _ in tools.calls if a[0] == "iblinkinfo") == 1  # not tried again
    assert sum(1 for a, _ in tools.calls if a[0] == "smpquery") == 12  # first sweep: every cabled port
    assert len(_states(snap)) == 12
    assert sw.queries["timeout"] == 1
    sw.stop()


def test_a_poll_between_sweeps_serves_the_series_built_once_per_sweep():
    """The 1 s poll copies the last sweep: its ~17 series per port are built once per sweep, not per poll
    (3,840 ports took most of a poll to build again each time: docs/benchmarks.md "Switch sweep")."""
    tools, clock = FakeTools(), Clock()
    sw = make_sweeper(tools, clock)
    sw.sweep_once()
    src = IbSwitchesSource(IbSwitchesConfig(enabled=True), sweeper=sw, clock=clock, start_thread=False)
    first = src.poll(Inventory("/nonexistent")).readings
    clock.t += 1
    second = src.poll(Inventory("/nonexistent")).readings
    ports = [r for r in first if dict(r.labels).get("port")]
    assert len(ports) > 100 and {id(r) for r in ports} <= {id(r) for r in second}
    age = {r.family: r.value for r in second if not r.labels}["fabricmon_switch_sweep_age_seconds"]
    assert age == 1.0  # what changes per poll is still read per poll
    clock.t += 10
    sw.sweep_once()
    third = src.poll(Inventory("/nonexistent")).readings
    assert not {id(r) for r in ports} & {id(r) for r in third}  # a new sweep: its own series
    sw.stop()
