"""A real Slurm on localhost: ``munged``, ``slurmctld`` and ``slurmd`` (Debian ``slurm-wlm``, ``munge``) in a
temporary directory, on free ports, with the test's own ``slurm.conf``.

What works in an unprivileged-cgroup sandbox (a container without systemd or a writable cgroup tree):
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, no accounting, ``SelectType=select/cons_tres``
(``select/linear`` allocates no GRES: the prolog then sees no ``SLURM_JOB_GPUS``), and the GPUs as GRES whose
``File=`` are symlinks to ``/dev/null`` (slurmd wants character devices; nothing opens them).  slurmd runs
under the topology's node name (``-N``) with ``NodeHostname`` the real host name.  Daemons run in the
foreground (``-D``) as children of the test and are stopped by pid.  ``extra_nodes`` are configured only (no
slurmd answers for them): enough for ``scontrol update`` to drain and resume them, as remediation does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from support.net import free_port
from support.waiting import wait_until

DAEMONS = ("munged", "slurmctld", "slurmd")


def require_slurm() -> None:
    missing = [b for b in (*DAEMONS, "sbatch", "scontrol", "sinfo") if shutil.which(b) is None
               and not Path("/usr/sbin", b).exists()]
    if missing:
        pytest.skip(f"needs Debian slurm-wlm and munge (missing {', '.join(missing)})")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs the prolog as SlurmdUser; a test Slurm runs as root")


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Slurm:
    def __init__(self, root: Path, node: str, *, prolog: Path | None = None, epilog: Path | None = None,
                 gpus: int = 8, extra_nodes: tuple[str, ...] = ()) -> None:
        self.root, self.node = root, node
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[str, Path] = {}
        for d in ("state", "spool", "dev"):
            (root / d).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for i in range(gpus):
            (root / "dev" / f"nvidia{i}").symlink_to("/dev/null")
        self.conf = root / "slurm.conf"
        self._conf_args = (prolog, epilog, gpus, extra_nodes)
        self._write_conf()
        (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={root / 'dev'}/nvidia[0-{gpus - 1}]\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        """slurm.conf on two distinct ports free a moment ago (written again when one was taken meanwhile)."""
        root, node = self.root, self.node
        prolog, epilog, gpus, extra_nodes = self._conf_args
        host = socket.gethostname().split(".")[0]
        ctld_port = free_port()
        slurmd_port = next(p for p in iter(free_port, None) if p != ctld_port)
        self.conf.write_text("\n".join([
            "ClusterName=fmtest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
            f"AuthInfo=socket={root / 'munge.sock'}", "CredType=cred/munge",
            f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin", "ReturnToService=2", "MpiDefault=none",
            "GresTypes=gpu", *([f"Prolog={prolog}", "PrologFlags=Alloc"] if prolog else []),
            *([f"Epilog={epilog}"] if epilog else []),
            f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=1 Gres=gpu:{gpus} State=UNKNOWN",
            *(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=1 State=UNKNOWN" for n in extra_nodes),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))

    def _start(self, name: str, argv: list[str]) -> None:
        log = self.root / f"{name}.log"
        self.logs[name] = log
        self.procs.append(subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=self.env,
                                           cwd=self.root))

    def start(self) -> Slurm:
        r = self.root
        self._start("munged", [_bin("munged"), "-F", "--force", f"--socket={r / 'munge.sock'}",
                               f"--key-file={r / 'munge.key'}", f"--log-file={r / 'munged.file.log'}",
                               f"--pid-file={r / 'munged.pid'}", f"--seed-file={r / 'munged.seed'}"])
        assert wait_until(lambda: (r / "munge.sock").exists(), 20), self.text("munged")
        for attempt in range(3):  # a port free when picked may be taken before slurmctld binds it (a busy CI host)
            ctld = self._popen("slurmctld", [_bin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            slurmd = self._popen("slurmd", [_bin("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
            pair = (ctld, slurmd)
            if wait_until(lambda pair=pair: self.idle() or any(p.poll() is not None for p in pair), 30) \
                    and self.idle():
                return self
            if attempt == 2 or "Address already in use" not in self.text("slurmctld") + self.text("slurmd"):
                break
            for p in (slurmd, ctld):
                self._end(p)
                self.procs.remove(p)
            self._write_conf()
        raise AssertionError(self.text("slurmctld") + self.text("slurmd"))

    def _popen(self, name: str, argv: list[str]) -> subprocess.Popen:
        self._start(name, argv)
        return self.procs[-1]

    @staticmethod
    def _end(p: subprocess.Popen) -> None:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def run(self, *argv: str, timeout: float = 20.0) -> str:
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        assert out.returncode == 0, (argv, out.stdout, out.stderr)
        return out.stdout

    def idle(self) -> bool:
        try:
            return self.run("sinfo", "-h", "-n", self.node, "-o", "%t", timeout=5).strip() == "idle"
        except (AssertionError, subprocess.TimeoutExpired):
            return False

    def node_state(self, name: str) -> tuple[str, str]:
        """(long state, reason) as ``sinfo`` prints them (``drained``, ``idle``; the reason without its user)."""
        out = self.run("sinfo", "-h", "-N", "-n", name, "-o", "%T|%E", timeout=10).strip().splitlines()
        state, _, reason = out[0].partition("|") if out else ("", "", "")
        return state, "" if reason == "none" else reason

    def text(self, name: str) -> str:
        p = self.logs.get(name)
        return p.read_text(errors="replace")[-3000:] if p is not None and p.exists() else ""

    def stop(self) -> None:
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged: each by its own pid
            self._end(p)
        deadline = time.monotonic() + 5  # the prolog's and jobs' children of a stopped slurmd
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)
