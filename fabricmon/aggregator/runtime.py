"""One aggregator runtime: engine + gRPC intake + HTTP API + Alertmanager sender + ticks.

The service, the end-to-end tests and the benchmarks all run this object, so
they exercise the same start order, tick hand-off and shutdown:

* ``start()``: HTTP (not ready yet), Alertmanager sender, gRPC intake, ready.
  A part that cannot start stops the ones already started and raises.
* ``tick(now=None)``: the engine ticks at ``now`` (default: the cluster clock,
  admission.py) and the incidents that changed go to the sender.  A tick that
  raises is logged and counted, never fatal: one bad tick must not stop alerting.
* ``run(stop_event)``: tick every ``tick_seconds`` of wall time until the event.
* ``stop()``: readiness off, gRPC (with grace), a last tick if the clock moved,
  Alertmanager flush, HTTP.  ``stop(grace=0, flush=0, final_tick=False)`` is a
  crash: nothing is flushed.

Any part may be left out (``grpc_listen=None``, ``http_listen=None``, no
``sender``): an in-memory simulation feeds ``engine.ingest`` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from .alertmanager import AlertmanagerClient
from .engine import Engine
from .http_api import HttpApi
from .incidents import Incident
from .server import GrpcServer, start_grpc_server
from .tick_gate import TickGate

if TYPE_CHECKING:
    from ..buildinfo import ReloadStatus
    from ..webconfig import WebConfig

log = structlog.get_logger("fabricmon.aggregator")


class Background(Protocol):
    """A helper that runs beside the ticks in its own thread (remote_evidence.AlertmanagerEvidence)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class AggregatorRuntime:
    def __init__(self, engine: Engine, *, grpc_listen: str | None = None,
                 grpc_kwargs: dict[str, Any] | None = None,
                 http_listen: tuple[str, int] | None = None, sender: AlertmanagerClient | None = None,
                 tick_seconds: float = 0.25,
                 on_changed: Callable[[list[Incident], float], None] | None = None,
                 http_web: WebConfig | None = None, reload_status: ReloadStatus | None = None,
                 background: tuple[Background, ...] = ()) -> None:
        """``background``: helpers with ``start()``/``stop()`` that run beside the ticks (the cross-shard
        evidence poller), started after the sender and stopped with it."""
        self.engine = engine
        self.background = tuple(background)
        self.sender = sender
        self.tick_seconds = tick_seconds
        self.on_changed = on_changed
        self._grpc_listen = grpc_listen
        self._grpc_kwargs = dict(grpc_kwargs or {})
        self._ready = threading.Event()
        self.grpc: GrpcServer | None = None
        self.http: HttpApi | None = None
        if http_listen is not None:
            self.http = HttpApi(engine, http_listen, sender, ready=self._ready.is_set, grpc_stats=self.stats,
                                web=http_web, reload_status=reload_status)
        self.last_tick: float | None = None
        self.tick_errors_total = 0
        self.gate = TickGate(engine)  # skips a periodic tick that would read what the last one read
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def grpc_address(self) -> str:
        return self.grpc.address if self.grpc is not None else ""

    @property
    def http_port(self) -> int:
        return self.http.port if self.http is not None else 0

    def grpc_stats(self) -> dict[str, int]:
        return self.grpc.stats() if self.grpc is not None else {}

    def start(self) -> AggregatorRuntime:
        if self.http is not None:
            self.http.start()
        if self.sender is not None:
            self.sender.start()
        for b in self.background:
            b.start()
        if self._grpc_listen is not None:
            try:
                self.grpc = start_grpc_server(self.engine, self._grpc_listen, **self._grpc_kwargs)
            except Exception:
                self._stop_parts(flush=0.5)
                raise
        self._ready.set()
        return self

    def stop(self, grace: float = 5.0, flush: float = 2.0, final_tick: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._ready.clear()
        if self.grpc is not None:
            try:
                self.grpc.stop(grace)
            except Exception:  # keep shutting the rest down
                log.exception("grpc_stop_failed")
        if final_tick and self.last_tick is not None:
            now = self.engine.newest_ts
            if now > self.last_tick:
                self.tick(now)
        self._stop_parts(flush)

    def _stop_parts(self, flush: float) -> None:
        for b in self.background:
            b.stop()
        if self.sender is not None:
            self.sender.stop(flush_timeout=flush)
        if self.http is not None:
            self.http.stop()

    # ------------------------------------------------------------------ ticks
    def tick(self, now: float | None = None) -> list[Incident]:
        """Tick at ``now`` (default the cluster clock); hand what changed to the sender."""
        key = None
        if now is None:
            now = self.engine.newest_ts
            if not now:
                return []  # sample clock with no batch yet
            if self.gate.skip(now):
                return []  # nothing it reads changed since the last tick (tick_gate.py)
            key = self.gate.before(now)
        try:
            changed = self.engine.tick(now)
        except Exception:  # one bad tick must not stop alerting
            self.gate.ran(None)
            self.tick_errors_total += 1
            log.exception("tick_failed")
            return []
        self.gate.ran(key)
        self.last_tick = now
        if changed:
            if self.on_changed is not None:  # before the hand-off: delivery latencies start here
                try:
                    self.on_changed(changed, now)
                except Exception:  # persisting or recording a change must not keep its alert from going out
                    self.tick_errors_total += 1
                    log.exception("on_changed_failed")
            if self.sender is not None:
                self.sender.submit(changed, now)
        return changed

    def hand_over(self, changed: list[Incident], now: float | None = None) -> None:
        """Incidents changed outside a tick (a reload resolved them) go where a tick's would."""
        if not changed:
            return
        now = now if now is not None else (self.engine.newest_ts or self.last_tick or 0.0)
        if self.on_changed is not None:
            self.on_changed(changed, now)
        if self.sender is not None:
            self.sender.submit(changed, now)
        for inc in changed:
            log.info("incident", alertname=inc.alertname, component=inc.component,
                     state="open" if inc.open else "resolved", severity=inc.severity,
                     reason=inc.resolved_reason or None)

    def run(self, stop_event: threading.Event, log_incidents: bool = True,
            between: Callable[[], None] | None = None) -> None:
        """``between``: called before each tick in this thread."""
        while not stop_event.wait(self.tick_seconds):
            if between is not None:
                try:
                    between()
                except Exception:  # a failed reload must not stop the ticks
                    log.exception("between_ticks_failed")
            for inc in self.tick():
                if log_incidents:
                    log.info("incident", alertname=inc.alertname, component=inc.component,
                             state="open" if inc.open else "resolved", severity=inc.severity)

    def stats(self) -> dict[str, Any]:
        hook_stats = getattr(self.on_changed, "stats", None)  # incident_store.StateSaver's save counts
        return {**self.grpc_stats(), **(hook_stats() if callable(hook_stats) else {}),
                "tick_errors_total": self.tick_errors_total, "ticks_skipped_total": self.gate.skipped_total}
