"""``fabricmon_build_info``, the process_* metrics and the config reload status, served beside
every fabricmon /metrics.

The same two things node_exporter and dcgm-exporter expose (``*_build_info`` and the
client library's process collector), so one dashboard row and one ``count by (version)``
work for every exporter on the host.
"""

from __future__ import annotations

import functools
import platform
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import __version__


@functools.cache
def revision() -> str:
    """The source revision the installed package was built from (written by setup.py at build
    time; an editable or source-tree run has none: "unknown")."""
    try:
        from ._revision import REVISION  # type: ignore[import-not-found]
    except ImportError:
        return "unknown"
    return str(REVISION) or "unknown"


class BuildInfoCollector:
    def collect(self):
        g = GaugeMetricFamily("fabricmon_build_info", "A metric with a constant 1 labeled by the fabricmon version, "
                              "the source revision it was built from and the Python it runs on.",
                              labels=["version", "revision", "python_version", "python_implementation"])
        g.add_metric([__version__, revision(), platform.python_version(), platform.python_implementation()], 1.0)
        yield g


class ReloadStatus:
    """What SIGHUP did last, as Prometheus and Alertmanager export it (alert on ``== 0``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.successful = True
        self.success_ts = clock()  # the start counts as a successful load
        self.attempts = {"success": 0, "failure": 0}
        self.file_changes = 0  # secret files changed on disk, noticed by the file watch (filewatch.py)
        self.files_watched = 0

    def record(self, ok: bool) -> None:
        with self._lock:
            self.successful = ok
            self.attempts["success" if ok else "failure"] += 1
            if ok:
                self.success_ts = self._clock()

    def noticed(self, n: int) -> None:
        with self._lock:
            self.file_changes += n

    def watching(self, n: int) -> None:
        with self._lock:
            self.files_watched = n

    def collect(self):
        with self._lock:
            ok, ts, attempts = self.successful, self.success_ts, dict(self.attempts)
            changes, watched = self.file_changes, self.files_watched
        c = CounterMetricFamily("fabricmon_config_reloads", "Configuration reloads (SIGHUP) finished, by result; "
                                "reloads asked for while one ran are coalesced into the next.", labels=["result"])
        for result, n in attempts.items():
            c.add_metric([result], n)
        yield c
        g = GaugeMetricFamily("fabricmon_config_last_reload_successful",
                              "Whether the last configuration reload (SIGHUP) succeeded.")
        g.add_metric([], 1.0 if ok else 0.0)
        yield g
        g = GaugeMetricFamily("fabricmon_config_last_reload_success_timestamp_seconds",
                              "Time of the last successful configuration load.")
        g.add_metric([], ts)
        yield g
        c = CounterMetricFamily("fabricmon_secret_file_changes",
                                "Token and TLS files whose contents changed on disk, noticed without a SIGHUP; each "
                                "runs the reload a SIGHUP runs (its result in fabricmon_config_reloads_total).")
        c.add_metric([], changes)
        yield c
        g = GaugeMetricFamily("fabricmon_secret_files_watched",
                              "Token and TLS files watched for changes (0: a rotation needs a SIGHUP).")
        g.add_metric([], watched)
        yield g


def add_runtime_collectors(registry: CollectorRegistry, reload: ReloadStatus | None = None) -> CollectorRegistry:
    """Register build info and process metrics (CPU, RSS, open fds, start time) on ``registry``."""
    registry.register(BuildInfoCollector())
    if reload is not None:
        registry.register(reload)
    ProcessCollector(registry=registry)
    return registry


def runtime_exposition(reload: ReloadStatus | None = None) -> Callable[[], bytes]:
    """A callable rendering build info and process metrics now (a few hundred bytes)."""
    registry = add_runtime_collectors(CollectorRegistry(auto_describe=False), reload)
    return lambda: generate_latest(registry)
