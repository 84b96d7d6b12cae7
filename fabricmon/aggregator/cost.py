"""What an incident costs each job (DESIGN "Jobs, decoys and cost"): step slowdown and GPU-hours per hour.

For a job whose ranks use the incident's component:

- ``step_slowdown``: the median time of the job's steps that start while the incident is open, over the
  median of its last 20 clean steps (no other incident open on the job) before the fault began, minus 1.
  The fault began before the incident opened: a straggler is flagged after ``straggler_persist`` of
  ``straggler_window`` late steps (and may wait for evidence), a counter finding after evidence in
  ``persist_windows`` of ``of_windows`` windows.  So the baseline ends ``2 x straggler_window`` of the job's
  steps before ``first_seen`` (the first late step is at most a window back; a window more keeps its
  ramp out) and no later than the detection lead (``of_windows`` windows) before it; other incidents'
  spans start their lead early too.  ``None`` without a clean baseline (the job started during the fault).
- Overlapping incidents on one job share its slowdown by time slices (``_sliced_slowdown``): the steps
  that start while an incident is the job's only open one measure it; one with no such steps (it opened
  and closed inside another) takes the joint slowdown less what the others measured alone.
- A job that completes no step while the incident is open (for longer than a few of its own steps) has
  ``step_slowdown: None, stopped: True`` and costs all its GPUs; a job ``JobHung`` names is stopped from
  the moment it fires, so the firing notification carries the cost.
- ``gpu_hours_per_hour`` = GPUs x (1 - 1 / (1 + step_slowdown)): the share of the job's GPU time the
  fault wastes.

One record per completed step (every rank of a synchronous job reports the same step), bounded per
job; pure functions of what was recorded, so tests feed steps and read impacts.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import components as comp
from ..components import Component, Kind
from .config import DetectionSettings
from .job_gpus import JobGpus
from .uplink_paths import crossing_jobs, jobs_crossing

if TYPE_CHECKING:
    from ..topology import Topology
    from .stragglers import StragglerTracker

BASELINE_STEPS = 20
MAX_STEPS = 4096  # per job: at a step a second, an hour of history
STOPPED_AFTER_STEPS = 5  # no step for this many of the job's median steps while the incident is open
HUNG_ALERT = "JobHung"
MAX_EXCESS_KEYS = 4096  # (GPU, job) pairs whose late compute is remembered
OWN_STEPS = 3  # steps of its own (no later incident on the job open) that an incident's slowdown needs
COMM_SHARE_MIN = 0.05  # below this a job's comm times say nothing of its transfers (a share of a clean step)


@dataclass
class JobSteps:
    name: str
    job_id: str = ""
    gpus: int = 0
    starts: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))
    seconds: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))
    comms: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))  # NaN: not reported
    last_step: int = -1
    last_end: float = 0.0


@dataclass(frozen=True)
class JobImpact:
    job: str
    job_id: str
    step_slowdown: float | None
    stopped: bool
    gpu_hours_per_hour: float
    # the scheduler has the job on the component but it reports no step times: listed, not measured,
    # with its GPUs on the component ("node-017/gpu3")
    exposed: bool = False
    gpus: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"job": self.job, "job_id": self.job_id or None,
               "step_slowdown": None if self.step_slowdown is None else round(self.step_slowdown, 4),
               "stopped": self.stopped, "gpu_hours_per_hour": round(self.gpu_hours_per_hour, 2)}
        if self.exposed:
            out["exposed"] = True
            out["gpus"] = list(self.gpus)
        return out


class StepLog:
    """Completed steps per job, fed from rank timings (once per job and step)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobSteps] = {}

    def record(self, job: str, step: int, end_ts: float, seconds: float, *, job_id: str = "",
               gpus: int = 0, comm: float | None = None) -> None:
        js = self.jobs.get(job)
        if js is None:
            js = self.jobs[job] = JobSteps(job, job_id)
        if gpus:
            js.gpus = max(js.gpus, gpus)
        if end_ts <= js.last_end + 1e-6 and step <= js.last_step:
            return  # another rank of a step already logged, or a late one of an older step
        # (a step number lower than the last with a later end is a restart from a checkpoint: logged)
        js.last_step, js.last_end = step, end_ts
        start = end_ts - seconds
        if js.starts and start < js.starts[-1]:
            return  # out of order: the log stays sorted by start
        js.starts.append(start)
        js.seconds.append(seconds)
        js.comms.append(comm if comm is not None and comm > 0 else math.nan)

    def impact(self, job: str, first_seen: float, now: float,
               other_open: Sequence[tuple[float, float]] = (), *, baseline_end: float | None = None,
               skip_steps: int = 0, stopped: bool = False, other_adds: Sequence[bool] = (),
               direct_s: float | None = None, others_direct_s: Sequence[float | None] = (),
               others_nested: Sequence[bool] = ()) -> JobImpact | None:
        """``other_open``: (opened, closed or now) of the job's other incidents.  The baseline is the last
        ``BASELINE_STEPS`` steps that started before ``baseline_end`` (default ``first_seen``) and at least
        ``skip_steps`` of the job's steps before ``first_seen`` (module docstring), none under another
        incident; the steps measured are sliced by the other incidents open at their start (``other_adds``:
        whether each one's slowdown adds to this one's, ``_sliced_slowdown``).
        ``stopped``: the job is known to have stopped (JobHung fired): all its GPUs from now on."""
        js = self.jobs.get(job)
        if js is None:
            return None
        if stopped:
            return JobImpact(job, js.job_id, None, True, float(js.gpus))
        starts, secs, comms = list(js.starts), list(js.seconds), list(js.comms)
        i0 = bisect.bisect_left(starts, first_seen)
        i1 = bisect.bisect_left(starts, now)  # steps that start after ``now`` are not this incident's
        end = first_seen if baseline_end is None else min(baseline_end, first_seen)
        base: list[float] = []
        base_comm: list[float] = []
        for skip in (skip_steps, skip_steps // 2):
            i_end = min(bisect.bisect_left(starts, end), max(0, i0 - skip))
            base, base_comm = [], []
            for k in range(i_end - 1, -1, -1):
                if _inside(starts[k], other_open):
                    continue
                base.append(secs[k])
                if not math.isnan(comms[k]):
                    base_comm.append(comms[k])
                if len(base) >= BASELINE_STEPS:
                    break
            if len(base) >= BASELINE_STEPS // 2:
                break
        base_med = statistics.median(base) if base else None
        if i0 >= i1:
            typical = base_med if base_med is not None else (statistics.median(secs) if secs else None)
            if typical is not None and now - max(first_seen, js.last_end) > STOPPED_AFTER_STEPS * typical:
                return JobImpact(job, js.job_id, None, True, float(js.gpus))
            return JobImpact(job, js.job_id, None, False, 0.0)
        if base_med is None or base_med <= 0:
            return JobImpact(job, js.job_id, None, False, 0.0)
        # the share of a clean step in collectives: what a bandwidth factor on the job's path scales
        share = (min(1.0, max(COMM_SHARE_MIN, statistics.median(base_comm) / base_med))
                 if len(base_comm) >= BASELINE_STEPS // 2 else 1.0)
        slowdown = _sliced_slowdown(starts, secs, i0, i1, other_open, other_adds, base_med, direct_s, others_direct_s,
                                    others_nested, share)
        return JobImpact(job, js.job_id, slowdown, False, js.gpus * (1.0 - 1.0 / (1.0 + slowdown)))


def _inside(t: float, spans: Sequence[tuple[float, float]]) -> bool:
    return any(lo <= t < hi for lo, hi in spans)


def _slow(xs: Sequence[float], base: float) -> float:
    return max(0.0, statistics.median(xs) / base - 1.0)


def _sliced_slowdown(starts: Sequence[float], secs: Sequence[float], i0: int, i1: int,
                     others: Sequence[tuple[float, float]], adds: Sequence[bool], base: float,
                     direct_s: float | None = None, others_direct_s: Sequence[float | None] = (),
                     nested: Sequence[bool] = (), comm_share: float = 1.0) -> float:
    """An incident's share of its job's slowdown (DESIGN "Jobs, decoys and cost"); its steps are
    ``starts[i0:i1]``.  The steps that start while it is the job's only open incident are its own, and
    measure it when there are ``OWN_STEPS`` of them.  Otherwise:

    - a compute fault measured directly (``direct_s``: the late rank's compute excess over its peers, in
      seconds, which no fabric fault changes) is that excess over the baseline step;
    - else its steps are cut into time slices by the set of other incidents open at their start, and each
      slice of ``OWN_STEPS`` steps or more bounds it: within a phase two slowdowns do not add (the job's
      rings run in parallel and the step waits for the slowest: a bad link under a degraded leaf), so a
      slice's joint slowdown is at least this one's, except where the two lie on one path (``nested[k]``:
      a link under its leaf, the leaf's rail): they slow the same transfers one on top of the other (their
      rates multiply), and the other's own measure is divided out of the part of the step in collectives
      (``comm_share`` of a clean step, 1 when the job reports no comm time): with ``f`` that share, a
      step is ``(1 - f) + f / (a x b)`` of a clean one for rate factors ``a`` and ``b``, so the other's
      ``v`` gives ``1 / a = 1 + v / f`` and this one's own is ``f x ((1 + J / f) / (1 + v / f) - 1)`` for a
      joint ``J`` (dividing whole steps charged a leaf over a degraded link 0.25 for 0.16 alone); across
      phases they add (``adds[k]``: a slow GPU's
      compute and a bad NIC's ring are waited for one after the other), so what the other measured alone
      (its own slices, else its direct measure) is taken off, and the rest split with the others of the
      other phase that measured nothing.  The smallest bound stands: a link incident that outlives the
      degraded leaf above it is not charged the leaf's slowdown."""
    mine_s, mine_x = starts[i0:i1], secs[i0:i1]
    own = [x for st, x in zip(mine_s, mine_x, strict=True) if not _inside(st, others)]
    if len(own) >= OWN_STEPS:
        return _slow(own, base)
    if direct_s is not None:
        return max(0.0, direct_s / base)
    mine_span = (mine_s[0], mine_s[-1] + 1e-6)
    known: list[float | None] = []
    for k, span in enumerate(others):
        # what the other measured alone (its own slices) first, as an incident's own measure comes first above;
        # its direct measure only without them: a slow GPU's late compute over the median GPU reads high by
        # the jitter the step already waited for at the slowest GPU (a NIC inside it took ~0.02 too little)
        rest = [o for j, o in enumerate(others) if j != k] + [mine_span]
        own_o = [x for st, x in zip(starts, secs, strict=True) if span[0] <= st < span[1] and not _inside(st, rest)]
        d = others_direct_s[k] if k < len(others_direct_s) else None
        if len(own_o) >= OWN_STEPS:
            known.append(_slow(own_o, base))
        else:
            known.append(max(0.0, d / base) if d is not None else None)
    slices: dict[frozenset[int], list[float]] = {}
    for st, x in zip(mine_s, mine_x, strict=True):
        key = frozenset(k for k, (lo, hi) in enumerate(others) if lo <= st < hi)
        slices.setdefault(key, []).append(x)
    bounds = []
    for key, xs in slices.items():
        if len(xs) < OWN_STEPS and len(slices) > 1:
            continue
        add = [k for k in key if k < len(adds) and adds[k]]
        taken = sum(v for k in add if (v := known[k]) is not None)
        unknown = sum(1 for k in add if known[k] is None)
        # one path (a link under its degraded leaf): the two slow the same transfers, one on top of the other
        f = comm_share
        over = 1.0
        for k in key:
            if k < len(nested) and nested[k] and not (k < len(adds) and adds[k]) and (v := known[k]) is not None:
                over *= 1.0 + v / f
        joint = f * ((1.0 + _slow(xs, base) / f) / over - 1.0)
        bounds.append(max(0.0, joint - taken) / (1 + unknown))
    return min(bounds) if bounds else _slow(mine_x, base)


def impact_sentence(impacts: list[JobImpact], shown: int = 3) -> str:
    """``llm-70b 14% slower (31 GPU-hours/hour); vlm-13b 3% slower (4 GPU-hours/hour)``: by cost, at most
    ``shown`` jobs then ``+K more``; then the exposed jobs (on the component, no step times to measure:
    ``train exposed (8 GPUs)``); empty when nothing is hurt or exposed (a fault on idle nodes)."""
    hurt = sorted((i for i in impacts if i.stopped or (i.step_slowdown or 0) > 0),
                  key=lambda i: -i.gpu_hours_per_hour)
    listed = hurt + [i for i in impacts if i.exposed]
    parts = []
    for i in listed[:shown]:
        if i.exposed:
            what = f"exposed ({len(i.gpus)} GPU{'s' if len(i.gpus) != 1 else ''}, not measured)"
        elif i.stopped:
            what = f"stopped ({round(i.gpu_hours_per_hour)} GPU-hours/hour)"
        else:
            what = f"{round(100 * (i.step_slowdown or 0))}% slower ({round(i.gpu_hours_per_hour)} GPU-hours/hour)"
        parts.append(f"{i.job} {what}")
    if len(listed) > shown:
        parts.append(f"+{len(listed) - shown} more")
    return "; ".join(parts)


# What annotate reads of incidents.py's Finding, Incident and IncidentManager (incidents.py imports this
# module for JobImpact: protocols keep the two apart, tests/core/test_import_cycles.py)
class CostedFinding(Protocol):
    alertname: str
    component: Component
    labels: dict[str, str]
    fire: bool
    keep: bool
    jobs: tuple[str, ...]
    severity: str
    impact: tuple[JobImpact, ...]
    costed: bool


class CostedIncident(Protocol):
    @property
    def severity(self) -> str: ...
    @property
    def first_seen(self) -> float: ...
    @property
    def resolved_at(self) -> float | None: ...


class OpenIncidents(Protocol):
    def get_open(self, alertname: str, component: Component) -> CostedIncident | None: ...
    def all_by_component(self) -> Iterable[tuple[Component, CostedIncident]]: ...

# the part of a step a component's fault slows: compute (the GPU, the host) or the collectives (the rest)
COMPUTE_KINDS = frozenset({Kind.GPU, Kind.NODE})


def _phase(c: Component) -> str:
    return "compute" if c.kind in COMPUTE_KINDS else "comm"


class IncidentCost:
    """Attaches each finding's cost per job before the incident manager applies it: the jobs whose ranks
    use the finding's component (per the topology), their impact since the incident's ``first_seen``, and
    the ``hpc_job`` label, fixed when the incident first fires (the hurt job with most GPUs) so measured
    cost updates annotations, never the alert's identity."""

    def __init__(self, topology: Topology, settings: DetectionSettings | None = None,
                 interval_of: Callable[[str | None], float] | None = None, job_gpus: JobGpus | None = None) -> None:
        self.topology = topology
        self.job_gpus = job_gpus or JobGpus()
        self._exposed: dict[Component, dict[tuple[str, str], list[str]]] = {}  # -> (job, job_id) -> GPU ids
        self._exposed_version = -1
        # (GPU, job) -> its late compute (s) at each tick its finding fired: the median stands for the fault
        # while the incident is held open after the GPU recovered (the lateness then decays to nothing)
        self._excess: dict[tuple[Component, str], deque[float]] = {}
        self.settings = settings or DetectionSettings()
        self._interval_of = interval_of or (lambda _node: 1.0)
        self.steps = StepLog()
        self._index: dict[Component, set[str]] = {}  # component -> job keys whose ranks use it
        self._crossing: dict[str, set[str]] = {}  # leaf -> job keys whose traffic crosses its uplinks
        self._index_key: tuple[tuple[str, int], ...] = ()
        self._gpus: dict[str, int] = {}

    def record(self, job_key: str, job: str, job_id: str, step: int, end_ts: float, seconds: float,
               comm: float | None = None) -> None:
        self.steps.record(job_key, step, end_ts, seconds, job_id=job_id, comm=comm)
        js = self.steps.jobs[job_key]
        js.name = job

    def _rebuild(self, tracker: StragglerTracker) -> None:
        key = tuple((k, len(j.ranks)) for k, j in tracker.jobs.items())
        if key == self._index_key:
            return
        self._index_key = key
        index: dict[Component, set[str]] = {}
        topo = self.topology
        for jk, js in tracker.jobs.items():
            self._gpus[jk] = len(js.ranks)
            for info in js.ranks.values():
                # a node the topology lacks: only the node itself is known to be on the ranks' path
                comps = topo.path_of_gpu(info.node, info.gpu).values() if info.node in topo.nodes \
                    else (comp.node(info.node),)
                for c in comps:
                    index.setdefault(c, set()).add(jk)
        self._index = index
        # the uplinks a job's traffic crosses are on no rank's path: by leaf (uplink_paths.py)
        self._crossing = crossing_jobs(topo, {jk: [(i.node, i.gpu) for i in js.ranks.values()]
                                              for jk, js in tracker.jobs.items()})

    @staticmethod
    def _compute_excess(tracker: StragglerTracker, jk: str, c: Component) -> float | None:
        """A GPU's late compute in seconds (its ranks' lateness over their peers, smoothed, times the job's
        median step): what a slow GPU costs a synchronous step, whatever the fabric does meanwhile."""
        if c.kind is not Kind.GPU or not c.node:
            return None
        js = tracker.jobs.get(jk)
        try:
            gpu = int(c.id.rsplit("gpu", 1)[1])
        except (IndexError, ValueError):
            return None
        if js is None:
            return None
        late = [i.late_ewma for i in js.ranks.values() if i.node == c.node and i.gpu == gpu]
        return max(late) * js.step_median if late and js.step_median > 0 else None

    def _note_excess(self, tracker: StragglerTracker, jk: str, c: Component) -> None:
        x = self._compute_excess(tracker, jk, c)
        if x is None or x <= 0:
            return
        key = (c, jk)
        if key not in self._excess and len(self._excess) >= MAX_EXCESS_KEYS:
            self._excess.pop(next(iter(self._excess)))  # the oldest GPU incident's
        self._excess.setdefault(key, deque(maxlen=512)).append(x)

    def _excess_of(self, c: Component, jk: str) -> float | None:
        seen = self._excess.get((c, jk))
        return statistics.median(seen) if seen else None

    def _one_path(self, a: Component, b: Component) -> bool:
        """Whether ``a`` and ``b`` carry the same transfers: one link (its NIC), a link and its leaf, a
        link or leaf and its rail."""
        for x, y in ((a, b), (b, a)):
            if y.kind in (Kind.LINK, Kind.NIC):
                if x.kind in (Kind.LINK, Kind.NIC) and (x.node, x.device) == (y.node, y.device):
                    return True
                leaf = y.leaf or (self.topology.leaf_of_nic(y.node, y.device) or "")
                if x.kind is Kind.LEAF and leaf and leaf == x.id:
                    return True
            if x.kind is Kind.RAIL and y.kind in (Kind.LINK, Kind.NIC, Kind.LEAF) and y.rail is not None \
                    and y.rail == x.rail:
                return True
        return False

    def lead_s(self) -> float:
        """How long before an incident opens its effect may have begun: a counter finding needs evidence in
        ``persist_windows`` of ``of_windows`` windows (each at least the slowest node's poll interval)."""
        s = self.settings
        return s.of_windows * max(s.window_s, self._interval_of(None))

    @staticmethod
    def _used_as(component: Component) -> Component:
        if component.kind is Kind.NVLINK:
            return component.parent() or component  # its GPU's ranks
        if component.kind is Kind.CONFIG and component.node:
            # lossless-config drift hurts the ranks on its NIC (on the node, when all its rail NICs drift)
            return comp.nic(component.node, component.device) if component.device else comp.node(component.node)
        return component

    def jobs_using(self, component: Component) -> set[str]:
        if component.kind in (Kind.UPLINK, Kind.SPINE):
            return jobs_crossing(self.topology, self._crossing, component)
        return self._index.get(self._used_as(component), set())

    def _rebuild_exposed(self) -> None:
        jg = self.job_gpus
        if jg.version == self._exposed_version:
            return
        self._exposed_version = jg.version
        topo = self.topology
        index: dict[Component, dict[tuple[str, str], list[str]]] = {}
        for node in jg.held:
            spec = topo.nodes.get(node)
            for job, job_id, gpus in jg.on_node(node, spec.gpus if spec is not None else 8):
                for g in gpus:
                    comps = topo.path_of_gpu(node, g).values() if spec is not None else (comp.node(node),)
                    gid = f"{node}/gpu{g}"
                    for c in comps:
                        index.setdefault(c, {}).setdefault((job, job_id), []).append(gid)
        self._exposed = index

    def exposed(self, component: Component, measured: Iterable[JobImpact]) -> list[JobImpact]:
        """The jobs the schedulers put on ``component`` that ``measured`` does not already cost (by job id,
        else by name): listed ``exposed`` with their GPUs on it, cost unknown (no step times)."""
        self._rebuild_exposed()
        held = self._exposed.get(self._used_as(component), {})
        if not held:
            return []
        seen_ids = {i.job_id for i in measured if i.job_id}
        seen_names = {i.job for i in measured if not i.job_id}
        out = []
        for (job, job_id), gpus in sorted(held.items()):
            if (job_id and job_id in seen_ids) or (not job_id and job in seen_names) or \
                    (job_id and job in seen_names):
                continue
            out.append(JobImpact(job, job_id, None, False, 0.0, exposed=True, gpus=tuple(sorted(set(gpus)))))
        return out

    def annotate(self, findings: Iterable[CostedFinding], manager: OpenIncidents, now: float,
                 tracker: StragglerTracker) -> None:
        self._rebuild(tracker)
        # every incident of the last hour, open or not, with the jobs it touches: a baseline step is clean
        # only when none of them was open on the job
        lead = self.lead_s()
        recent = [(c, o, self.jobs_using(c)) for c, o in manager.all_by_component()
                  if o.severity != "info" and (o.resolved_at is None or now - o.resolved_at < 3600.0)]
        for f in findings:
            if not (f.fire or f.keep) or f.severity == "info":
                continue
            # the jobs on the component now, none included: a job that left (its epilog, its steps ended
            # for good) leaves the open incident's impact; a rate (GPU-hours/hour) of GPUs it no longer holds
            # would be counted twice once the next job takes them
            f.costed = True
            inc = manager.get_open(f.alertname, f.component)
            named = {j for j in f.jobs if j in self.steps.jobs}
            if f.labels.get("job_id"):  # a heartbeat finding names the job; its identity is name and id
                named |= {k for j in f.jobs if (k := f"{j}\x00{f.labels['job_id']}") in self.steps.jobs}
            jobs = self.jobs_using(f.component) | named
            if not jobs:
                f.impact = tuple(self.exposed(f.component, ()))
                if inc is None and "hpc_job" not in f.labels and f.impact:
                    most = max(f.impact, key=lambda i: (len(i.gpus), i.job))
                    f.labels["hpc_job"] = most.job
                    if most.job_id:
                        f.labels["job_id"] = most.job_id
                continue
            first = inc.first_seen if inc is not None else now
            # another incident's effect began before it opened (its detection lead): its span starts there
            co = [(o, c) for c, o, used in recent if o is not inc and used & jobs]
            others = [(o.first_seen - lead, o.resolved_at if o.resolved_at is not None else now) for o, _c in co]
            adds = [_phase(c) != _phase(f.component) for _o, c in co]
            impacts = []
            for jk in jobs:
                js = self.steps.jobs.get(jk)
                if js is None:
                    continue
                if f.fire:
                    self._note_excess(tracker, jk, f.component)
                js.gpus = max(js.gpus, self._gpus.get(jk, 0))  # every rank is a GPU
                # a hang stops the job it names from the moment it fires; a job merely on the hung GPU's
                # path waits for it too (it is one of its ranks)
                imp = self.steps.impact(jk, first, now, others, baseline_end=first - lead,
                                        skip_steps=2 * self.settings.straggler_window,
                                        stopped=f.alertname == HUNG_ALERT and jk in named, other_adds=adds,
                                        direct_s=self._excess_of(f.component, jk),
                                        others_direct_s=[self._excess_of(c, jk) for _o, c in co],
                                        others_nested=[self._one_path(f.component, c) for _o, c in co])
                if imp is not None:
                    impacts.append(JobImpact(js.name, js.job_id, imp.step_slowdown, imp.stopped,
                                             imp.gpu_hours_per_hour))
            impacts.sort(key=lambda i: -i.gpu_hours_per_hour)
            f.impact = tuple(impacts + self.exposed(f.component, impacts))
            if inc is None and "hpc_job" not in f.labels and impacts:
                top = max(jobs, key=lambda jk: (self._gpus.get(jk, 0), jk))
                js = self.steps.jobs.get(top)
                if js is not None:
                    f.labels["hpc_job"] = js.name
                    if js.job_id:  # its identity too, fixed with the name (two jobs may share one)
                        f.labels["job_id"] = js.job_id
