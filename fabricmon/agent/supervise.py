"""Watches the agent's long-lived threads and restarts one that died.

Each part (poller, stream, intake, exporter) is a name, an ``alive()`` check and,
where the part can be started again, a ``restart()``.  A dead part is logged and
restarted with exponential backoff (so a part that dies at once is not restarted
in a tight loop), counted per part; a part without ``restart`` is reported down
(log, ``fabricmon_agent_thread_up`` 0, /readyz 503) so the orchestrator replaces
the agent.  The checks run in the ``fabricmon agent`` main thread, which cannot
die without ending the process, or in a daemon thread for an in-process agent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("fabricmon.supervise")


@dataclass
class Part:
    name: str
    alive: Callable[[], bool]
    restart: Callable[[], None] | None = None
    restarts_total: int = 0
    failures: int = 0  # consecutive deaths without a check that found it alive
    next_try: float = 0.0
    up: bool = True


class Supervisor:
    def __init__(self, backoff_min: float = 0.5, backoff_max: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.parts: dict[str, Part] = {}
        self._backoff_min = backoff_min
        self._backoff_max = backoff_max
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._halted = threading.Event()
        self._running = 0
        self._after_check: list[Callable[[], None]] = []

    def add(self, name: str, alive: Callable[[], bool], restart: Callable[[], None] | None = None) -> None:
        with self._lock:
            self.parts[name] = Part(name, alive, restart)

    def after_check(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after each pass of ``run`` (the exporter re-renders the thread metrics)."""
        with self._lock:
            self._after_check.append(fn)

    def _alive(self, p: Part) -> bool:
        try:
            return bool(p.alive())
        except Exception as exc:
            log.error("supervise_check_failed", thread=p.name, error=f"{type(exc).__name__}: {exc}")
            return False

    def check(self) -> None:
        """One pass: restart (or report) every dead part whose backoff has passed."""
        now = self._clock()
        with self._lock:
            parts = list(self.parts.values())
        for p in parts:
            if self._halted.is_set():
                return  # the agent is stopping its parts: none is restarted now
            if self._alive(p):
                p.up = True
                p.failures = 0
                continue
            p.up = False
            if now < p.next_try:
                continue
            p.failures += 1
            p.next_try = now + min(self._backoff_max, self._backoff_min * 2 ** min(p.failures - 1, 16))
            if p.restart is None:
                log.error("thread_died", thread=p.name, action="none: reported down (no restart possible)")
                continue
            log.error("thread_died", thread=p.name, action="restarting", restarts_total=p.restarts_total + 1,
                      next_retry_seconds=round(p.next_try - now, 2))
            p.restarts_total += 1
            try:
                p.restart()
            except Exception as exc:
                log.error("thread_restart_failed", thread=p.name, error=f"{type(exc).__name__}: {exc}")
                continue
            p.up = self._alive(p)

    def run(self, stop: threading.Event, every: float = 0.5) -> None:
        """Check every ``every`` seconds until ``stop``; nothing a check raises ends the loop."""
        with self._lock:
            self._running += 1
        try:
            while not stop.wait(every) and not self._halted.is_set():
                try:
                    self.check()
                except Exception as exc:
                    log.error("supervise_failed", error=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    hooks = list(self._after_check)
                for hook in hooks:
                    try:
                        hook()
                    except Exception as exc:
                        log.error("supervise_hook_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._running -= 1

    def running(self) -> bool:
        with self._lock:
            return self._running > 0

    def halt(self, timeout: float = 5.0) -> None:
        """Stop restarting parts (before they are stopped on purpose); joins our own thread."""
        self._halted.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def start(self, stop: threading.Event, every: float = 0.5) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self.run, args=(stop, every), name="fabricmon-supervise",
                                            daemon=True)
            self._thread.start()

    def down(self) -> list[str]:
        """Names of the parts found dead at the last check (or dead now)."""
        with self._lock:
            parts = list(self.parts.values())
        return [p.name for p in parts if not p.up or not self._alive(p)]

    def stats(self) -> dict[str, tuple[int, int]]:
        """name -> (up 0/1, restarts_total)."""
        with self._lock:
            parts = list(self.parts.values())
        return {p.name: (int(p.up and self._alive(p)), p.restarts_total) for p in parts}
