"""Which job holds which GPUs, from the schedulers (the agents' ``fabricmon_job_gpu_info``): every job on a
faulty component is listed in the incident's impact, measured or not (DESIGN "Jobs, decoys and cost").

A job that reports steps is costed from them (cost.py); one that does not is listed ``exposed: true``
with its GPUs on the component, so a fabric fault under an uninstrumented job is never ``impact: []``.
Bounded: at most ``MAX_PER_NODE`` (job, GPU) pairs per node, the rest counted in ``refused``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL = "all"  # the scheduler named no GPUs: the whole node
MAX_PER_NODE = 256


@dataclass
class JobGpus:
    # node -> (job, job_id) -> GPU labels ("0".."63", or "all")
    held: dict[str, dict[tuple[str, str], set[str]]] = field(default_factory=dict)
    version: int = 0  # bumped on every change: the cost index is rebuilt only then
    refused: int = 0

    def set(self, node: str, job: str, job_id: str, gpu: str, on: bool) -> None:
        jobs = self.held.setdefault(node, {})
        key = (job, job_id)
        gpus = jobs.get(key)
        if on:
            if gpus is not None and gpu in gpus:
                return
            if sum(len(g) for g in jobs.values()) >= MAX_PER_NODE:
                self.refused += 1
                return
            jobs.setdefault(key, set()).add(gpu)
        else:
            if gpus is None or gpu not in gpus:
                return
            gpus.discard(gpu)
            if not gpus:
                del jobs[key]
        self.version += 1

    def on_node(self, node: str, gpus_per_node: int) -> list[tuple[str, str, tuple[int, ...]]]:
        """(job, job_id, GPU indexes) of the jobs the schedulers put on ``node``."""
        out = []
        for (job, job_id), gpus in sorted(self.held.get(node, {}).items()):
            idx = range(gpus_per_node) if ALL in gpus else sorted(int(g) for g in gpus if g.isdigit())
            out.append((job, job_id, tuple(idx)))
        return out
