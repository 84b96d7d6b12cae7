"""Hung jobs from heartbeats (DESIGN "Jobs, decoys and cost"): ``JobHung`` naming the rank within 60 s.

Each rank's background thread sends a heartbeat every 5 s with its step, its collective sequence
number ``coll_sn`` and whether it is inside a collective.  A hung job is one whose ranks keep
sending heartbeats while no ``coll_sn`` moves for ``stall_s``: progress stopped, the processes live.
The rank that hangs it is the one its peers wait for: outside the collective (or behind on
``coll_sn``) while most of its peers sit inside the next one.  What is never a hang:

- a checkpoint: every rank stalls together *outside* collectives (nobody waits for anybody);
- a restart or the end of a job: heartbeats stop (the ranks exited);
- a slow step: ``coll_sn`` still moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..rank_timing import Heartbeat
from .wording import at

if TYPE_CHECKING:
    from ..topology import Topology
    from .incidents import Finding

HEARTBEAT_S = 5.0
# no coll_sn moved for this long (four heartbeats): with 5 s polls and the tick, named within about 35 s;
# a collective legitimately taking this long is not a training job's
STALL_S = 20.0
ALIVE_S = 3 * HEARTBEAT_S  # a rank whose last heartbeat is older has exited (restart, end)
WAITING_SHARE = 0.5  # at least this share of the job's ranks inside a collective, waiting
MAX_RANKS = 1 << 20  # tracked (job, rank) pairs, all jobs together


@dataclass(slots=True)
class RankBeat:
    node: str
    step: int
    coll_sn: int
    in_collective: bool
    ts: float  # newest heartbeat
    moved: float  # when coll_sn last changed
    nccl_ras: str = ""  # the RAS address its job announced (aggregator/ras_queries.py), "" for none


@dataclass
class JobBeats:
    name: str
    job_id: str
    ranks: dict[int, RankBeat] = field(default_factory=dict)


@dataclass(frozen=True)
class Hang:
    job: str
    job_id: str
    ranks: tuple[int, ...]  # the ranks the others wait for
    nodes: tuple[str, ...]
    since: float  # when progress stopped
    waiting: int  # ranks inside a collective, waiting


class HeartbeatTracker:
    def __init__(self, stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self.jobs: dict[tuple[str, str], JobBeats] = {}
        self._n = 0
        self.dropped_total = 0  # heartbeats past MAX_RANKS

    def add(self, h: Heartbeat, node: str) -> None:
        key = (h.job, h.job_id)
        jb = self.jobs.get(key)
        if jb is None:
            jb = self.jobs[key] = JobBeats(h.job, h.job_id)
        rb = jb.ranks.get(h.rank)
        if rb is None:
            if self._n >= MAX_RANKS:
                self.dropped_total += 1
                return
            self._n += 1
            jb.ranks[h.rank] = RankBeat(h.node or node, h.step, h.coll_sn, h.in_collective, h.ts, h.ts, h.nccl_ras)
            return
        if h.ts < rb.ts:
            return  # an older heartbeat replayed from a spool
        if h.coll_sn != rb.coll_sn or h.step != rb.step:
            rb.moved = h.ts
        rb.node, rb.step, rb.coll_sn, rb.in_collective, rb.ts = h.node or node, h.step, h.coll_sn, h.in_collective, h.ts
        rb.nccl_ras = h.nccl_ras

    def hangs(self, now: float, stall_s: float | None = None) -> list[Hang]:
        """Jobs hung at ``now``: no progress for ``stall_s`` (default the tracker's) with peers waiting.
        A shorter ``stall_s`` gives the suspects (aggregator/ras_queries.py asks their NCCL RAS)."""
        stall = self.stall_s if stall_s is None else stall_s
        out = []
        for key in list(self.jobs):
            jb = self.jobs[key]
            alive = {r: b for r, b in jb.ranks.items() if now - b.ts <= ALIVE_S}
            if not alive:
                if all(now - b.ts > 10 * ALIVE_S for b in jb.ranks.values()):
                    self._n -= len(jb.ranks)
                    del self.jobs[key]  # ended long ago
                continue
            since = max(b.moved for b in alive.values())
            if now - since < stall:
                continue  # some rank still makes progress
            waiting = [r for r, b in alive.items() if b.in_collective]
            if len(waiting) < WAITING_SHARE * len(alive):
                continue  # everyone stalled outside collectives together: a checkpoint, not a hang
            top = max(b.coll_sn for b in alive.values())
            culprits = sorted(r for r, b in alive.items() if not b.in_collective or b.coll_sn < top)
            if not culprits or len(culprits) == len(alive):
                continue
            out.append(Hang(jb.name, jb.job_id, tuple(culprits), tuple(sorted({alive[r].node for r in culprits})),
                            since, len(waiting)))
        return out


def hung_job_findings(hangs: list[Hang], gpu_of: Callable[[str, str, int], int | None], topology: Topology,
                      cluster: str, ras_evidence: Callable[[Hang], list[str]] | None = None,
                      ras_verdict: Callable[[Hang], str] | None = None) -> list[Finding]:
    """``JobHung`` (critical) per hung job, on the first rank the others wait for (its GPU, as the topology
    hands it out, when its rank timings told which, else its node); the other culprits in the evidence,
    and what the job's NCCL RAS said when it was asked (``ras_evidence(hang)``: lines, none without RAS;
    ``ras_verdict(hang)``: that answer in a phrase for the description, "" until it answered).
    A node the topology lacks still gets its GPU (without rail or leaf)."""
    from .. import components as comp
    from .incidents import Finding

    out: list[Finding] = []
    for h in hangs:
        rank = h.ranks[0]
        gpu = gpu_of(h.job, h.job_id, rank)
        node = h.nodes[0]
        lab = {"hpc_job": h.job, "node": node, "rank": str(rank)}
        if h.job_id:
            lab["job_id"] = h.job_id
        if gpu is not None:
            lab["gpu"] = str(gpu)
        if cluster:
            lab["cluster"] = cluster
        where = topology.gpu(node, gpu) if gpu is not None else comp.node(node)
        more = f" (and {len(h.ranks) - 1} more: {', '.join(map(str, h.ranks[1:6]))})" if len(h.ranks) > 1 else ""
        verdict = ras_verdict(h) if ras_verdict is not None else ""
        out.append(Finding(
            "JobHung", where, lab,
            [f"no collective progress since {at(h.since)} while heartbeats go on",
             f"{h.waiting} rank(s) wait inside a collective for rank {rank}{more}",
             *(ras_evidence(h) if ras_evidence is not None else ())],
            ranks=h.ranks[:64], jobs=(h.job,), severity="critical", hold_s=2 * HEARTBEAT_S,
            description=f"job {h.job} is hung: rank {rank} on {node} never entered the collective its peers wait "
                        f"in (its process is alive: heartbeats go on)" + (f"; {verdict}" if verdict else "")))
    return out
