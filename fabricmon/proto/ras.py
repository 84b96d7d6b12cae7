"""RasQuery (aggregator -> agent) and RasReport (agent -> aggregator) on the stream, validated both ways.

A query names a job and the RAS address its heartbeats gave; the report carries what the agent's
query found (nccl_ras/status.py ``RasSummary``), bounded: at most ``MAX_LISTED`` ranks per kind,
short strings.  Either side refuses what is out of bounds with ``BadRasMessage``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..nccl_ras.client import OUTCOMES, QueryResult
from ..nccl_ras.protocol import BadAddress, parse_addr
from ..nccl_ras.status import MAX_LISTED, RankNote, RasSummary
from ..textcheck import MAX_JOB_NAME, label_text_ok
from . import fabricmon_pb2 as pb

# outcomes only an agent's querier (not the client) reports: a query it could not take
AGENT_OUTCOMES = ("busy",)
REPORT_OUTCOMES = OUTCOMES + AGENT_OUTCOMES
MAX_TIMEOUT_S = 60
MAX_DETAIL = 300
MAX_TEXT = 256
I32 = 2**31 - 1
U64 = 2**64 - 1


class BadRasMessage(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RasQuery:
    id: int
    job: str
    job_id: str
    addr: str
    timeout_s: int

    def to_pb(self) -> pb.AggregatorMessage:
        return pb.AggregatorMessage(ras_query=pb.RasQuery(id=self.id, job=self.job, job_id=self.job_id,
                                                          addr=self.addr, timeout_seconds=self.timeout_s))


@dataclass(frozen=True, slots=True)
class RasReport:
    id: int
    job: str
    job_id: str
    result: QueryResult


def query_from_pb(m: pb.RasQuery) -> RasQuery:
    if not label_text_ok(m.job, MAX_JOB_NAME):
        raise BadRasMessage("ras_query.job: 1 to 200 printable characters")
    if m.job_id and not label_text_ok(m.job_id, MAX_JOB_NAME):
        raise BadRasMessage("ras_query.job_id: at most 200 printable characters")
    try:
        parse_addr(m.addr)
    except BadAddress as exc:
        raise BadRasMessage(f"ras_query.addr: {exc}") from None
    if not 0 < m.timeout_seconds <= MAX_TIMEOUT_S:
        raise BadRasMessage(f"ras_query.timeout_seconds: must be in [1, {MAX_TIMEOUT_S}]")
    return RasQuery(m.id, m.job, m.job_id, m.addr, m.timeout_seconds)


def _note_pb(n: RankNote) -> pb.RasRank:
    return pb.RasRank(comm=n.comm, comm_size=n.comm_size, rank=n.rank, host=n.host, pid=n.pid, cuda_dev=n.cuda_dev,
                      dead=n.dead, unresponsive=n.unresponsive, op=n.op, count=n.count, peers=n.peers,
                      init_state=n.init_state, async_error=n.async_error)


def report_to_pb(r: RasReport) -> pb.AgentMessage:
    res = r.result
    s = res.summary
    m = pb.RasReport(id=r.id, job=r.job, job_id=r.job_id, outcome=res.outcome, detail=res.detail[:MAX_DETAIL],
                     seconds=res.seconds)
    if s is not None:
        m.nccl_version = s.nccl_version
        m.communicators = min(s.communicators, I32)
        m.world_size = min(s.world_size, I32)
        m.missing.extend(_note_pb(n) for n in s.missing[:MAX_LISTED])
        m.behind.extend(_note_pb(n) for n in s.behind[:MAX_LISTED])
        m.errors.extend(_note_pb(n) for n in s.errors[:MAX_LISTED])
        m.missing_total, m.behind_total, m.errors_total = s.missing_total, s.behind_total, s.errors_total
        m.timeouts = min(s.timeouts, I32)
        m.repaired = s.repaired
    return pb.AgentMessage(ras_report=m)


def _text(v: str, where: str, limit: int = MAX_TEXT) -> str:
    if len(v) > limit or not v.isprintable():
        raise BadRasMessage(f"{where}: at most {limit} printable characters")
    return v


def _notes(rows: Sequence[pb.RasRank], where: str) -> tuple[RankNote, ...]:
    if len(rows) > MAX_LISTED:
        raise BadRasMessage(f"{where}: {len(rows)} ranks, at most {MAX_LISTED}")
    out = []
    for i, n in enumerate(rows):
        w = f"{where}[{i}]"
        out.append(RankNote(_text(n.comm, f"{w}.comm"), n.comm_size, n.rank, _text(n.host, f"{w}.host"), n.pid,
                            n.cuda_dev, n.dead, n.unresponsive, _text(n.op, f"{w}.op", 64), n.count, n.peers,
                            n.init_state, n.async_error))
    return tuple(out)


def report_from_pb(m: pb.RasReport) -> RasReport:
    if m.outcome not in REPORT_OUTCOMES:
        raise BadRasMessage(f"ras_report.outcome: {m.outcome[:40]!r} is none of {', '.join(REPORT_OUTCOMES)}")
    if not label_text_ok(m.job, MAX_JOB_NAME) or (m.job_id and not label_text_ok(m.job_id, MAX_JOB_NAME)):
        raise BadRasMessage("ras_report.job: 1 to 200 printable characters")
    if not 0 <= m.seconds <= 3600:  # also refuses NaN
        raise BadRasMessage("ras_report.seconds: must be in [0, 3600]")
    summary = None
    if m.outcome == "ok":
        summary = RasSummary(_text(m.nccl_version, "ras_report.nccl_version", 64), m.communicators, m.world_size,
                             _notes(m.missing, "ras_report.missing"), _notes(m.behind, "ras_report.behind"),
                             _notes(m.errors, "ras_report.errors"), m.timeouts,
                             _text(m.repaired, "ras_report.repaired", 64),
                             max(m.missing_total, len(m.missing)), max(m.behind_total, len(m.behind)),
                             max(m.errors_total, len(m.errors)))
    detail = _text(m.detail.replace("\n", " "), "ras_report.detail", MAX_DETAIL)
    return RasReport(m.id, m.job, m.job_id, QueryResult(m.outcome, detail, m.seconds, summary))


