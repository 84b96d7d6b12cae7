"""A source whose read never returns (imported by a child process too)."""

from __future__ import annotations

import threading

from fabricmon.model import SourceResult


class _Blocking:
    """A source whose poll blocks until released, as a read stuck in a driver does."""

    name = "stuckdrv"
    timeout = 0.2

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def poll(self, inventory) -> SourceResult:
        self.calls += 1
        self.release.wait()
        return SourceResult(self.name)

    def close(self) -> None:
        pass
