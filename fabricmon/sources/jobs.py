"""The "jobs" source: which job holds which GPUs of this node, for jobs that never report a step.

Read every poll from the Slurm prolog's job directory (``fabricmon.jobmap.store``) and, on Kubernetes, from
``pods``: the kubelet's PodResources (``fabricmon.jobmap.podresources``, read on its own thread; its GPU
UUIDs are mapped to indexes with the ``nvml`` source's, found by ``bind``).  Exported as
``fabricmon_job_gpu_info{hpc_job,job_id,gpu}``: 1 while held; a job that left stays at 0 for
``released_keep`` seconds, because the stream sends only gauges that changed and a series that vanishes
says nothing to the aggregator.  ``gpu="all"`` when the scheduler named no GPUs (a whole-node job).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import JobsConfig
from ..jobmap import store
from ..jobmap.assignment import JobAssignment
from ..model import SourceResult, reading
from .inventory import Inventory
from .registry import SourceContext, SourceSpec

if TYPE_CHECKING:
    from ..jobmap.podresources import PodJobs

Key = tuple[str, str, str]  # (job, job_id, gpu)


def assignment_keys(a: JobAssignment) -> list[Key]:
    gpus = ["all"] if a.gpus is None else [str(g) for g in a.gpus]
    return [(a.job, a.job_id, g) for g in gpus]


class JobsSource:
    name = "jobs"

    def __init__(self, config: JobsConfig, *, directory: str | None = None, clock: Callable[[], float] = time.monotonic,
                 pods: Callable[[], tuple[list[JobAssignment], list[str]]] | None = None) -> None:
        self.config = config
        self.directory = directory or config.dir
        self.timeout = config.timeout
        self.clock = clock
        self.pods = pods
        self._released: dict[Key, float] = {}  # key -> when it left
        self._held: set[Key] = set()

    def assignments(self) -> tuple[list[JobAssignment], list[str]]:
        out, bad = store.read_all(self.directory)
        if self.pods is not None:
            more, why = self.pods()
            out += more
            bad += why
        return out, bad

    def poll(self, inventory: Inventory) -> SourceResult:
        res = SourceResult(self.name)
        found, bad = self.assignments()
        for msg in bad:
            res.error(msg)
        now = self.clock()
        held = {k for a in found for k in assignment_keys(a)}
        for k in self._held - held:
            self._released[k] = now
        for k in held:
            self._released.pop(k, None)
        self._held = held
        keep = self.config.released_keep
        for k, at in list(self._released.items()):
            if now - at > keep:
                del self._released[k]
        for job, job_id, gpu in sorted(held):
            res.readings.append(reading("fabricmon_job_gpu_info", 1.0, hpc_job=job, job_id=job_id, gpu=gpu))
        for job, job_id, gpu in sorted(self._released):
            res.readings.append(reading("fabricmon_job_gpu_info", 0.0, hpc_job=job, job_id=job_id, gpu=gpu))
        pod_jobs = self._pod_jobs()
        if pod_jobs is not None:
            res.readings.extend(pod_jobs.readings())
        return res

    def bind(self, sources: list) -> None:
        """Start the PodResources reader with the ``nvml`` source's GPU UUIDs (none without NVML)."""
        pod_jobs = self._pod_jobs()
        if pod_jobs is not None:
            nvml = next((s for s in sources if callable(getattr(s, "gpu_uuids", None))), None)
            pod_jobs.uuids = nvml.gpu_uuids if nvml is not None else (lambda: {})
            if pod_jobs.cfg.enabled or pod_jobs.api_server:  # auto: only in a pod (no thread on bare metal)
                pod_jobs.start()

    def close(self) -> None:
        pod_jobs = self._pod_jobs()
        if pod_jobs is not None:
            pod_jobs.close()

    def _pod_jobs(self) -> PodJobs | None:
        """``pods`` when it is the kubelet reader (a test may pass a plain callable)."""
        if self.pods is None:
            return None
        from ..jobmap.podresources import PodJobs  # only where pods are read: never on a fixture or simulated node

        return self.pods if isinstance(self.pods, PodJobs) else None


def _build(config: JobsConfig, context: SourceContext) -> JobsSource | None:
    if context.sysfs_root != "/sys" and context.host_root == "/" and config.dir == JobsConfig.dir:
        return None  # a fixture or simulated node (as the host source): this machine's jobs are not its own
    # the prolog writes the host's /run: a containerized agent sees it under host_root
    directory = os.path.join(context.host_root, config.dir.lstrip("/")) if context.host_root != "/" else config.dir
    pods = None
    if config.kubernetes.enabled is not False:
        from ..jobmap.podresources import PodJobs

        pods = PodJobs(config.kubernetes, lambda: None)
    return JobsSource(config, directory=directory, pods=pods)


SOURCE: SourceSpec[JobsConfig] = SourceSpec("jobs", JobsConfig, _build)
