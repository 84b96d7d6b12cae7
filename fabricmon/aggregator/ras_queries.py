"""NCCL RAS on suspicion only, from one node per job (DESIGN "Jobs, decoys and cost", Heartbeats).

A job is *suspect* once its heartbeats show the hang shape (peers waiting inside a collective, one
rank outside or behind) for ``suspect_s`` (10 s: two heartbeats), before ``JobHung`` at the tracker's
20 s.  If the job's heartbeats announce a RAS address (``nccl_ras``, fabricmon.client), one agent of
the job is asked, on its stream, to query its node's RAS: one query per suspicion (a suspicion is the
moment progress stopped), repeated while the hang lasts only after a back-off (60 s, doubling to
600 s), so the evidence follows RAS from "unresponsive" to "considered dead" without hammering it.

Which node: the first (by name) live node of the job that is not a suspect rank's.  RAS answers
with the whole job's view from any of its processes, and the processes of one node share the
listening socket (SO_REUSEPORT in ``rasClientInitSocket``), so on the suspect's own node the query
may land on the stopped process and never be answered.  The suspect's node only when it is the
job's only node.

``JobHung`` never waits for RAS: it fires on heartbeats alone at the same time; RAS's answer joins
its evidence when it comes (missing and dead ranks; ranks behind; ranks in error; all ranks fine,
which points at the application; or why RAS could not be asked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from ..nccl_ras.client import QueryResult
from ..nccl_ras.status import RankNote
from ..proto.ras import REPORT_OUTCOMES, RasQuery, RasReport
from .hangs import ALIVE_S, Hang, HeartbeatTracker, RankBeat
from .wording import at

log = structlog.get_logger("fabricmon.aggregator.ras")

SUSPECT_S = 10.0
RAS_TIMEOUT_S = 5  # RAS's per-leg gathering timeout the agent asks for (ncclras's default)
ANSWER_S = 30.0  # a query unanswered this long is given up (agent gone or older than RasQuery)
BACKOFF_S = (60.0, 120.0, 240.0, 480.0, 600.0)
MAX_QUEUED_PER_NODE = 4
MAX_JOBS = 4096
NAMED = 4  # ranks named per kind in one evidence line
# the aggregator's own outcomes beside the agents' (REPORT_OUTCOMES)
OUTCOMES = (*REPORT_OUTCOMES, "unanswered")

JobKey = tuple[str, str]


@dataclass
class _Job:
    since: float  # when progress stopped: the suspicion's identity
    queries: int = 0
    next_at: float = 0.0
    pending: tuple[int, str, float] | None = None  # (query id, node, sent at)
    result: QueryResult | None = None
    result_node: str = ""
    result_at: float = 0.0


@dataclass
class RasQueries:
    suspect_s: float = SUSPECT_S
    timeout_s: int = RAS_TIMEOUT_S
    jobs: dict[JobKey, _Job] = field(default_factory=dict)
    outbox: dict[str, list[RasQuery]] = field(default_factory=dict)
    sent_total: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    _next_id: int = 0

    def plan(self, tracker: HeartbeatTracker, now: float, live: Callable[[str], bool] = lambda n: True,
             found: list[Hang] | None = None) -> list[Hang]:
        """Queue a query for each newly suspect job that announces RAS (or whose back-off ran out); the
        suspects (``found``: the tracker's answer at ``suspect_s`` when the caller already has it)."""
        # never later than JobHung (a tracker with a shorter stall): suspects are a superset of the hung
        found = tracker.hangs(now, min(self.suspect_s, tracker.stall_s)) if found is None else found
        suspects: dict[JobKey, Hang] = {(h.job, h.job_id): h for h in found}
        for key in [k for k in self.jobs if k not in suspects]:
            del self.jobs[key]  # progress resumed or the job ended: the suspicion is over
        for key, h in suspects.items():
            jb = tracker.jobs.get(key)
            if jb is None:
                continue
            st = self.jobs.get(key)
            if st is None or st.since != h.since:
                if st is None and len(self.jobs) >= MAX_JOBS:
                    continue
                st = self.jobs[key] = _Job(since=h.since, next_at=now)
            if st.pending is not None and now - st.pending[2] > ANSWER_S:
                self._count("unanswered")
                log.warning("nccl_ras_unanswered", job=h.job, job_id=h.job_id, node=st.pending[1],
                            after_s=round(now - st.pending[2], 1))
                st.result = QueryResult("unanswered", f"no answer within {ANSWER_S:.0f} s", ANSWER_S)
                st.result_node, st.result_at, st.pending = st.pending[1], now, None
            if st.pending is not None or now < st.next_at:
                continue
            target = self._pick(jb.ranks, set(h.nodes), now, tracker, live)
            if target is None:
                continue  # the job announces no RAS, or no node of it is connected
            node, addr = target
            self._next_id += 1
            q = RasQuery(self._next_id, h.job, h.job_id, addr, self.timeout_s)
            box = self.outbox.setdefault(node, [])
            box.append(q)
            del box[:-MAX_QUEUED_PER_NODE]
            st.pending = (q.id, node, now)
            st.queries += 1
            st.next_at = now + BACKOFF_S[min(st.queries - 1, len(BACKOFF_S) - 1)]
            self.sent_total += 1
            log.info("nccl_ras_query", job=h.job, job_id=h.job_id, node=node, addr=addr, query=q.id,
                     stalled_s=round(now - h.since, 1))
        return found

    @staticmethod
    def _pick(ranks: dict[int, RankBeat], suspect_nodes: set[str], now: float, tracker: HeartbeatTracker,
              live: Callable[[str], bool]) -> tuple[str, str] | None:
        # only from ranks with a history of their own (RankBeat.ras): one spoofed line cannot name the server
        cands = sorted({(b.node, b.ras) for b in ranks.values()
                        if b.ras and now - b.ts <= ALIVE_S and live(b.node)})
        if not cands:
            return None
        others = [c for c in cands if c[0] not in suspect_nodes]
        return (others or cands)[0]

    def take(self, node: str) -> list[RasQuery]:
        """The queries to send down ``node``'s stream now (each sent once)."""
        return self.outbox.pop(node, [])

    def report(self, node: str, rep: RasReport, now: float) -> bool:
        """An agent's answer; False when it answers no query pending on that node (late, or forged)."""
        st = self.jobs.get((rep.job, rep.job_id))
        if st is None or st.pending is None or st.pending[0] != rep.id or st.pending[1] != node:
            log.info("nccl_ras_report_ignored", node=node, query=rep.id, job=rep.job)
            return False
        st.pending = None
        st.result, st.result_node, st.result_at = rep.result, node, now
        self._count(rep.result.outcome)
        log_fn = log.info if rep.result.outcome == "ok" else log.warning
        log_fn("nccl_ras_report", job=rep.job, job_id=rep.job_id, node=node, outcome=rep.result.outcome,
               detail=rep.result.detail, seconds=rep.result.seconds)
        return True

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def evidence(self, h: Hang) -> list[str]:
        """Lines for the JobHung of ``h``: what RAS said, that it was asked, or nothing (never asked)."""
        st = self.jobs.get((h.job, h.job_id))
        if st is None:
            return []
        if st.result is None:
            if st.pending is not None:
                return [f"NCCL RAS asked on {st.pending[1]} at {at(st.pending[2])}, no answer yet"]
            return []
        return ras_lines(st.result, st.result_node, st.result_at, set(h.ranks))


    def verdict(self, h: Hang) -> str:
        """What the job's RAS answer says, in a few words for JobHung's description ("" until it
        answered).  The description is what an alert shows: an answer that comes after JobHung
        fired changes it, so Alertmanager gets the incident again (evidence lines alone do not)."""
        st = self.jobs.get((h.job, h.job_id))
        return ras_verdict(st.result) if st is not None and st.result is not None else ""


def ras_verdict(res: QueryResult) -> str:
    """A RAS answer in one phrase (pure): whom it names, or why it could not be asked."""
    s = res.summary
    if res.outcome != "ok" or s is None:
        return f"NCCL RAS could not be asked ({res.outcome})"
    for notes, total, what in ((s.missing, s.missing_total, "missing"), (s.behind, s.behind_total, "behind"),
                               (s.errors, s.errors_total, "in error")):
        if notes:
            ranks = ", ".join(str(n.rank) for n in notes[:4]) + (f" and {total - 4} more" if total > 4 else "")
            return f"NCCL RAS names rank{'s' if total > 1 else ''} {ranks} {what}"
    return "NCCL RAS sees every rank present: the hang is in the application, outside NCCL"


def _who(n: RankNote, culprits: set[int]) -> str:
    agree = " (the rank the heartbeats name)" if n.rank in culprits else ""
    where = f"process {n.pid} on {n.host}" if n.pid >= 0 else f"on {n.host}"
    return f"rank {n.rank}{agree} ({where}, communicator {n.comm} of {n.comm_size})"


def _listed(notes: tuple[RankNote, ...], total: int, what: Callable[[RankNote], str], culprits: set[int]) -> str:
    shown = "; ".join(f"{_who(n, culprits)} {what(n)}" for n in notes[:NAMED])
    more = total - min(len(notes), NAMED)
    return shown + (f"; and {more} more" if more > 0 else "")


def ras_lines(res: QueryResult, node: str, asked: float, culprits: set[int]) -> list[str]:
    """The evidence lines of one RAS answer (pure)."""
    head = f"NCCL RAS (asked on {node} at {at(asked)}"
    s = res.summary
    if res.outcome != "ok" or s is None:
        return [f"NCCL RAS could not be asked on {node}: {res.outcome} ({res.detail})"]
    head += f", NCCL {s.nccl_version}, {s.communicators} communicator(s), {s.world_size} ranks in the largest"
    head += f", {s.timeouts} timeout(s) gathering)" if s.timeouts else ")"
    out = []
    if s.missing:
        out.append(f"{head} missing: " + _listed(
            s.missing, s.missing_total,
            lambda n: "considered dead" if n.dead else ("unresponsive" if n.unresponsive else "absent"), culprits))
    if s.behind:
        out.append(f"{head} behind: " + _listed(
            s.behind, s.behind_total, lambda n: f"launched {n.count} {n.op} while peers launched {n.peers}",
            culprits))
    if s.errors:
        out.append(f"{head} in error: " + _listed(
            s.errors, s.errors_total, lambda n: f"init_state {n.init_state}, async_error {n.async_error}", culprits))
    if not out:
        out.append(f"{head}: every rank present, none behind or in error: NCCL sees no fault, the hang is "
                   "in the application (outside NCCL)")
    return out
