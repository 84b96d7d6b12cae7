"""The infiniband-diags tools' real outputs served by a stand-in runner (fixtures:
tests/fixtures/ib_switches/README.md), for the sweep's tests without ibsim."""

from __future__ import annotations

import threading
from pathlib import Path

from fabricmon.config import IbSwitchesConfig
from fabricmon.sources.ib_switches.sweeper import Sweeper
from fabricmon.sources.ib_switches.tools import ToolRun

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ib_switches"
CLEARING = {"-r", "-R", "-k", "-K", "--reset_after_read", "--Reset_only"}


class FakeTools:
    """Answers each command line with the real tool's captured output; ``dead`` LIDs time out."""

    def __init__(self, dead: frozenset[int] = frozenset()) -> None:
        self.dead = set(dead)
        self.walk_fails = False
        self.calls: list[tuple[list[str], float]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def __call__(self, argv: list[str], deadline_s: float) -> ToolRun:
        with self.lock:
            self.calls.append((argv, deadline_s))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._answer(argv)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _answer(self, argv: list[str]) -> ToolRun:
        tool = argv[0]
        if tool == "ibnetdiscover":
            return ToolRun(0, (FIX / "ibnetdiscover-cache.out").read_text(), "", 0.01)
        if tool == "iblinkinfo":
            if self.walk_fails:
                return ToolRun(None, "", "killed after 10.0s", 10.0)
            return ToolRun(0, (FIX / "iblinkinfo-switches-line.out").read_text(), "", 0.01)
        positional = [a for a in argv[1:] if not a.startswith("-") and argv[argv.index(a) - 1] != "-t"]
        lid = int(positional[1] if tool == "smpquery" else positional[0])
        if lid in self.dead:
            return ToolRun(255, "", (FIX / "perfquery-unreachable.err").read_text(), 0.01)
        if tool == "smpquery":
            return ToolRun(0, (FIX / "smpquery-portinfo-active.out").read_text(), "", 0.01)
        name = "perfquery-a.out" if "-a" in argv else "perfquery-x-l.out" if "-x" in argv else "perfquery-l.out"
        text = (FIX / name).read_text().replace("Lid 2 ", f"Lid {lid} ")
        return ToolRun(0, text, "", 0.01)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_sweeper(tools: FakeTools, clock: Clock, **kw) -> Sweeper:
    cfg = IbSwitchesConfig(enabled=True, **kw)
    return Sweeper(cfg, runner=tools, clock=clock, monotonic=clock)
