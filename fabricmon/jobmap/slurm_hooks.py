"""``fabricmon slurm-prolog`` and ``fabricmon slurm-epilog``: slurmd's ``Prolog=`` and ``Epilog=``.

    # slurm.conf (every compute node): slurmd runs them as root on each node of the job, without
    # arguments, so each is a program of its own (console scripts of the package, install.sh's venv)
    Prolog=/opt/fabricmon/bin/fabricmon-slurm-prolog
    Epilog=/opt/fabricmon/bin/fabricmon-slurm-epilog

or ``fabricmon slurm-prolog`` / ``fabricmon slurm-epilog`` from a site's own prolog script.

The prolog writes the job's file (job name, id, GPUs, node list) into the agent's job directory
(``--dir``, default ``/run/fabricmon/jobs``); the epilog removes it.  Neither ever fails a job for
fabricmon's sake: a problem is one line on stderr (slurmd logs it) and exit 0, unless ``--strict``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Mapping

from . import store
from .assignment import AssignmentError, check_job_id, from_slurm_env


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=os.environ.get("FABRICMON_JOBS_DIR", store.DEFAULT_DIR),
                   help=f"the agent's job directory (default $FABRICMON_JOBS_DIR or {store.DEFAULT_DIR})")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on a problem (slurmd then drains the node: only for testing)")


SCONTROL_TIMEOUT = 3.0


def scontrol_job_name(job_id: str) -> str:
    """The job's name from ``scontrol show job -o`` (``JobName=...``), "" when it cannot say in time."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"(?:^|\s)JobName=(.*?)(?=\s\w+=|$)", out)
    return m.group(1) if m else ""


def prolog(directory: str, env: Mapping[str, str]) -> str:
    a = from_slurm_env(env, scontrol_job_name)
    store.write(directory, a)
    gpus = "all GPUs" if a.gpus is None else "GPUs " + ",".join(map(str, a.gpus))
    return f"fabricmon: job {a.job_id} ({a.job}) holds {gpus}"


def epilog(directory: str, env: Mapping[str, str]) -> str:
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        raise AssignmentError("SLURM_JOB_ID: not set (run as slurmd's Epilog=)")
    gone = store.remove(directory, check_job_id(job_id, "SLURM_JOB_ID"))
    return f"fabricmon: job {job_id} released" + ("" if gone else " (no file: prolog did not run here)")


def run(which: str, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        line = (prolog if which == "prolog" else epilog)(args.dir, env)
    except (AssignmentError, OSError) as exc:
        why = str(exc) if isinstance(exc, AssignmentError) else f"{exc.filename or args.dir}: {exc.strerror or exc}"
        print(f"fabricmon slurm-{which}: error: {why}", file=sys.stderr)
        return 1 if args.strict else 0
    print(line, file=sys.stderr)
    return 0


def _main(which: str) -> int:
    p = argparse.ArgumentParser(prog=f"fabricmon-slurm-{which}", description=f"slurmd's {which.title()}= for fabricmon")
    add_arguments(p)
    return run(which, p.parse_args())


def prolog_main() -> int:
    return _main("prolog")


def epilog_main() -> int:
    return _main("epilog")
