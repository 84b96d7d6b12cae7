"""The infiniband-diags command lines of the sweep, and running one under a deadline.

Switches are addressed by the LID the map gave (never ``-G``, which costs an SA PathRecord query per
call); nothing here ever clears a counter (no ``-r``/``-R`` of perfquery, no ``-k``/``-K`` of
ibqueryerrors): other monitors read the same counters, and a counter someone else cleared is a reset
the counter tracker takes as such."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...config import IbSwitchesConfig

ALL_PORTS = "255"  # PortSelect 255: with -l, every port in turn; with -a, the AllPortSelect sum
LIBIBMAD_TRIES = 4  # MAD_DEF_RETRIES 3 (libibmad/mad.h) after the first send, each waiting -t ms
SPAWN_S = 2.0  # process start and the tool's own set-up, on a loaded host


@dataclass(frozen=True)
class ToolRun:
    rc: int | None  # None: killed at its deadline
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


Runner = Callable[[list[str], float], ToolRun]


def run_tool(argv: list[str], deadline_s: float) -> ToolRun:
    """Run one tool; past ``deadline_s`` its whole process group is killed (rc None)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        return ToolRun(127, "", f"{argv[0]}: {exc}", time.monotonic() - t0)
    try:
        out, err = proc.communicate(timeout=deadline_s)
        return ToolRun(proc.returncode, out, err, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return ToolRun(None, out or "", (err or "") + f"\nkilled after {deadline_s:.1f}s", time.monotonic() - t0)


class Commands:
    """The argv of each query, with the sweep's CA, port and MAD timeout."""

    def __init__(self, config: IbSwitchesConfig) -> None:
        self._common = []
        if config.ca:
            self._common += ["-C", config.ca]
        if config.ca_port is not None:
            self._common += ["-P", str(config.ca_port)]
        self._common += ["-t", str(config.timeout_ms)]
        self.deadline_s = LIBIBMAD_TRIES * config.timeout_ms / 1000.0 + SPAWN_S
        # the PortInfo walk is one query of thousands of SMPs: its one deadline is a health interval (a walk
        # that cannot finish within one is of no use to the sweep it belongs to)
        self.walk_deadline_s = max(self.deadline_s, config.health_interval)

    def discover(self, cache: str) -> list[str]:
        return ["ibnetdiscover", *self._common, "--cache", cache]

    def all_ports(self, lid: int) -> list[str]:
        return ["perfquery", *self._common, "-a", str(lid)]

    def ports_extended(self, lid: int) -> list[str]:
        return ["perfquery", *self._common, "-x", "-l", str(lid), ALL_PORTS]

    def ports(self, lid: int) -> list[str]:
        return ["perfquery", *self._common, "-l", str(lid), ALL_PORTS]

    def link_walk(self) -> list[str]:
        """Every switch port's PortInfo, read live by one discovery walk (``iblinkinfo`` without
        ``--load-cache``, which would print the cache's old states)."""
        return ["iblinkinfo", *self._common, "--switches-only", "--line"]

    def port_info(self, lid: int, port: int) -> list[str]:
        return ["smpquery", *self._common, "portinfo", str(lid), str(port)]
