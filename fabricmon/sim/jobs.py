"""Every training job of a scenario on the simulated cluster, with its decoys (sim/workload.py).

One ``SyntheticJob`` per job over its own nodes (its own pipeline stages and rail rings); nodes in no
job are idle (no rank lines, background traffic only).  ``job_restart`` stops a job for ``down``
seconds and brings it back at its last checkpoint's step, on new nodes when the decoy names them.
What each job completed (``step_times``) is the report's ground truth for cost.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..rank_timing import Heartbeat, JobLayout, RankTiming
from .cluster import ClusterState
from .fault_state import Effects
from .hw import NRAILS
from .job import JobSpec, SyntheticJob
from .scenario import Scenario
from .workload import ResolvedJob

HEARTBEAT_S = 5.0  # fabricmon.client's heartbeat period


def scaled(spec: JobSpec, k: float) -> JobSpec:
    """``spec`` with its step time x ``k`` (compute, NVLink, gradient bytes alike: slowdowns keep their ratios)."""
    if k == 1.0:
        return spec
    return replace(spec, compute_seconds=spec.compute_seconds * k, tp_seconds=spec.tp_seconds * k,
                   grad_bytes_per_rank=spec.grad_bytes_per_rank * k)


class JobSet:
    def __init__(self, scenario: Scenario, cluster: ClusterState, spec: JobSpec | None = None, *,
                 epoch: float = 0.0) -> None:
        spec = scaled(spec or JobSpec(), scenario.step_scale)
        self.cluster = cluster
        self.resolved: list[ResolvedJob] = scenario.resolved_jobs()
        seed = scenario.cluster.seed
        self.jobs: list[SyntheticJob] = []
        for rj in self.resolved:
            decoys = [d for d in scenario.decoys if d.job == rj.name
                      or (d.node is not None and d.node in rj.nodes and d.kind != "background_errors")]
            name = rj.name if scenario.jobs else spec.name
            hangs = [(f.start, f.end, f.the_node, f.the_gpu) for f in scenario.faults if f.kind == "rank_hang"]
            self.jobs.append(SyntheticJob(list(rj.nodes), replace(spec, name=name, pp=rj.pp), seed=seed,
                                          epoch=epoch, start=rj.start, index=[cluster.index[n] for n in rj.nodes],
                                          job_id=rj.job_id, decoys=decoys, end=rj.end, hangs=hangs))
        # (simulated time, job position, return time, new nodes or None), in time order
        self._restarts = sorted(
            (d.start, k, d.start + float(d.down or 0.0), d.nodes)
            for d in scenario.decoys if d.kind == "job_restart"
            for k, rj in enumerate(self.resolved) if rj.name == d.job)
        self._down_until = [0.0] * len(self.jobs)

    @property
    def layouts(self) -> tuple[JobLayout, ...]:
        return tuple(j.layout for j in self.jobs)

    def advance_to(self, t: float, eff: Effects) -> list[RankTiming]:
        out: list[RankTiming] = []
        while self._restarts and self._restarts[0][0] <= t:
            at, k, back, nodes = self._restarts.pop(0)
            job = self.jobs[k]
            out += job.advance_to(at, eff)  # steps that ended before every rank exited
            if nodes is not None:
                job.restart(back, list(nodes), [self.cluster.index[n] for n in nodes])
            else:
                job.restart(back)
            self._down_until[k] = back
        for job in self.jobs:
            out += job.advance_to(t, eff)
        return out

    def heartbeats(self, t_prev: float, t: float) -> list[Heartbeat]:
        """Heartbeats sent in (t_prev, t]: every HEARTBEAT_S, by every rank of each running job."""
        if int(t // HEARTBEAT_S) == int(t_prev // HEARTBEAT_S):
            return []
        out: list[Heartbeat] = []
        for j in self.running(t):
            out += j.heartbeats(t)
        return out

    def running(self, t: float) -> list[SyntheticJob]:
        return [j for k, j in enumerate(self.jobs)
                if t >= self._down_until[k] and j.t <= t + j.last_step_seconds and t < j.end]

    def rail_bytes_per_second(self, t: float) -> np.ndarray:
        """(cluster nodes, rails): what the running jobs offer each rail NIC; idle nodes their background."""
        out = self.cluster.counters.default_offered()[:, :NRAILS].copy()
        for j in self.running(t):
            out[j.index] = j.rail_bytes_per_second()
        return out

    def nvlink_activity(self, t: float) -> np.ndarray:
        out = np.zeros(self.cluster.n)
        for j in self.running(t):
            out[j.index] = j.nvlink_activity()
        return out

    def truth(self) -> list[dict]:
        """The report's ``jobs``: one entry per job with every completed step (none while it is down)."""
        out = []
        for rj, j in zip(self.resolved, self.jobs, strict=True):
            out.append({"name": j.spec.name, "job_id": rj.job_id, "gpus": len(rj.nodes) * 8, "nodes": list(j.names),
                        "step_times": [[round(t, 3), round(s, 6)] for t, s in j.completed]})
        return out
