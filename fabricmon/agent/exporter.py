"""Prometheus exposition of the latest Snapshot, and the agent's HTTP endpoints.

``SnapshotCollector.collect()`` only serializes what the poller already
froze; a device that vanished simply has no samples in the new snapshot, so no
stale series linger.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..metrics import SELF_SPECS, SPECS, MetricSpec
from ..model import Snapshot

ALL_SPECS = {**SPECS, **SELF_SPECS}


def _family(spec: MetricSpec, labels: list[str]) -> Metric:
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


class SnapshotCollector:
    """A prometheus_client custom collector over ``get_snapshot()``."""

    def __init__(self, get_snapshot: Callable[[], Snapshot | None], clock: Callable[[], float] = time.time) -> None:
        self._get = get_snapshot
        self._clock = clock

    def describe(self) -> list:
        return []  # registering must not call collect()

    def collect(self) -> Iterator[Metric]:
        snap = self._get()
        if snap is None:
            return
        node = snap.node
        by_family: dict[str, list] = defaultdict(list)
        for s in snap.samples:
            by_family[s.family].append(s)
        for name, samples in by_family.items():
            spec = ALL_SPECS.get(name)
            if spec is None:
                continue  # a reading without a spec is a programming error caught by tests
            fam = _family(spec, ["node", *spec.labels])
            for s in samples:
                fam.add_metric([node, *(v for _, v in s.labels)], s.value)
            yield fam
        up = _family(SELF_SPECS["fabricmon_collector_up"], ["node", "collector"])
        dur = _family(SELF_SPECS["fabricmon_collector_duration_seconds"], ["node", "collector"])
        err = _family(SELF_SPECS["fabricmon_collector_errors_total"], ["node", "collector"])
        for st in snap.sources:
            if not st.present:
                continue  # absent hardware (no GPU) is not a failing collector
            up.add_metric([node, st.source], 1.0 if st.up else 0.0)
            dur.add_metric([node, st.source], st.duration_seconds)
            err.add_metric([node, st.source], float(st.errors_total))
        yield up
        yield dur
        yield err
        ts = _family(SELF_SPECS["fabricmon_snapshot_timestamp_seconds"], ["node"])
        ts.add_metric([node], snap.ts)
        yield ts
        age = _family(SELF_SPECS["fabricmon_snapshot_age_seconds"], ["node"])
        age.add_metric([node], max(0.0, self._clock() - snap.ts))
        yield age


def make_registry(get_snapshot: Callable[[], Snapshot | None], clock: Callable[[], float] = time.time) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot, clock))
    return registry


def exposition(snapshot: Snapshot) -> bytes:
    """The classic text exposition of one snapshot (what ``--once`` prints)."""
    return generate_latest(make_registry(lambda: snapshot))


class AgentHTTPServer:
    """/metrics, /healthz (liveness: never touches NVML) and /readyz (a fresh snapshot exists)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        registry_ref = registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body = generate_latest(registry_ref)
                    self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/healthz":
                    ok = alive()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"poller stopped\n")
                elif path == "/readyz":
                    ok = ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else b"no fresh snapshot\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass  # scrapes every second would flood the log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
