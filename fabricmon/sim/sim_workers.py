"""Spawned simulation workers, one pipe each: what the parallel tree and memory simulators share.

Workers are started with ``spawn`` (no threads or locks inherited) and always told to stop; each is
asked for up to ``ahead`` steps before the caller needs them, so a worker that finishes early goes
straight on instead of waiting at a barrier for the slowest one and for the caller.  A worker that
dies or reports an error ends the run with it; one that says nothing for ``timeout`` seconds too.
Every worker speaks the same protocol: it answers ``"step"`` with any number of messages ending in
one whose first item is ``"step"``, sends ``("error", text, ...)`` on failure, and exits on
anything else.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import SimulatedCluster

STEP_TIMEOUT_S = 120.0
AHEAD = 3  # steps a worker may run ahead of the caller
DRAIN_S = 30.0  # at close: how long the steps asked and unused are read before the workers are stopped


@contextmanager
def answering(conn: Connection) -> Iterator[None]:
    """A worker's body: a closed pipe or an interrupt ends it quietly; any other error is sent to the
    parent, which raises it (the worker then exits)."""
    try:
        yield
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", []))
        except OSError:
            pass


class SimWorkers:
    def __init__(self, target: Callable[..., None], args: list[tuple], names: list[str], *, duration: float,
                 interval: float, ahead: int = AHEAD, timeout: float = STEP_TIMEOUT_S) -> None:
        self._target = target
        self._args = args  # each worker's arguments after its pipe
        self._names = names
        self._duration = duration
        self._interval = interval
        self._ahead = ahead
        self.timeout = timeout
        self._ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self._procs: list = []
        self._inflight = 0  # steps already asked of the workers and not yet collected
        self._asked_until = 0.0  # simulated time the last asked step reaches

    def start(self) -> None:
        for args, name in zip(self._args, self._names, strict=True):
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=self._target, args=(child, *args), daemon=True, name=name)
            proc.start()
            child.close()
            self.conns.append(parent)
            self._procs.append(proc)

    @property
    def started(self) -> bool:
        return bool(self._procs)

    def ask_ahead(self, t: float) -> None:
        """Keep up to ``ahead`` steps queued at every worker (``t``: the caller's simulated time)."""
        if self._inflight == 0:
            self._asked_until = t
        while self._inflight < self._ahead and self._asked_until + self._interval <= self._duration + 1e-9:
            for conn in self.conns:
                conn.send("step")
            self._inflight += 1
            self._asked_until += self._interval

    def collected(self) -> None:
        """One asked step was read from every worker."""
        self._inflight -= 1

    def recv(self, conn: Connection):
        if not conn.poll(self.timeout):
            raise TimeoutError(f"simulation worker gave no answer in {self.timeout:.0f} s")
        try:
            msg = conn.recv()
        except EOFError:
            raise RuntimeError("a simulation worker exited without answering (its error is above)") from None
        if msg[0] == "error":
            raise RuntimeError(f"simulation worker failed: {msg[1]}")
        return msg

    def close(self, drain_s: float = DRAIN_S) -> None:
        """Read what was asked and will not be used (so the workers are idle), stop them, wait for them.
        The reading ends after ``drain_s`` in all (a worker still busy then is terminated below), not
        after ``timeout`` per step: a hung worker must not hold a closing run for minutes."""
        drain_end = time.monotonic() + drain_s
        for _ in range(self._inflight):
            for conn in self.conns:
                try:
                    while (conn.poll(max(0.0, drain_end - time.monotonic()))
                           and conn.recv()[0] not in ("step", "error")):
                        pass
                except (EOFError, OSError):
                    pass
        self._inflight = 0
        for conn in self.conns:
            try:
                conn.send("stop")
            except OSError:
                pass
        deadline = time.monotonic() + 10.0
        for proc in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
        for conn in self.conns:
            conn.close()


class ParentState:
    """What a parallel simulator answers from the parent's own copy of the simulation (``self.driver``:
    a SimulatedCluster of no nodes, stepped beside the workers): the clock and every truth; and how it
    starts and stops that copy with its workers (``_workers``; ``_started`` once their first answer,
    which ``_await_started`` reads, came)."""

    driver: SimulatedCluster
    _workers: SimWorkers
    _started: bool

    def _await_started(self) -> None:
        raise NotImplementedError

    def _start_workers(self) -> None:
        self.driver.start()
        self._workers.start()
        self._started = False

    def _stop_workers(self) -> None:
        """Read the workers' first answer if it was never read, stop them, close the parent's copy."""
        if self._workers.started and not self._started:
            try:
                self._await_started()
            except (RuntimeError, TimeoutError):
                pass
        self._workers.close()
        self.driver.close()

    @property
    def t(self) -> float:
        return self.driver.t

    def now(self) -> float:
        return self.driver.now()

    def ground_truth(self) -> list[dict]:
        return self.driver.ground_truth()

    @property
    def switch_sources(self) -> tuple[str, ...]:
        return self.driver.switch_sources  # the worker with that node runs its sweeping agent

    def jobs_truth(self) -> list[dict]:
        return self.driver.jobs_truth()  # the parent steps the same jobs as the workers

    def decoys_truth(self) -> list[dict]:
        return self.driver.decoys_truth()
