"""Polls on the wall clock's multiples of the interval (agent/poller.py until_aligned, Poller.run align)."""

from __future__ import annotations

import math
import random
import threading
import time
import types

import pytest

from fabricmon.agent import poller as poller_mod
from fabricmon.agent.poller import Poller, until_aligned
from fabricmon.config import AgentConfig, ConfigError, load_agent_config
from fabricmon.sources.inventory import Inventory
from support.countingsource import CountingSource


@pytest.mark.parametrize(("wall", "interval", "wait"), [
    (100.3, 1.0, 0.7),
    (100.0, 1.0, 1.0),  # on a multiple: the next one, not this instant again
    (100.8, 1.0, 0.2 + 1.0),  # closer than a quarter: the one after
    (100.75, 1.0, 0.25),  # a quarter exactly is far enough
    (4.0, 1.5, 0.5),  # multiples of 1.5 s: 4.5
    (1_764_000_000.25, 10.0, 9.75),  # today's Unix time: % keeps the phase exact
    (1_764_000_001.5, 60.0, 58.5),
    (0.0, 1.0, 1.0),  # a clock at the epoch
    (-0.3, 1.0, 0.3),  # a clock set before 1970: the next multiple is 0
    (-0.1, 1.0, 0.1 + 1.0),  # ... and 0 too close: 1
    (-2.5, 1.0, 0.5),
    (5.05, 0.1, 0.05),  # the shortest intervals
    (5.08, 0.1, 0.02 + 0.1),
])
def test_until_aligned_examples(wall, interval, wait):
    assert until_aligned(wall, interval) == pytest.approx(wait, abs=1e-6)


def test_until_aligned_always_lands_on_a_multiple_a_quarter_to_one_and_a_quarter_intervals_away():
    rng = random.Random(39)
    for _ in range(2000):
        interval = rng.choice([0.5, 1.0, 1.5, 2.0, 5.0, 10.0, 60.0])
        wall = rng.uniform(-1e6, 2e9)
        wait = until_aligned(wall, interval)
        assert interval / 4 - 1e-6 <= wait <= interval * 1.25 + 1e-6
        phase = math.fmod(wall + wait, interval)
        assert min(phase, interval - phase) < 1e-4  # on a multiple (to float precision at 2e9)


class _Wake:
    """Stands in for the poller's wake event: records each wait's timeout and returns at once."""

    def __init__(self, stop: threading.Event, waits: int) -> None:
        self.timeouts: list[float] = []
        self._stop = stop
        self._waits = waits

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        if len(self.timeouts) >= self._waits:
            self._stop.set()
        return False

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass


def _first_wait(monkeypatch, *, wall: float, interval: float, align: bool) -> tuple[float, int]:
    """The wait the poll loop asks for after its first poll, on a frozen monotonic clock and wall clock."""
    frozen = types.SimpleNamespace(monotonic=lambda: 5000.0, time=lambda: wall, perf_counter=time.perf_counter,
                                   process_time=time.process_time, sleep=time.sleep)
    monkeypatch.setattr(poller_mod, "time", frozen)
    src = CountingSource()
    p = Poller("n", [src], lambda: Inventory(sysfs_root=""), clock=lambda: wall)
    stop = threading.Event()
    p._wake = _Wake(stop, 1)  # type: ignore[assignment]
    p.run(stop, interval, align=align)
    return p._wake.timeouts[0], src.polls  # type: ignore[attr-defined]


def test_the_poll_loop_waits_for_the_next_multiple_of_the_interval_on_the_wall_clock(monkeypatch):
    wait, polls = _first_wait(monkeypatch, wall=1_764_000_000.3, interval=1.0, align=True)
    assert polls == 1  # the first poll ran at once, at whatever phase the start had
    assert wait == pytest.approx(0.7, abs=1e-6)
    # 0.05 s from a multiple of 0.4 is too close: the multiple after (each wait is at most the 1 s
    # stop check, so the intervals here keep the whole wait under it)
    wait, _ = _first_wait(monkeypatch, wall=1_764_000_000.35, interval=0.4, align=True)
    assert wait == pytest.approx(0.45, abs=1e-6)


def test_without_alignment_the_loop_polls_every_interval_from_its_start(monkeypatch):
    wait, polls = _first_wait(monkeypatch, wall=1_764_000_000.3, interval=0.8, align=False)
    assert polls == 1 and wait == pytest.approx(0.8, abs=1e-6)


def test_a_real_poll_loop_aligned_polls_and_stops():
    """Real clocks, no frozen time: the loop polls, waits and stops when asked (no timing asserted)."""
    src = CountingSource()
    p = Poller("n", [src], lambda: Inventory(sysfs_root=""))
    stop = threading.Event()
    th = threading.Thread(target=p.run, args=(stop, 0.2, True), daemon=True)
    th.start()
    try:
        end = time.monotonic() + 20.0
        while src.polls < 3 and time.monotonic() < end:
            time.sleep(0.02)
        assert src.polls >= 3
    finally:
        stop.set()
        p.wake()
        th.join(5.0)
    assert not th.is_alive()


def test_config_align_polls(tmp_path):
    assert AgentConfig().align_polls is True
    f = tmp_path / "a.yaml"
    f.write_text("align_polls: false\n")
    assert load_agent_config(f).align_polls is False
    f.write_text("align_polls: 1\n")
    with pytest.raises(ConfigError, match="align_polls"):
        load_agent_config(f)
