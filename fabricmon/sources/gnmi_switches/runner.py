"""Every switch's session on one asyncio event loop, on a thread of its own: one connection per switch,
none able to hold up another or the agent's poll (which only reads the stores)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import structlog

from ...config import GnmiSwitchesConfig
from .session import Session
from .store import SwitchStore

log = structlog.get_logger("fabricmon.gnmi")


class Runner:
    def __init__(self, cfg: GnmiSwitchesConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        names = frozenset(t.name for t in cfg.targets)
        self.stores = {t.name: SwitchStore(t.name, t.profile, cfg.max_series, names) for t in cfg.targets}
        self.sessions = [Session(t, cfg, self.stores[t.name], clock) for t in cfg.targets]
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name="gnmi-switches", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except Exception as exc:  # the thread must say why it ended; the poll reports it as a source problem
            log.error("gnmi_runner_failed", error=repr(exc))

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await asyncio.gather(*(s.run(self._stop) for s in self.sessions))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def refresh_credentials(self) -> list[str]:
        """SIGHUP: every switch whose credential files changed reconnects with them at once.  Returns the
        names of those switches."""
        loop = self._loop
        changed = [s for s in self.sessions if s.credentials_changed()]
        if loop is not None and changed:
            for s in changed:
                loop.call_soon_threadsafe(s.reconnect)
        return [s.target.name for s in changed]

    def stop(self, timeout: float = 5.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed in between
                pass
        if self._thread is not None:
            self._thread.join(timeout)
