"""One job's hold on a node's GPUs, as a value (pure: parsing and rendering, no I/O)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MAX_GPUS = 64  # GPU indexes on one node
MAX_TEXT = 256  # a job name, id or node list
_JOB_ID = re.compile(r"^[A-Za-z0-9._:@+-]{1,128}$")  # also a file name: no '/', no leading dot


class AssignmentError(ValueError):
    """A job file or a scheduler environment that cannot be read: the message names the field."""


@dataclass(frozen=True, slots=True)
class JobAssignment:
    job: str
    job_id: str
    gpus: tuple[int, ...] | None  # None: the whole node (the scheduler named no GPUs)
    nodes: str = ""  # the scheduler's node list (a hostlist expression), informational
    source: str = "slurm"  # slurm | kubernetes

    def to_json(self) -> str:
        return json.dumps({"job": self.job, "job_id": self.job_id,
                           "gpus": None if self.gpus is None else list(self.gpus),
                           "nodes": self.nodes, "source": self.source}, separators=(",", ":"))


def check_job_id(job_id: str, where: str) -> str:
    if not _JOB_ID.match(job_id) or job_id.startswith("."):
        raise AssignmentError(f"{where}: job id {job_id!r}: need 1-128 of A-Z a-z 0-9 . _ : @ + -")
    return job_id


def parse_gpu_list(text: str, where: str) -> tuple[int, ...] | None:
    """``0,1,2,3`` (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES) into indexes; ``""`` is None (no list).
    GPU UUIDs (``GPU-...``, which CUDA_VISIBLE_DEVICES may hold) are not indexes: an error naming them."""
    text = text.strip()
    if not text:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= MAX_GPUS:
            raise AssignmentError(f"{where}: {part!r} is not a GPU index (0..{MAX_GPUS - 1})")
        out.append(int(part))
    return tuple(sorted(set(out)))


def from_slurm_env(env: Mapping[str, str], name_of: Callable[[str], str] | None = None) -> JobAssignment:
    """What slurmd hands its Prolog and Epilog (https://slurm.schedmd.com/prolog_epilog.html):
    ``SLURM_JOB_ID``, ``SLURM_JOB_NAME``, ``SLURM_JOB_GPUS`` (the GPU indexes of a GRES allocation; else
    ``CUDA_VISIBLE_DEVICES``), ``SLURM_JOB_NODELIST`` (``SLURM_NODELIST``).  Slurm 22.05's slurmd gives
    its Prolog neither the job name nor SLURM_JOB_NODELIST (seen under a real slurmd, tests/integration):
    ``name_of(job_id)`` asks for the name then (``scontrol``), else the job is named by its id.  No GPU
    list: the job holds the whole node (the usual allocation of a training job), stated as ``gpus: None``."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        raise AssignmentError("SLURM_JOB_ID: not set (run as slurmd's Prolog= or Epilog=)")
    check_job_id(job_id, "SLURM_JOB_ID")
    name = env.get("SLURM_JOB_NAME", "").strip()
    if not name and name_of is not None:
        name = name_of(job_id).strip()
    name = name[:MAX_TEXT] or job_id
    gpus_env = "SLURM_JOB_GPUS" if env.get("SLURM_JOB_GPUS", "").strip() else "CUDA_VISIBLE_DEVICES"
    gpus = parse_gpu_list(env.get(gpus_env, ""), gpus_env)
    nodes = (env.get("SLURM_JOB_NODELIST", "").strip() or env.get("SLURM_NODELIST", "").strip())[:MAX_TEXT]
    return JobAssignment(name, job_id, gpus, nodes, "slurm")


def parse_assignment(text: str, where: str) -> JobAssignment:
    """A job file as ``store`` writes it; every problem names the file and field."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssignmentError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict):
        raise AssignmentError(f"{where}: not a JSON object")
    job, job_id = obj.get("job"), obj.get("job_id")
    if not isinstance(job, str) or not job or len(job) > MAX_TEXT:
        raise AssignmentError(f"{where}: job: need a name of 1..{MAX_TEXT} characters")
    if not isinstance(job_id, str):
        raise AssignmentError(f"{where}: job_id: need a string")
    check_job_id(job_id, f"{where}: job_id")
    gpus = obj.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or not all(isinstance(g, int) and 0 <= g < MAX_GPUS for g in gpus):
            raise AssignmentError(f"{where}: gpus: need null or a list of GPU indexes 0..{MAX_GPUS - 1}")
        gpus = tuple(sorted(set(gpus)))
    nodes = obj.get("nodes", "")
    source = obj.get("source", "slurm")
    if not isinstance(nodes, str) or not isinstance(source, str):
        raise AssignmentError(f"{where}: nodes, source: need strings")
    return JobAssignment(job, job_id, gpus, nodes[:MAX_TEXT], source[:32])
