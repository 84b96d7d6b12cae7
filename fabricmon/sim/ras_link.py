"""The simulated cluster's NCCL RAS, and the agents' side of asking it.

Every job gets a loopback server speaking RAS's protocol (ras_server.py) and announces its address
in its heartbeats, as a job started with ``nccl_ras=True`` does.  What a job looks like to RAS is
read from the simulation when asked: its ranks on its nodes (hosts named by a 10.x address per node
index, as RAS prints the RAS network's IPs), each rank's AllReduce count its collective sequence
number, and a hung rank alive and one operation behind its waiting peers (RAS's MISMATCH: the process
never entered the collective, its RAS thread still answers).

``pump`` is what the aggregator's stream does after each ack: the queries the aggregator planned for
a node go to that node's ``RasQuerier`` (the agent's own, on its own thread), whose answers come back
as the ``RasReport`` bytes an agent sends, decoded as the server decodes them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..agent.ras_query import RasQuerier
from ..proto import fabricmon_pb2 as pb
from ..proto.ras import BadRasMessage, RasQuery, RasReport, report_from_pb
from .hw import NGPU
from .ras_server import FakeRasServer, FakeStatus, hung_job_status


def node_ip(index: int) -> str:
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"


def _state_of(job: Any) -> Callable[[], FakeStatus]:
    def state() -> FakeStatus:
        hosts = [node_ip(int(i)) for i in job.index]
        hung = job.hung
        if hung is None:
            return hung_job_status(hosts, NGPU, -1, ops_done=2 * job.step)
        pos, gpu = hung
        return hung_job_status(hosts, NGPU, pos * NGPU + gpu, ops_done=2 * job.step + 1)

    return state


class SimRas:
    def __init__(self, jobs: list[Any]) -> None:
        self.servers: list[FakeRasServer] = []
        for job in jobs:
            srv = FakeRasServer(state=_state_of(job), version="2.29.1")
            job.nccl_ras = srv.addr
            self.servers.append(srv)
        self._queriers: dict[str, RasQuerier] = {}
        self._waiting: Callable[[], list[str]] | None = None
        self._take: Callable[[str], list[RasQuery]] | None = None
        self._answer: Callable[[str, RasReport], object] | None = None
        self.reports_refused = 0

    def attach(self, waiting: Callable[[], list[str]], take: Callable[[str], list[RasQuery]],
               answer: Callable[[str, RasReport], object]) -> None:
        """The aggregator's side: which nodes have queries queued, take them, hand an answer back."""
        self._waiting, self._take, self._answer = waiting, take, answer

    def pump(self) -> int:
        """Send the queued queries to their nodes' queriers; the number sent."""
        if self._waiting is None or self._take is None:
            return 0
        n = 0
        for node in self._waiting():
            for q in self._take(node):
                qr = self._queriers.get(node)
                if qr is None:
                    qr = self._queriers[node] = RasQuerier()
                qr.submit(q.to_pb().ras_query, partial(self._deliver, node))
                n += 1
        return n

    def _deliver(self, node: str, data: bytes) -> None:
        try:
            rep = report_from_pb(pb.AgentMessage.FromString(data).ras_report)
        except BadRasMessage:
            self.reports_refused += 1
            return
        if self._answer is not None:
            self._answer(node, rep)

    def close(self) -> None:
        for q in self._queriers.values():
            q.stop(1.0)
        for s in self.servers:
            s.close()
