"""The agent's side of "NCCL RAS on suspicion": run the query the aggregator asks for, off every
other thread, and answer on the stream.

A ``RasQuery`` arrives on the stream's reader thread; ``submit`` validates it and hands it to one
worker thread (started on first use), so neither the poll loop nor the ack reader ever waits on a
RAS socket.  At most ``max_pending`` queries wait; one more is answered ``busy`` at once.  Each
query is bounded by the client's deadline and size (nccl_ras/client.py), and each ends in exactly
one outcome: a log line, a count (``fabricmon_agent_nccl_ras_queries_total{outcome}``) and a
``RasReport`` sent back with ``send`` (the session's outgoing queue; lost if that connection has
ended, which the aggregator counts as unanswered).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import structlog

from ..nccl_ras.client import QueryResult, query_status
from ..proto import fabricmon_pb2 as pb
from ..proto.ras import REPORT_OUTCOMES, BadRasMessage, RasQuery, RasReport, query_from_pb, report_to_pb

log = structlog.get_logger("fabricmon.agent.ras")

# a query the agent refused to run (malformed: no report can name its job)
QUERY_OUTCOMES = (*REPORT_OUTCOMES, "bad_query")

Send = Callable[[bytes], Any]


class RasQuerier:
    def __init__(self, *, max_pending: int = 2, allow_remote: bool = False,
                 query: Callable[..., QueryResult] = query_status) -> None:
        self._q: queue.Queue[tuple[RasQuery, Send] | None] = queue.Queue(maxsize=max(1, max_pending))
        self._query = query
        self._allow_remote = allow_remote
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.outcomes: dict[str, int] = dict.fromkeys(QUERY_OUTCOMES, 0)
        self.seconds_total = 0.0

    def _count(self, outcome: str, seconds: float = 0.0) -> None:
        with self._lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            self.seconds_total += seconds

    def submit(self, m: pb.RasQuery, send: Send) -> None:
        """From the stream's reader thread: never blocks."""
        try:
            q = query_from_pb(m)
        except BadRasMessage as exc:
            self._count("bad_query")
            log.warning("nccl_ras_query_refused", reason=str(exc))
            return
        try:
            self._q.put_nowait((q, send))
        except queue.Full:
            self._answer(q, QueryResult("busy", "earlier RAS queries still run on this node", 0.0), send)
            return
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fabricmon-nccl-ras", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._q.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is None:
                return
            q, send = item
            try:
                res = self._query(q.addr, ras_timeout_s=q.timeout_s, allow_remote=self._allow_remote)
            except Exception as exc:  # the client returns outcomes; a bug there must not end the thread
                res = QueryResult("bad_reply", f"client error {type(exc).__name__}: {exc}", 0.0)
            self._answer(q, res, send)

    def _answer(self, q: RasQuery, res: QueryResult, send: Send) -> None:
        self._count(res.outcome, res.seconds)
        s = res.summary
        fields: dict[str, Any] = dict(job=q.job, job_id=q.job_id, addr=q.addr, query=q.id, outcome=res.outcome,
                                      detail=res.detail, seconds=res.seconds)
        if s is not None:
            fields.update(nccl_version=s.nccl_version, missing=s.missing_total, behind=s.behind_total,
                          errors=s.errors_total, repaired=s.repaired or None)
        (log.info if res.outcome == "ok" else log.warning)("nccl_ras_queried", **fields)
        try:
            send(report_to_pb(RasReport(q.id, q.job, q.job_id, res)).SerializeToString())
        except Exception as exc:  # the connection is gone: the aggregator counts it unanswered
            log.warning("nccl_ras_report_unsent", query=q.id, error=f"{type(exc).__name__}: {exc}")

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"outcomes": dict(self.outcomes), "seconds_total": self.seconds_total}
