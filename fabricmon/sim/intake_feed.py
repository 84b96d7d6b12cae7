"""Each simulated node's real rank intake, fed the lines a job's client writes.

``rank_intake=True`` in ``SimulatedCluster``: the training ranks' timings, heartbeats and layouts
reach a node's batch as they do on a real node, JSON lines (``fabricmon.client``'s: no ``node``, the
agent adds it; the layouts once) into that node's ``agent.intake.RankIntake``, drained once per
interval as the agent's stream does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from ..rank_timing import Heartbeat, JobLayout, RankTiming, heartbeat_json
from .rank_lines import RankLines


class IntakeFeed:
    def __init__(self, clock: Callable[[], float], layouts: Callable[[], tuple[JobLayout, ...]]) -> None:
        self._clock = clock
        self._layouts = layouts
        self._intakes: dict = {}  # node -> agent.intake.RankIntake, made at the node's first interval
        self._lines = RankLines()

    def through(self, node: str, ranks: list[RankTiming], heartbeats: list[Heartbeat]
                ) -> tuple[tuple[RankTiming, ...], tuple[JobLayout, ...], tuple[Heartbeat, ...]]:
        """What the node's agent streams of its ranks this interval."""
        from ..agent.intake import RankIntake

        intake = self._intakes.get(node)
        lines: list[str] = []
        if intake is None:
            intake = self._intakes[node] = RankIntake(node, clock=self._clock)
            lines += [json.dumps({"job": lay.job, "layout": dict(lay.layout)}, separators=(",", ":"))
                      for lay in self._layouts()]
        line = self._lines.line  # to_json(replace(r, node="")), the same bytes (sim/rank_lines.py)
        lines += [line(r) for r in ranks]
        lines += [heartbeat_json(replace(h, node="")) for h in heartbeats]
        if lines:
            _, rejected, reasons = intake.submit_lines("\n".join(lines), origin="sim")
            if rejected:  # the simulator wrote a line the agent refuses: a simulator bug, never silent
                raise RuntimeError(f"{node}: the rank intake refused {rejected} simulated line(s): {reasons}")
        got, layouts = intake.drain()
        return tuple(got), tuple(layouts), tuple(intake.drain_heartbeats())
