"""Runs the actions off the tick thread: at most one job in flight per node, a failed action retried with
backoff (``retry_backoff_s``, doubled each time, ``retries`` times) and then reported ``failed``.

The tick submits jobs and, at its next turn, takes the finished ones (``finished``): the remediator applies
their results to its state and the incidents under the engine's lock, so nothing here touches either.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from .actions import Action, ActionError

log = structlog.get_logger("fabricmon.aggregator.remediation")


@dataclass(frozen=True, slots=True)
class Job:
    node: str
    undo: bool
    actions: tuple[str, ...]
    reason: str
    incident: dict[str, Any]
    at: float  # the decision's sample time


@dataclass(slots=True)
class Outcome:
    job: Job
    results: dict[str, str] = field(default_factory=dict)  # action -> done | foreign_drain | failed
    errors: dict[str, str] = field(default_factory=dict)  # action -> last error
    attempts: dict[str, int] = field(default_factory=dict)


class Executor:
    def __init__(self, actions: dict[str, Action], *, retries: int, backoff_s: float, workers: int = 4,
                 sleep: Callable[[float], bool] | None = None) -> None:
        self.actions = actions
        self.retries = retries
        self.backoff_s = backoff_s
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait  # True: stopping
        self._pool: ThreadPoolExecutor | None = None
        self._workers = workers
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.retries_total = 0

    def start(self) -> None:
        if self._pool is None:
            self._stop.clear()
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="remediation")

    def stop(self) -> None:
        self._stop.set()  # backoff waits end; an action already running finishes (bounded by its timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def in_flight(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._in_flight)

    def submit(self, job: Job) -> bool:
        """False when the node already has a job in flight (one at a time per node)."""
        with self._lock:
            if job.node in self._in_flight:
                return False
            self._in_flight.add(job.node)
        if self._pool is None:
            self.start()
        assert self._pool is not None
        self._pool.submit(self._run, job)
        return True

    def finished(self) -> list[Outcome]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def wait_idle(self, timeout: float) -> bool:
        """Tests and shutdown: True once nothing is in flight."""
        end = threading.Event()
        for _ in range(int(timeout / 0.05) + 1):
            if not self.in_flight():
                return True
            end.wait(0.05)
        return not self.in_flight()

    def _run(self, job: Job) -> None:
        out = Outcome(job)
        try:
            for name in job.actions:
                act = self.actions.get(name)
                if act is None:
                    out.results[name], out.errors[name] = "failed", "not configured"
                    continue
                self._one(act, job, out)
        except Exception as exc:  # noqa: BLE001 - a bug in one action must not leave the node in flight
            log.exception("remediation_job_crashed", node=job.node)
            for name in job.actions:
                out.results.setdefault(name, "failed")
                out.errors.setdefault(name, str(exc))
        finally:
            self._done.put(out)
            with self._lock:
                self._in_flight.discard(job.node)

    def _one(self, act: Action, job: Job, out: Outcome) -> None:
        delay = self.backoff_s
        for attempt in range(1, self.retries + 2):
            out.attempts[act.name] = attempt
            try:
                out.results[act.name] = act.undo(job.node, job.reason) if job.undo \
                    else act.apply(job.node, job.reason, job.incident)
                return
            except ActionError as exc:
                out.errors[act.name] = str(exc)
                if attempt > self.retries:
                    break
                self.retries_total += 1
                log.warning("remediation_retry", node=job.node, action=act.name, attempt=attempt, error=str(exc),
                            retry_in_s=delay)
                if self._sleep(delay):
                    break  # stopping
                delay *= 2
        out.results[act.name] = "failed"
