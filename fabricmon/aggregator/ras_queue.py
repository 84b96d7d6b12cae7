"""The NCCL RAS query queue as the streams see it: the queries waiting for a node's stream, and the
agents' answers (ras_queries.RasQueries plans them at the tick and turns answers into evidence)."""

from __future__ import annotations

from ..proto.ras import RasQuery, RasReport
from .engine_state import EngineState, Stage
from .ras_queries import RasQueries


class RasQueue(Stage):
    def __init__(self, state: EngineState, ras: RasQueries) -> None:
        super().__init__(state)
        self.ras = ras

    def ras_waiting(self) -> list[str]:
        """Nodes with RAS queries queued (the simulator's stand-in for the streams)."""
        with self.lock:
            return list(self.ras.outbox)

    def take_ras_queries(self, node: str) -> list[RasQuery]:
        """The RAS queries to send down ``node``'s stream now (the servicer, after each ack)."""
        with self.lock:
            if not self.ras.outbox:
                return []
            self.state.inputs += 1  # tick_gate.py
            return self.ras.take(node)

    def ras_report(self, node: str, report: RasReport) -> bool:
        """An agent's answer to a RAS query; it joins the job's JobHung evidence at the next tick."""
        with self.lock:
            self.state.inputs += 1  # tick_gate.py
            now = self.last_tick if self.last_tick is not None else self.cluster_clock.now()
            return self.ras.report(node, report, now)
