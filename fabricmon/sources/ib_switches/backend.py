"""What the ``ib_switches`` source reads a sweep from: the real sweeper (infiniband-diags on its own
thread, ``sweeper.Sweeper``) or a file a simulator writes (``backend_fake.FakeSweep``), chosen by
``sources.ib_switches.backend`` (``tools`` | ``fake:FILE``), as the nvml source's ``fake:FILE``."""

from __future__ import annotations

from typing import Protocol

from .sweeper import SweepSnapshot


class SweepBackend(Protocol):
    def snapshot(self) -> SweepSnapshot: ...

    @property
    def queries(self) -> dict[str, int]: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...
