"""The drive harness (fabricmon/sim/drive.py): simulator -> optional codec wire -> aggregator, paced.

The wire and the rank intake are transport: a scenario driven through them opens the same incidents at
the same sample times as one handed to the engine as values, and the batches carry the same ranks,
layouts and heartbeats.  Pacing is checked on a fake clock (no test waits on wall time).
"""

from __future__ import annotations

import threading

import pytest

from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.runtime import AggregatorRuntime
from fabricmon.sim import drive as drive_mod
from fabricmon.sim.drive import Drive, Pace
from fabricmon.sim.runner import SimulatedCluster, StepStats
from fabricmon.sim.scenario import default_scenario

pytest.importorskip("numpy")

EPOCH = 1_764_000_000.0


def _incidents(wired: bool) -> tuple[list[tuple[str, str, float]], int, int]:
    scn = default_scenario(nodes=4, duration=24, nodes_per_unit=4, seed=7)
    sim = SimulatedCluster(scn, mode="memory", epoch=EPOCH, rank_intake=wired)
    rt = AggregatorRuntime(Engine(sim.topology, cluster="t")).start()
    try:
        d = Drive(sim, rt, wire=wired)
        d.connect()
        steps = d.run()
    finally:
        rt.stop(grace=0, flush=0.0, final_tick=False)
        sim.close()
    assert rt.tick_errors_total == 0
    got = sorted((i.alertname, i.component, i.first_seen - EPOCH) for i in rt.engine.incidents())
    return got, steps, d.wire.batches_total if d.wire is not None else 0


def test_through_the_codec_and_the_rank_intake_the_same_incidents_open_at_the_same_times():
    direct, steps, _ = _incidents(False)
    wired, steps_w, batches = _incidents(True)
    assert steps == steps_w == 24
    assert batches == 4 * 25  # the initial poll and 24 steps of 4 nodes, all over the wire
    assert {(a, c) for a, c, _ in direct} == {("FabricLinkErrors", "node-003/mlx5_3/1"),
                                              ("FabricLeafDegraded", "leaf-u0-r5")}  # the scenario's faults
    assert wired == direct


@pytest.mark.parametrize(("mode", "nodes", "steps"), [("memory", 4, 12), ("tree", 2, 6)])
def test_the_rank_intake_hands_on_the_ranks_layouts_and_heartbeats_the_simulator_made(mode, nodes, steps, tmp_path):
    got: dict[bool, list] = {}
    for via in (False, True):
        scn = default_scenario(nodes=nodes, duration=12, nodes_per_unit=nodes)
        base = tmp_path / str(via) if mode == "tree" else None
        sim = SimulatedCluster(scn, mode=mode, rank_intake=via, base_dir=base)
        batches: list = []
        sim.on_batch = batches.append
        with sim:
            for _ in range(steps):
                sim.step()
        got[via] = [(b.node, b.seq, b.ranks, b.layouts, sorted(b.heartbeats, key=lambda h: (h.job, h.rank)))
                    for b in batches]
    assert sum(len(b[2]) for b in got[False]) > 0 and sum(len(b[4]) for b in got[False]) > 0
    assert sum(len(b[3]) for b in got[False]) > 0
    assert got[True] == got[False]


class _FakeSim:
    """The simulator surface the harness drives (runner.ClusterSim), stepping a clock."""

    def __init__(self, duration: float, interval: float = 1.0) -> None:
        self.scenario = type("S", (), {"duration": duration})()
        self.interval = interval
        self.on_batch = None
        self.on_watch_tick = None
        self._t = 0.0
        self.started = 0

    @property
    def t(self) -> float:
        return self._t

    def now(self) -> float:
        return EPOCH + self._t

    def start(self) -> None:
        self.started += 1

    def hellos(self) -> list:
        return []

    def step(self) -> StepStats:
        self._t += self.interval
        return StepStats(t=self._t)


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.t += s


def test_pace_holds_each_step_until_its_simulated_time_at_speed(monkeypatch):
    clock = _Clock(100.0)
    monkeypatch.setattr(drive_mod.time, "sleep", clock.sleep)
    sim = _FakeSim(10.0)
    at: list[float] = []
    Drive(sim).run(pace=Pace(4.0, clock=clock), on_step=lambda st, ch: at.append(clock.t))
    # the first step at once, then one every interval / speed = 0.25 s
    assert at == [100.0 + k * 0.25 for k in range(10)]
    # a live fabric: sample time epoch + t is stepped to at wall time epoch + t
    clock = _Clock(EPOCH + 0.5)
    monkeypatch.setattr(drive_mod.time, "sleep", clock.sleep)
    sim = _FakeSim(3.0)
    at = []
    Drive(sim).run(pace=Pace(1.0, origin=EPOCH, clock=clock, lead=0.0), on_step=lambda st, ch: at.append(clock.t))
    assert at == [EPOCH + 1.0, EPOCH + 2.0, EPOCH + 3.0]


def test_the_loop_is_bounded_by_duration_until_and_a_stop_event():
    sim = _FakeSim(5.0)
    assert Drive(sim).run() == 5 and sim.t == 5.0
    assert Drive(sim).run() == 0  # at the scenario's end: nothing more
    sim = _FakeSim(50.0)
    assert Drive(sim).run(until=7.0) == 7
    stop = threading.Event()
    sim = _FakeSim(50.0)
    assert Drive(sim).run(on_step=lambda st, ch: stop.set() if sim.t >= 3 else None, stop=stop) == 3


def test_a_drive_takes_one_aggregator_and_the_wire_needs_one():
    sim = _FakeSim(1.0)
    eng = Engine(SimulatedCluster(default_scenario(nodes=2, duration=2, nodes_per_unit=2), mode="memory").topology)
    with pytest.raises(ValueError, match="not both"):
        Drive(sim, AggregatorRuntime(eng), engine=eng)
    with pytest.raises(ValueError, match="needs an aggregator"):
        Drive(sim, wire=True)
