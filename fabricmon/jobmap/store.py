"""The node's job directory: one ``<job_id>.json`` per job the scheduler put here (written atomically by
the prolog, removed by the epilog) and read by the agent's ``jobs`` source every poll.  A file, not a
message to the agent: a prolog never waits on the agent, and an agent that restarts finds every job."""

from __future__ import annotations

import os
from pathlib import Path

from ..atomic import atomic_write_text
from .assignment import AssignmentError, JobAssignment, check_job_id, parse_assignment

DEFAULT_DIR = "/run/fabricmon/jobs"
MAX_FILES = 4096
MAX_FILE_BYTES = 8192


def write(directory: str | Path, a: JobAssignment) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = d / f"{check_job_id(a.job_id, 'job_id')}.json"
    atomic_write_text(path, a.to_json() + "\n")
    os.chmod(path, 0o644)  # the agent may run as its own user; the prolog runs as root
    return path


def remove(directory: str | Path, job_id: str) -> bool:
    try:
        (Path(directory) / f"{check_job_id(job_id, 'job_id')}.json").unlink()
        return True
    except FileNotFoundError:
        return False


def read_all(directory: str | Path) -> tuple[list[JobAssignment], list[str]]:
    """Every job file (sorted by name) and one message per file that could not be read."""
    d = Path(directory)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return [], []  # no job ever ran here since boot
    except OSError as exc:
        return [], [f"{d}: {exc.strerror or exc}"]
    out: list[JobAssignment] = []
    bad: list[str] = []
    if len(names) > MAX_FILES:
        bad.append(f"{d}: {len(names)} job files, only the first {MAX_FILES} read")
        names = names[:MAX_FILES]
    for n in names:
        p = d / n
        try:
            with open(p, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise AssignmentError(f"{p}: larger than {MAX_FILE_BYTES} bytes")
            out.append(parse_assignment(data.decode("utf-8", errors="replace"), str(p)))
        except FileNotFoundError:
            continue  # an epilog removed it between listing and reading
        except (OSError, AssignmentError) as exc:
            bad.append(str(exc) if isinstance(exc, AssignmentError) else f"{p}: {exc.strerror or exc}")
    return out, bad
