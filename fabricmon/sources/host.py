"""Host source (psutil): CPU, load, memory and per-netdev traffic, drops and errors.

Host pressure explains stragglers that are not the fabric (a busy CPU, a host
swapping, periodic GC pauses), so the aggregator sees it next to the fabric.

Everything is read from ``host_root``/proc (``--host-root``, like node_exporter's
``--path.rootfs``): in a container the host's / is a hostPath mount, and the
container's own /proc would describe the container.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import structlog

from ..config import HostConfig
from ..model import ReadingMemo, Semantics, SourceResult, reading
from .inventory import Inventory
from .registry import SourceContext, SourceSpec

log = structlog.get_logger("fabricmon.agent")

EXCLUDED_INTERFACES = frozenset({"lo"})

# psutil reads its Linux /proc files from the module-global PROCFS_PATH at each call; the lock keeps
# two host sources with different roots in one process (tests, simulations) from crossing.
_PROCFS_LOCK = threading.Lock()


def _psutil() -> Any:
    """psutil, imported by the first host source built (never by an agent whose host source is off, nor
    by the stream's ``read_boot_time``)."""
    import psutil

    return psutil


@contextlib.contextmanager
def _procfs(path: str) -> Iterator[None]:
    psutil = _psutil()
    with _PROCFS_LOCK:
        before = psutil.PROCFS_PATH
        psutil.PROCFS_PATH = path
        try:
            yield
        finally:
            psutil.PROCFS_PATH = before


def _loadavg(procfs: str) -> float:
    """1-minute load from PROCFS/loadavg ("0.52 0.58 0.59 1/467 12345"); os.getloadavg reads
    only this process's /proc."""
    with open(os.path.join(procfs, "loadavg"), "rb") as fh:
        return float(fh.read(256).split()[0])


def read_boot_time(stat: str = "/proc/stat") -> float:
    """The node's boot time (``btime`` of /proc/stat, Unix seconds); 0.0 when it cannot be read."""
    try:
        with open(stat) as f:
            for line in f:
                if line.startswith("btime "):
                    value = float(line.split()[1])
                    # "nan", "inf" or a negative count is no boot time (the hello refuses it, the rules would hold
                    # the node for good)
                    return value if math.isfinite(value) and value > 0 else 0.0
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _busy_and_total(times: Any) -> tuple[float, float]:
    """CPU busy and total seconds, counted the way psutil.cpu_percent counts them.

    guest and guest_nice are already included in user and nice on Linux, and
    iowait is idle time (the CPU waits, it does not work).
    """
    total = sum(times)
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    busy = total - times.idle - getattr(times, "iowait", 0.0)
    return busy, total


class HostSource:
    """The "host" source.

    CPU utilization has ``psutil.cpu_percent(interval=None)`` semantics (share
    busy since the previous poll; the first poll only primes), but keeps its own
    baseline from ``cpu_times()``: cpu_percent's baseline is module-global, so
    any other caller in the process would silently shorten our interval.
    """

    name = "host"

    def __init__(
        self,
        config: HostConfig | None = None,
        *,
        timeout: float | None = None,
        cpu_times: Callable[[], Any] | None = None,  # psutil.cpu_times
        host_root: str = "/",
    ) -> None:
        # An explicit timeout wins over the section's.
        if timeout is None:
            timeout = (config or HostConfig()).timeout
        self.timeout = timeout
        self.procfs = os.path.join(host_root, "proc")
        self._psutil = _psutil()
        self._cpu_times = cpu_times or self._psutil.cpu_times
        self._last_cpu: tuple[float, float] | None = None
        self._memo = ReadingMemo()  # same Reading object while a value does not change
        self._nic_labels: dict[str, tuple] = {}
        self._boot_time = 0.0

    def poll(self, inventory: Inventory) -> SourceResult:
        with _procfs(self.procfs):
            return self._poll()

    def _poll(self) -> SourceResult:
        res = SourceResult(self.name)
        # Each part on its own: one failing psutil call costs only its series.
        try:
            busy, total = _busy_and_total(self._cpu_times())
            last = self._last_cpu
            if last is None:
                self._last_cpu = (busy, total)  # priming poll: no interval to measure yet
            elif total - last[1] > 0:
                ratio = min(max((busy - last[0]) / (total - last[1]), 0.0), 1.0)
                res.readings.append(reading("fabricmon_host_cpu_utilization_ratio", ratio))
                self._last_cpu = (busy, total)
            # else: polled again within one clock tick; keep the baseline and
            # measure over the longer interval next time rather than report 0.
        except (OSError, AttributeError, ValueError, TypeError) as exc:
            res.error(f"host: cpu_times: {exc}")
        try:
            res.readings.append(reading("fabricmon_host_load1", _loadavg(self.procfs)))
        except (OSError, ValueError, IndexError) as exc:
            res.error(f"host: loadavg: {exc}")
        if not self._boot_time:  # fixed until the host reboots, which restarts the agent: read until known
            self._boot_time = read_boot_time(os.path.join(self.procfs, "stat"))
        boot = self._boot_time
        if boot > 0:
            # a gauge: the rules hold a just-booted node's link state, as the aggregator does
            res.readings.append(reading("fabricmon_host_boot_time_seconds", boot))
        else:
            res.error("host: stat: no btime")
        try:
            mem = self._psutil.virtual_memory()
            res.readings.append(reading("fabricmon_host_memory_total_bytes", float(mem.total)))
            res.readings.append(reading("fabricmon_host_memory_available_bytes", float(mem.available)))
        except (OSError, ValueError, KeyError) as exc:
            res.error(f"host: memory: {exc}")
        try:
            # nowrap=False: psutil's own wrap compensation is process-global and
            # would hide a driver reset; the counter tracker sees raw values.
            nics = self._psutil.net_io_counters(pernic=True, nowrap=False)
        except (OSError, ValueError) as exc:
            res.error(f"host: net_io_counters: {exc}")
            nics = {}
        mono = Semantics.MONOTONIC
        memo = self._memo
        memo.begin()
        mk = memo.get
        if len(self._nic_labels) > 1024:  # veths come and go: keep the cache bounded
            self._nic_labels.clear()
        for ifname in sorted(nics):
            if ifname in EXCLUDED_INTERFACES:
                continue
            c = nics[ifname]
            lab = self._nic_labels.get(ifname)
            if lab is None:
                i = ("interface", ifname)
                lab = self._nic_labels[ifname] = (
                    f"net/{ifname}", (i,), (i, ("direction", "rx")), (i, ("direction", "tx")))
            grp, li, rx, tx = lab
            res.readings += [
                mk("fabricmon_host_network_receive_bytes_total", li, c.bytes_recv, mono, 64, grp),
                mk("fabricmon_host_network_transmit_bytes_total", li, c.bytes_sent, mono, 64, grp),
                mk("fabricmon_host_network_drops_total", rx, c.dropin, mono, 64, grp),
                mk("fabricmon_host_network_drops_total", tx, c.dropout, mono, 64, grp),
                mk("fabricmon_host_network_errors_total", rx, c.errin, mono, 64, grp),
                mk("fabricmon_host_network_errors_total", tx, c.errout, mono, 64, grp),
            ]
        memo.commit()
        if res.errors and not res.readings:
            res.up = False  # nothing of the host readable (a wrong host_root): the whole source failed
        return res

    def close(self) -> None:
        pass  # nothing held open


def _build(config: HostConfig, context: SourceContext) -> HostSource | None:
    if context.sysfs_root == "/sys" or context.host_root != "/":
        return HostSource(config, host_root=context.host_root)
    # A fixture or simulated sysfs tree with this machine's /proc would mix two hosts.
    log.info("host_source_off", reason="sysfs_root is not /sys and host_root is /: "
             "set host_root (--host-root) to where the host's / is mounted", sysfs_root=context.sysfs_root)
    return None


SOURCE = SourceSpec("host", HostConfig, _build)
