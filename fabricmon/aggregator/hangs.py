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
# Budgets, so that one node (any local user on it can post heartbeats for any job name) cannot fill the
# table and blind hang detection for everyone else: ranks one node may bring, jobs it may bring ranks
# of, and ranks one job may have.  A node hosts a few ranks per GPU; a job a few per GPU of the cluster.
MAX_RANKS_PER_NODE = 4096
MAX_JOBS_PER_NODE = 256
MAX_RANKS_PER_JOB = 1 << 17
# A rank's RAS address is trusted only from its own history: this many heartbeats from one node.
RAS_HISTORY = 3
# Why a heartbeat was dropped (fabricmon_heartbeats_dropped_total{reason}): fixed, input adds no series.
DROP_REASONS = ("table_full", "node_budget", "node_jobs", "job_budget", "conflict")


@dataclass(slots=True)
class RankBeat:
    node: str
    step: int
    coll_sn: int
    in_collective: bool
    ts: float  # newest heartbeat (the agent's receipt time, intake.py: not the client's claim)
    moved: float  # when coll_sn last changed
    nccl_ras: str = ""  # the RAS address its job announced (aggregator/ras_queries.py), "" for none
    beats: int = 1  # heartbeats from ``node`` (its own history: a RAS address counts from RAS_HISTORY)

    @property
    def ras(self) -> str:
        """The RAS address, once the rank has a history of its own ("" before)."""
        return self.nccl_ras if self.beats >= RAS_HISTORY else ""


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
        self._node_ranks: dict[str, int] = {}  # node -> ranks it holds
        self._node_jobs: dict[str, dict[tuple[str, str], int]] = {}  # node -> job -> ranks of it there
        self.dropped = dict.fromkeys(DROP_REASONS, 0)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def _hold(self, node: str, key: tuple[str, str], n: int) -> None:
        self._n += n
        self._node_ranks[node] = self._node_ranks.get(node, 0) + n
        jobs = self._node_jobs.setdefault(node, {})
        jobs[key] = jobs.get(key, 0) + n
        if jobs[key] <= 0:
            del jobs[key]
        if self._node_ranks[node] <= 0:
            del self._node_ranks[node], self._node_jobs[node]

    def add(self, h: Heartbeat, node: str) -> None:
        """Take one heartbeat from ``node``'s stream.  ``h.ts`` is the agent's receipt time.  A (job, rank)
        alive on one node is not taken over by another node's heartbeats (counted as a conflict)."""
        key = (h.job, h.job_id)
        src = h.node or node
        jb = self.jobs.get(key)
        rb = jb.ranks.get(h.rank) if jb is not None else None
        if rb is None:
            if self._n >= MAX_RANKS:
                return self._drop("table_full")
            if self._node_ranks.get(src, 0) >= MAX_RANKS_PER_NODE:
                return self._drop("node_budget")
            if key not in self._node_jobs.get(src, {}) and len(self._node_jobs.get(src, {})) >= MAX_JOBS_PER_NODE:
                return self._drop("node_jobs")
            if jb is not None and len(jb.ranks) >= MAX_RANKS_PER_JOB:
                return self._drop("job_budget")
            if jb is None:
                jb = self.jobs[key] = JobBeats(h.job, h.job_id)
            self._hold(src, key, 1)
            jb.ranks[h.rank] = RankBeat(src, h.step, h.coll_sn, h.in_collective, h.ts, h.ts, h.nccl_ras)
            return None
        if src != rb.node:
            if h.ts - rb.ts <= ALIVE_S:
                return self._drop("conflict")  # its own node still speaks for it: not a takeover
            # its node went silent: the rank restarted elsewhere, with no history there yet
            self._hold(rb.node, key, -1)
            self._hold(src, key, 1)
            rb.node, rb.beats, rb.ts, rb.moved = src, 0, h.ts, h.ts
        if h.ts < rb.ts:
            return None  # an older heartbeat replayed from a spool
        if h.coll_sn != rb.coll_sn or h.step != rb.step:
            rb.moved = h.ts
        rb.step, rb.coll_sn, rb.in_collective, rb.ts = h.step, h.coll_sn, h.in_collective, h.ts
        rb.nccl_ras = h.nccl_ras
        rb.beats += 1
        return None

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
                    for b in jb.ranks.values():
                        self._hold(b.node, key, -1)
                    del self.jobs[key]  # ended long ago
                continue
            # a rank's first heartbeat is no progress: a fresh (job, rank) from anywhere must not hide a hang
            since = max((b.moved for b in alive.values() if b.beats > 1), default=max(b.moved for b in alive.values()))
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
