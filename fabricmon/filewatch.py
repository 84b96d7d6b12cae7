"""Notice when the secret files a daemon reads (tokens, TLS certificate, key and CA) change, so a
rotation is applied without a SIGHUP.

Why: nothing tells the process.  A Kubernetes Secret mounted as a volume is updated by the kubelet
swapping the ``..data`` symlink to a new directory, and the process is not signalled; an operator
who rewrites ``/etc/fabricmon/token`` may forget ``systemctl reload``.  The change is handed to the
same reload a SIGHUP runs (the caller's ``on_change``), so what is accepted, refused and counted is
the same (``fabricmon_config_reloads_total{result}``, ``fabricmon_config_last_reload_successful``).

Cheap and bounded: one thread per process; every ``period`` seconds each file is ``stat``-ed
(following symlinks, so a ``..data`` swap is a new inode) and read only when its stat changed.  A
change is handed on once the file has held still for one period, so a file caught mid-write is not
applied half-written; its contents' SHA-256 must differ from the last handed on (a ``touch`` is not
a rotation).  A file that disappears is a change too: the reload then fails and says why.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable

import structlog

from .buildinfo import ReloadStatus
from .configload import ConfigError

log = structlog.get_logger("fabricmon.filewatch")

# Seconds between two looks: a rotation is applied within two periods (one to see it, one to see it still).
WATCH_PERIOD_S = 2.0
PERIOD_ENV = "FABRICMON_SECRET_WATCH_S"  # another period (tests; 0 turns the watch off)


def watch_period() -> float:
    """``FABRICMON_SECRET_WATCH_S`` when set, else ``WATCH_PERIOD_S``; ConfigError on a bad value."""
    raw = os.environ.get(PERIOD_ENV, "").strip()
    if not raw:
        return WATCH_PERIOD_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ConfigError(f"{PERIOD_ENV}: {raw!r}: seconds between 0 (off) and 3600")
    return value

StatSig = tuple[int, int, int, int, int] | None


def stat_sig(path: str) -> StatSig:
    """What a change of ``path`` changes: device, inode, size, mtime, ctime (None: cannot stat)."""
    try:
        st = os.stat(path)  # follows symlinks: the kubelet's ..data swap gives another inode
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def content_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


class FileWatch:
    """Watch ``paths``; call ``on_change(changed paths)`` from the watch thread when contents changed."""

    def __init__(self, paths: Iterable[str | None], on_change: Callable[[list[str]], None],
                 status: ReloadStatus | None = None, period: float | None = None) -> None:
        self.period = watch_period() if period is None else period
        self.paths = tuple(dict.fromkeys(p for p in paths if p)) if self.period > 0 else ()
        self.on_change, self.status = on_change, status
        self._sig: dict[str, StatSig] = {p: stat_sig(p) for p in self.paths}
        self._digest: dict[str, str | None] = {p: content_digest(p) for p in self.paths}
        self._moving: set[str] = set()
        self.changes_total = 0
        self._thread: threading.Thread | None = None
        if status is not None:
            status.watching(len(self.paths))

    def check(self) -> list[str]:
        """One look at every file; the paths whose contents changed and held still since the last look."""
        changed: list[str] = []
        for p in self.paths:
            sig = stat_sig(p)
            if sig != self._sig[p]:
                self._sig[p] = sig
                self._moving.add(p)  # wait for it to hold still one period
                continue
            if p not in self._moving:
                continue
            self._moving.discard(p)
            digest = content_digest(p)
            if digest != self._digest[p]:
                self._digest[p] = digest
                changed.append(p)
        if changed:
            self.changes_total += len(changed)
            if self.status is not None:
                self.status.noticed(len(changed))
            log.info("secret_files_changed", files=changed, detail="reloading them as SIGHUP would")
            self.on_change(changed)
        return changed

    def start(self, stop: threading.Event) -> FileWatch:
        if not self.paths:
            return self
        self._thread = threading.Thread(target=self._run, args=(stop,), name="fabricmon-filewatch", daemon=True)
        self._thread.start()
        return self

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.period):
            try:
                self.check()
            except Exception as exc:  # the watch must not die silently: say so and look again next period
                log.error("secret_file_watch_failed", error=f"{type(exc).__name__}: {exc}")

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
