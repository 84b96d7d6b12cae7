"""Robust straggler scoring per job and step.

A synchronous step hides the straggler in its total time (everyone waits for
it), so the score uses the split the training loop reports: compute time
(``step_seconds - comm_seconds``) and communication time.  The slow rank has
a LATE compute and a SHORT communication (it arrives last, the others wait on
it: the inversion of DESIGN.md); a rank whose own transfers are slow shows a
long communication time with a normal compute time.

Peers: ranks of the same pipeline stage (``group.pp``, or inferred from the
job layout with Megatron rank order tp < dp < pp); without either the job is
one peer group.  Score: robust z with median/MAD and a MAD floor of a share of
the median step time.  A rank is flagged in a step when z >= ``straggler_z``
and its lateness is at least ``straggler_min_impact`` of the step; when more
than ``straggler_mass_ratio`` of a group is late at once nobody is flagged
(not an individual straggler).  Persistent: flagged in ``straggler_persist``
of the last ``straggler_window`` steps; cleared (hysteresis) when fewer than
``straggler_clear`` flags remain.  Patterns that must not page as hardware:
a whole stage late (StageImbalance, info), a different rank each step and
periodic pauses (neither reaches the persistence bar).

Intake (``add``), per job (``job_id`` when the job sends one, so two jobs named
``train`` stay apart, else the name):

* A step of 2^53 or more, or more than ``MAX_STEP_AHEAD`` ahead of the job's
  newest, is refused and counted (``refused``): one accepted line with
  ``"step": 9007199254740992`` made every later step "far too old" and turned
  scoring off for the job for 10 minutes.
* Steps that go back while time goes on are a restart from a checkpoint: once
  ``RESTART_QUORUM`` ranks (or every rank of a smaller job) report steps far
  behind the newest with times at least the job's newest, a new run starts from
  there (pending steps dropped, ranks keep their history).  Before, every step
  until the job caught up with its old newest was ignored (a restart 500 steps
  back raised its straggler alert 469 s late).  Old steps with old times (a
  spool replay) are late reports, not a restart, and are ignored as before; one
  rank alone going back cannot move the job.
* A rank that reports from another node or GPU has moved there (a job restarted
  elsewhere under the same name): its placement follows and its flags restart,
  so a straggler is never blamed on the node it left.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..rank_timing import MAX_STEP, JobLayout, RankTiming
from .config import DetectionSettings

if TYPE_CHECKING:
    from ..components import Component

MAX_STEP_AHEAD = 1000  # steps beyond the job's newest that one line may claim
RESTART_QUORUM = 3  # ranks going back together before a job counts as restarted
RESTART_WINDOW_S = 120.0  # a restart's ranks report back within this much sample time
# Why a rank timing was refused at the straggler intake (fabricmon_ingest_rank_timings_dropped_total{reason}).
STEP_RANGE = "step_range"
STEP_AHEAD = "step_ahead"
# a line from another place (node, gpu) than the rank's own history, not (yet) a confirmed move
MOVE_PENDING = "move_pending"
REFUSE_REASONS = (STEP_RANGE, STEP_AHEAD, MOVE_PENDING)
# A rank moves (restarted elsewhere) only on its new place's own history: this many consistent lines
# from there while its old place stayed silent for all but one as many of the job's median steps.  One line (or a
# few between the real rank's steps) from someone else naming another GPU never erases its history.
MOVE_QUORUM = 3


@dataclass(slots=True)
class RankInfo:
    node: str
    gpu: int
    stage: int
    hist_c: int = 0  # bit i: flagged compute-late i steps ago
    hist_m: int = 0  # comm-late
    steps: int = 0
    persistent: str = ""  # "", "compute", "comm"
    score: float = 0.0
    late_frac: float = 0.0  # lateness as a share of the median step, last step
    late_ewma: float = 0.0
    last_ts: float = 0.0
    # a place other than (node, gpu) the rank's lines came from, and how many consistent lines since
    cand: tuple[str, int] | None = None
    cand_n: int = 0


@dataclass
class JobState:
    name: str
    job_id: str = ""  # the scheduler's id when the job sends one: two jobs of one name stay apart
    layout: dict[str, int] = field(default_factory=dict)
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    steps: dict[int, dict[int, tuple[float, float]]] = field(default_factory=dict)
    max_step: int = -1
    last_ts: float = 0.0
    back: dict[int, tuple[int, float, float, float]] = field(default_factory=dict)  # rank -> restart candidate
    run_ts: float = 0.0  # sample time the current run started (a restart); earlier lines are the old run's
    runs: int = 1
    stage_hist: dict[int, int] = field(default_factory=dict)
    stage_late: dict[int, float] = field(default_factory=dict)
    stage_persistent: set[int] = field(default_factory=set)
    mass_hist: int = 0
    mass_persistent: bool = False
    step_median: float = 0.0
    evaluated: int = 0
    # the job's part of the report, valid while (evaluated, number of ranks) is unchanged: it
    # changes only when a step is scored, and ticks come several times per step
    report_key: tuple[int, int] = (-1, -1)
    report: _JobReport = ((), (), {}, (), frozenset())


@dataclass(frozen=True, slots=True)
class Straggler:
    job: str
    rank: int
    node: str
    gpu: int
    kind: str  # "compute" or "comm"
    score: float
    late_frac: float
    current: bool = True  # flagged in the newest scored step
    job_id: str = ""  # the scheduler's id when the job sends one (alert label job_id)


@dataclass(frozen=True, slots=True)
class StageLate:
    job: str
    stage: int  # -1: unknown stage (no layout), many ranks late together
    late_frac: float
    ranks: tuple[int, ...]
    job_id: str = ""


# one job's part of the report: stragglers, late stages, slowish (job, rank) -> (node, gpu), early ones,
# (node, gpu) compute-late in >= clear of the window
_JobReport = tuple[tuple[Straggler, ...], tuple[StageLate, ...], dict[tuple[str, int], tuple[str, int]],
                   tuple[Straggler, ...], frozenset[tuple[str, int]]]


@dataclass
class StragglerReport:
    stragglers: list[Straggler]
    stages: list[StageLate]
    slowish: dict[tuple[str, int], tuple[str, int]]  # (job, rank) -> (node, gpu) flagged in >= clear of window
    early: list[Straggler] = field(default_factory=list)  # compute-late in >= clear steps incl. the newest
    # (node, gpu) with a rank compute-late in >= clear of the window: several on one node are the node's to
    # decide (a host or input pipeline), one alone the hardware signature (correlator._siblings_pending)
    compute_late: frozenset[tuple[str, int]] = frozenset()
    # (job, rank) pairs per component on their paths, built once per report by the correlator: the
    # report is cached per scored step and reused by every tick until the next one
    hurt_by_component: dict[Component, set[tuple[str, int]]] | None = field(default=None, repr=False, compare=False)
    # (job, job_id) -> every rank's (node, gpu): where a job runs, whose rings cross which uplinks
    # (uplink_paths.py, which caches what it derives in ``leaves_by_job``)
    placement: dict[tuple[str, str], tuple[tuple[str, int], ...]] = field(default_factory=dict, repr=False,
                                                                          compare=False)
    leaves_by_job: dict[tuple[str, str], dict[int | None, set[str]]] = field(default_factory=dict, repr=False,
                                                                          compare=False)
    # what the correlator's localization derives from this report and the topology alone (its groups and
    # their paths' components), kept with the topology version it came from (correlator._Localized)
    localized: object = field(default=None, repr=False, compare=False)


class StragglerTracker:
    def __init__(self, settings: DetectionSettings) -> None:
        self.s = settings
        self.jobs: dict[str, JobState] = {}
        self._mask = (1 << settings.straggler_window) - 1
        self._report_key: tuple[tuple[str, tuple[int, int]], ...] | None = None
        self._report = StragglerReport([], [], {})
        self.refused: dict[str, int] = dict.fromkeys(REFUSE_REASONS, 0)
        self.restarts_total = 0
        self.moves_total = 0

    # --- intake ---
    def layout(self, lay: JobLayout) -> None:
        job = self.jobs.setdefault(lay.job, JobState(lay.job))
        job.layout = dict(lay.layout)

    def add(self, t: RankTiming, node: str) -> str | None:
        """Take one rank timing; the reason (of REFUSE_REASONS) when it is refused, counted."""
        if t.step > MAX_STEP:
            return self._refuse(STEP_RANGE)
        key = f"{t.job}\x00{t.job_id}" if t.job_id else t.job
        job = self.jobs.get(key)
        if job is None:
            job = self.jobs[key] = JobState(t.job, t.job_id)
        elif t.step > job.max_step + MAX_STEP_AHEAD:
            return self._refuse(STEP_AHEAD)
        where = (t.node or node, t.gpu_index)
        info = job.ranks.get(t.rank)
        if info is None:
            info = job.ranks[t.rank] = RankInfo(where[0], where[1], self._stage(job, t))
        elif (info.node, info.gpu) != where:
            if not self._move_confirmed(job, info, where, t.ts):
                return self._refuse(MOVE_PENDING)
            # moved (restarted elsewhere): its flags described the old place
            self.moves_total += 1
            info.cand, info.cand_n = None, 0
            info.node, info.gpu = where
            info.stage = self._stage(job, t)
            info.hist_c = info.hist_m = 0
            info.persistent = ""
            info.late_ewma = 0.0
        else:
            info.cand, info.cand_n = None, 0  # its own place spoke: whatever claimed another is not a move
        info.last_ts = t.ts
        vals = (t.step_seconds, min(t.comm_seconds, t.step_seconds))
        far_back = t.step <= job.max_step - 4 * self.s.straggler_window
        if far_back and t.ts >= job.last_ts:
            self._restart_candidate(job, t, vals)
            return None
        if far_back or (t.ts < job.run_ts and t.step > job.max_step):
            return None  # a late report of an old step, or of the run before a restart: already evaluated
        job.steps.setdefault(t.step, {})[t.rank] = vals
        if t.step > job.max_step:
            job.max_step = t.step
        if t.ts > job.last_ts:
            job.last_ts = t.ts
        return None

    @staticmethod
    def _move_confirmed(job: JobState, info: RankInfo, where: tuple[str, int], ts: float) -> bool:
        """Count one line from ``where``; a move once MOVE_QUORUM of them came while the old place was silent
        for MOVE_QUORUM - 1 of the job's median steps."""
        if info.cand == where:
            info.cand_n += 1
        else:
            info.cand, info.cand_n = where, 1
        return info.cand_n >= MOVE_QUORUM and ts - info.last_ts >= (MOVE_QUORUM - 1) * job.step_median

    def _refuse(self, reason: str) -> str:
        self.refused[reason] += 1
        return reason

    def _restart_candidate(self, job: JobState, t: RankTiming, vals: tuple[float, float]) -> None:
        """Steps far back with time going on: a restart once enough ranks agree (see the module doc)."""
        job.back[t.rank] = (t.step, t.ts, *vals)
        for r in [r for r, b in job.back.items() if b[1] < t.ts - RESTART_WINDOW_S]:
            del job.back[r]
        if len(job.back) < min(RESTART_QUORUM, max(len(job.ranks), 1)):
            return
        self.restarts_total += 1
        job.runs += 1
        job.steps = {}
        job.max_step = max(b[0] for b in job.back.values())
        job.run_ts = min(b[1] for b in job.back.values())
        job.last_ts = max(job.last_ts, max(b[1] for b in job.back.values()))
        for r, (step, _, st, cm) in job.back.items():
            job.steps.setdefault(step, {})[r] = (st, cm)
        job.back = {}

    @staticmethod
    def _stage(job: JobState, t: RankTiming) -> int:
        for k, v in t.group:
            if k == "pp":
                return v
        lay = job.layout
        if lay.get("pp", 1) > 1:
            inner = lay.get("tp", 1) * lay.get("dp", 1)
            return t.rank // max(inner, 1)
        return 0

    # --- scoring ---
    def evaluate(self, now: float) -> StragglerReport:
        for name in list(self.jobs):
            job = self.jobs[name]
            if job.last_ts and now - job.last_ts > 600.0:
                del self.jobs[name]
                self._report_key = None  # a job of the same name may come back with the same key
                continue
            n_known = len(job.ranks)
            for step in sorted(job.steps):
                reports = job.steps[step]
                if len(reports) >= n_known or step <= job.max_step - 2:
                    del job.steps[step]
                    if len(reports) >= 3:
                        self._score_step(job, reports)
            key = (job.evaluated, len(job.ranks))
            if key != job.report_key:
                job.report_key, job.report = key, self._job_report(job)
        # ticks outnumber scored steps (4 a second against one): between two, the same report object,
        # so what the correlator derives from it (StragglerReport.hurt_by_component) is kept too
        all_keys = tuple((name, job.report_key) for name, job in self.jobs.items())
        if all_keys != self._report_key:
            self._report_key, self._report = all_keys, self._merged_report()
        return self._report

    def _merged_report(self) -> StragglerReport:
        stragglers: list[Straggler] = []
        stages: list[StageLate] = []
        slowish: dict[tuple[str, int], tuple[str, int]] = {}
        early: list[Straggler] = []
        compute_late: set[tuple[str, int]] = set()
        placement: dict[tuple[str, str], tuple[tuple[str, int], ...]] = {}
        for job in self.jobs.values():
            placement[job.name, job.job_id] = tuple((r.node, r.gpu) for r in job.ranks.values())
            js, jst, jslow, jearly, jcomp = job.report
            stragglers.extend(js)
            stages.extend(jst)
            slowish.update(jslow)
            early.extend(jearly)
            compute_late |= jcomp
        return StragglerReport(stragglers, stages, slowish, early, frozenset(compute_late), placement=placement)

    def _job_report(self, job: JobState) -> _JobReport:
        name, jid, clear = job.name, job.job_id, self.s.straggler_clear
        stragglers: list[Straggler] = []
        early: list[Straggler] = []
        slowish: dict[tuple[str, int], tuple[str, int]] = {}
        compute_late: set[tuple[str, int]] = set()
        for rank, info in job.ranks.items():
            if info.persistent:
                h = info.hist_c if info.persistent == "compute" else info.hist_m
                stragglers.append(Straggler(name, rank, info.node, info.gpu, info.persistent, info.score,
                                            info.late_ewma, bool(h & 3), jid))
            elif info.hist_c & 1 and info.hist_c.bit_count() >= clear:
                early.append(Straggler(name, rank, info.node, info.gpu, "compute", info.score, info.late_ewma, True,
                                       jid))
            if (info.hist_c | info.hist_m).bit_count() >= clear:
                slowish[(name, rank)] = (info.node, info.gpu)
            if info.hist_c.bit_count() >= clear:
                compute_late.add((info.node, info.gpu))
        stages = [StageLate(name, stage, job.stage_late.get(stage, 0.0),
                            tuple(sorted(r for r, i in job.ranks.items() if i.stage == stage)), jid)
                  for stage in sorted(job.stage_persistent)]
        if job.mass_persistent:
            stages.append(StageLate(name, -1, 0.0, (), jid))
        return tuple(stragglers), tuple(stages), slowish, tuple(early), frozenset(compute_late)

    def _score_step(self, job: JobState, reports: dict[int, tuple[float, float]]) -> None:
        s = self.s
        ranks = np.fromiter(reports.keys(), dtype=np.int64, count=len(reports))
        vals = np.array(list(reports.values()), dtype=np.float64)
        step_t, comm = vals[:, 0], vals[:, 1]
        compute = step_t - comm
        stage_of = np.array([job.ranks[int(r)].stage for r in ranks], dtype=np.int64)
        ring_c, ring_m = _ring_medians(stage_of, np.array([job.ranks[int(r)].gpu for r in ranks], dtype=np.int64),
                                       compute, comm)
        job_med_step = float(np.median(step_t))
        job.step_median = job_med_step
        job.evaluated += 1
        flags_c = np.zeros(len(ranks), dtype=bool)
        flags_m = np.zeros(len(ranks), dtype=bool)
        scores = np.zeros(len(ranks))
        lates = np.zeros(len(ranks))
        mass_any = False
        stage_meds: dict[int, float] = {}
        for stage in np.unique(stage_of):
            idx = np.nonzero(stage_of == stage)[0]
            c, m, st = compute[idx], comm[idx], step_t[idx]
            med_step = float(np.median(st))
            floor = max(s.straggler_mad_floor * med_step, 1e-9)
            mc = float(np.median(c))
            stage_meds[int(stage)] = mc
            if len(idx) < 3:
                continue
            mm = float(np.median(m))
            # compute and comm against the rank's own ring (ring_medians): the step-end wait for a slower
            # ring is common to a ring's ranks, so a slow GPU on the rail of a degraded link stays late
            rc, rm = ring_c[idx], ring_m[idx]
            c = np.where(np.isnan(rc), c, c - rc + mc)
            m_own = np.where(np.isnan(rm), m, m - rm + mm)
            sc = max(1.4826 * float(np.median(np.abs(c - mc))), floor)
            sm = max(1.4826 * float(np.median(np.abs(m - mm))), floor)
            zc = (c - mc) / sc
            zm = (m - mm) / sm
            impact = s.straggler_min_impact * med_step
            fc = (zc >= s.straggler_z) & ((c - mc) >= impact) & (m_own <= mm + sc)
            fm = (zm >= s.straggler_z) & ((m - mm) >= impact) & (zc < 2.0)
            limit = max(2, math.ceil(s.straggler_mass_ratio * len(idx)))
            if fc.sum() >= limit:
                fc[:] = False
                mass_any = True
            if fm.sum() >= limit:
                fm[:] = False
            flags_c[idx] = fc
            flags_m[idx] = fm
            scores[idx] = np.maximum(np.maximum(zc, zm), 0.0)
            lates[idx] = np.maximum(c - mc, m - mm) / max(med_step, 1e-9)
        mask = self._mask
        persist, clear = s.straggler_persist, s.straggler_clear
        for i, r in enumerate(ranks.tolist()):
            info = job.ranks[r]
            info.hist_c = ((info.hist_c << 1) | int(flags_c[i])) & mask
            info.hist_m = ((info.hist_m << 1) | int(flags_m[i])) & mask
            info.steps += 1
            info.score = float(scores[i])
            info.late_frac = float(lates[i])
            info.late_ewma = 0.8 * info.late_ewma + 0.2 * info.late_frac
            pc, pm = info.hist_c.bit_count(), info.hist_m.bit_count()
            if not info.persistent:
                if pc >= persist:
                    info.persistent = "compute"
                elif pm >= persist:
                    info.persistent = "comm"
            else:
                cur = pc if info.persistent == "compute" else pm
                if cur < clear:
                    info.persistent = ""
        # stage imbalance: one stage's median compute well above the others
        if len(stage_meds) >= 2:
            meds = np.array(list(stage_meds.values()))
            overall = float(np.median(meds))
            worst = max(stage_meds, key=stage_meds.__getitem__)
            impact = s.straggler_min_impact * job_med_step
            ring_late = {int(st) for st in np.unique(stage_of[flags_m])}
            for stage in stage_meds:
                # a stage whose own ranks are comm-late is waiting for one of its rings (a link or leaf:
                # the correlator's case), not computing more than the others
                late = stage == worst and stage_meds[stage] - overall >= impact and stage not in ring_late
                h = ((job.stage_hist.get(stage, 0) << 1) | int(late)) & mask
                job.stage_hist[stage] = h
                if late:
                    job.stage_late[stage] = (stage_meds[stage] - overall) / max(job_med_step, 1e-9)
                if h.bit_count() >= persist:
                    job.stage_persistent.add(stage)
                elif h.bit_count() < clear:
                    job.stage_persistent.discard(stage)
        job.mass_hist = ((job.mass_hist << 1) | int(mass_any)) & mask
        pcm = job.mass_hist.bit_count()
        if pcm >= persist:
            job.mass_persistent = True
        elif pcm < clear:
            job.mass_persistent = False

    def lateness_by_job(self, top: int | None = None) -> list[tuple[str, str, int, float]]:
        """(job, job_id, rank, score), the ``top`` latest ranks of each job (all when None), latest first;
        job_id ("" when the job sends none) keeps two jobs of one name apart in /metrics."""
        out: list[tuple[str, str, int, float]] = []
        for j in self.jobs.values():
            items = j.ranks.items()
            best = (heapq.nlargest(top, items, key=lambda ri: ri[1].score) if top is not None
                    else sorted(items, key=lambda ri: -ri[1].score))
            out.extend((j.name, j.job_id, r, i.score) for r, i in best)
        return out


RING_MIN = 3  # ranks of one ring before its median stands for it


def _ring_medians(stage_of: np.ndarray, gpu_of: np.ndarray, compute: np.ndarray, comm: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the median compute and comm time of its ring (DESIGN "Correlation": the ranks of one
    pipeline stage with one local GPU index all-reduce over one rail), NaN where the ring has fewer than
    ``RING_MIN`` ranks.  ``step - comm`` holds the wait at the step's end for the slowest ring, which is
    the same for every rank of a ring and differs between rings: with a degraded link on rail 7, every
    rank of the other rails looks ``R7 - R`` later in compute than the rail-7 ranks, which hid a slow
    GPU on rail 7 (its excess less that wait) and let its ring's long comm disqualify it.  Measured
    against its ring, that wait cancels out; where GPU indexes are no rings, each ring's median is the
    stage's and nothing moves."""
    ring_c = np.full(len(compute), np.nan)
    ring_m = np.full(len(comm), np.nan)
    key = stage_of * 4096 + gpu_of
    for k in np.unique(key):
        idx = np.nonzero(key == k)[0]
        if len(idx) >= RING_MIN:
            ring_c[idx] = float(np.median(compute[idx]))
            ring_m[idx] = float(np.median(comm[idx]))
    return ring_c, ring_m
