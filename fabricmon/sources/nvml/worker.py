"""The private thread every NVML call runs on."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

class NvmlWorker:
    """One daemon thread that makes every NVML call, one job at a time.

    Daemon, so a call hung in the driver never blocks interpreter exit; one
    job at a time, so a hung call is never joined by a second one.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], cf.Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="nvml", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> cf.Future:
        fut: cf.Future = cf.Future()
        self._jobs.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._jobs.put(None)  # after the current job (even a hung one) finishes

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the waiting poll
                fut.set_exception(exc)
