"""What each injected fault costs each job, standalone (DESIGN "Jobs, decoys and cost": the report's truth).

For every fault the jobs are simulated twice: with only that fault, and with no fault, decoys on in
both and the same draws (a job's draws are keyed by step, sim/job.py).  A job's ``step_slowdown`` is
the median time of its steps that start inside the fault's window in the faulted run over the median
of the steps that start inside the same window in the clean run, minus 1; jobs below 0.01 are left
out.  Only the job model runs (link state, rates and the jobs' steps), not the counters or the agents,
so a fault costs a few milliseconds per simulated second even at thousands of nodes.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from .cluster import ClusterState
from .job import JobSpec
from .jobs import JobSet
from .scenario import Fault, Scenario

MIN_SLOWDOWN = 0.01


def _step_starts(scn: Scenario, interval: float, spec: JobSpec) -> dict[str, list[tuple[float, float]]]:
    """job name -> [(simulated start, seconds)] of every completed step."""
    cluster = ClusterState(scn, epoch=0.0)
    jobs = JobSet(scn, cluster, spec)
    t = 0.0
    while t + interval <= scn.duration + 1e-9:
        t += interval
        jobs.advance_to(t, cluster.effects(t))
        cluster.faults.apply(t)  # as the runner's advance does after the job's step
    return {j.spec.name: [(end - s, s) for end, s in j.completed] for j in jobs.jobs}


def _median_in(steps: list[tuple[float, float]], lo: float, hi: float) -> float | None:
    inside = [s for start, s in steps if lo <= start < hi]
    return statistics.median(inside) if inside else None


def fault_impacts(scn: Scenario, interval: float = 1.0, spec: JobSpec | None = None) -> list[list[dict]]:
    """Per fault (scenario order): ``[{"job", "step_slowdown"}]`` for every job it slows by >= 1%."""
    spec = spec or JobSpec()
    clean = _step_starts(replace(scn, faults=()), interval, spec)
    out: list[list[dict]] = []
    for f in scn.faults:
        out.append(_one(scn, f, clean, interval, spec))
    return out


def _one(scn: Scenario, f: Fault, clean: dict, interval: float, spec: JobSpec) -> list[dict]:
    if f.kind == "counter_reset":
        return []
    hurt = _step_starts(replace(scn, faults=(f,)), interval, spec)
    end = f.end if f.end is not None else scn.duration
    rows = []
    for job, steps in hurt.items():
        base = _median_in(clean.get(job, []), f.start, end)
        slow = _median_in(steps, f.start, end)
        if base is None or slow is None or base <= 0:
            continue
        slowdown = slow / base - 1.0
        if slowdown >= MIN_SLOWDOWN:
            rows.append({"job": job, "step_slowdown": round(slowdown, 4)})
    return sorted(rows, key=lambda r: -r["step_slowdown"])
