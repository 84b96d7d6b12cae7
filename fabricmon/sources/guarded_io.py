"""Reads from outside that can neither block on open nor hold the agent for good.

Two hazards, one module:

* **Opens that block.**  ``open()`` of a FIFO blocks until a writer appears, so a
  FIFO swapped into a watched directory between ``lstat`` and ``open`` (the NCCL
  Inspector dump dir is writable by every job) held a worker for good.
  ``open_regular`` opens with ``O_NONBLOCK | O_NOFOLLOW`` (neither a FIFO nor a
  symlink can make the open wait or lead elsewhere) and refuses anything that
  ``fstat`` on the opened descriptor does not call a regular file: what is read
  is what was checked, there is no window between the check and the read.
* **Reads that block in a driver.**  A sysfs read on a firmware-stuck HCA sleeps
  in the kernel, uninterruptibly.  ``KeyedWorkers`` runs such reads on one daemon
  thread per key (a device), waits with a deadline, and never has more than one
  read outstanding per key: a stuck device is not asked again until its read
  returns, so it costs one thread, never one per poll.  Workers are daemon
  threads and nothing joins them (``concurrent.futures`` pools are joined at
  interpreter exit: one stuck read there kept the agent from exiting on SIGTERM).
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

O_GUARDED = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


class NotRegularFile(OSError):
    """The path names something other than a regular file; refused before any read."""


def open_regular(path: str, *, dir_fd: int | None = None, follow_symlinks: bool = False) -> tuple[int, os.stat_result]:
    """An fd open for reading on a regular file, and its ``fstat``; raises OSError.

    A symlink as the last component fails with ELOOP (O_NOFOLLOW) unless
    ``follow_symlinks`` (a file a user names in config, e.g. on a ConfigMap mount); a
    FIFO, socket, device or directory raises ``NotRegularFile`` naming what it is.
    The fd is left in non-blocking mode, which changes nothing for a regular file."""
    flags = O_GUARDED & ~os.O_NOFOLLOW if follow_symlinks else O_GUARDED
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise NotRegularFile(errno.EINVAL, f"refused: {what}, not a regular file", path)
    return fd, st


def read_regular(path: str, limit: int, *, dir_fd: int | None = None) -> bytes:
    """At most ``limit`` bytes of a regular file with one read (sysfs attributes are read whole)."""
    fd, _ = open_regular(path, dir_fd=dir_fd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


class Stuck(Exception):
    """The key's previous call has not returned: not started again until it does."""


class _Worker:
    __slots__ = ("q", "pending", "thread")

    def __init__(self, name: str) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: cf.Future | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, never lost with the thread
                fut.set_exception(exc)


class KeyedWorkers:
    """One daemon worker thread per key; at most one outstanding call per key.

    ``submit`` raises ``Stuck`` while the key's previous call runs; ``retire`` ends
    the workers of keys no longer used (a worker still stuck ends when its call
    returns).  Nothing here ever waits for a worker."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._workers: dict[Hashable, _Worker] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._workers)

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> cf.Future:
        with self._lock:
            w = self._workers.get(key)
            if w is None:
                w = self._workers[key] = _Worker(f"{self._prefix}-{key}")
            elif w.pending is not None and not w.pending.done():
                raise Stuck(key)
            fut: cf.Future = cf.Future()
            w.pending = fut
            w.q.put((fut, fn, args))
            return fut

    def stuck(self) -> list[Hashable]:
        """Keys whose last call has not returned."""
        with self._lock:
            return [k for k, w in self._workers.items() if w.pending is not None and not w.pending.done()]

    def retire(self, keep: Iterable[Hashable]) -> None:
        keep = set(keep)
        with self._lock:
            for key in [k for k in self._workers if k not in keep]:
                self._workers.pop(key).q.put(None)

    def close(self) -> None:
        self.retire(())


K = TypeVar("K", bound=Hashable)


# How long run_all waits on one key's call before it gives up on taking them one at a time.
STALL_S = 0.05


def run_all(workers: KeyedWorkers, calls: Mapping[K, tuple[Callable[..., Any], tuple[Any, ...]]],
            timeout: float) -> tuple[dict[K, Any], dict[K, str]]:
    """Run every call on its key's worker; wait at most ``timeout`` for all of them.

    The calls run one after another while each returns within ``STALL_S`` (or a quarter of
    ``timeout``) and the first quarter of ``timeout`` has not passed, and the rest all at once
    from then on: a stuck device still costs only itself, and on a busy machine, where every
    read is slow without any being stuck, the keys not yet run share three quarters of the
    deadline rather than what the ones before them left (taken one at a time to the end, the
    last of nine HCAs were reported blocked under CPU load).  Why not all at once from the
    start: the reads are Python work under the GIL, and nine device threads parsing at once
    fought over it: a poll of the 8-HCA node fixture took 10 ms of CPU that way, 5 ms one at a
    time, and the agent's /metrics waited behind that fight (issue 39's p99).

    Returns (what each call returned, or the exception it raised, by key; why by key for each
    call that gave neither: stuck from an earlier call or over the deadline now).  A call over
    the deadline keeps running on its worker; its key is ``Stuck`` until it returns."""
    start = time.monotonic()
    end = start + timeout
    stall = min(STALL_S, timeout / 4)
    futures: dict[K, cf.Future[Any]] = {}
    failed: dict[K, str] = {}
    one_at_a_time = True
    for key, (fn, args) in calls.items():
        try:
            fut = futures[key] = workers.submit(key, fn, *args)
        except Stuck:
            failed[key] = "previous read still blocked"
            continue
        if one_at_a_time and not cf.wait((fut,), timeout=max(0.0, min(stall, end - time.monotonic())))[0]:
            one_at_a_time = False  # this one is slow or stuck: the others go at once
        elif one_at_a_time and time.monotonic() - start > timeout / 4:
            one_at_a_time = False  # a quarter of the deadline gone: the others share what is left
    _, not_done = cf.wait(futures.values(), timeout=max(0.0, end - time.monotonic()))
    results: dict[K, Any] = {}
    for key, fut in futures.items():
        if fut in not_done:
            failed[key] = f"read blocked past its {timeout:.2f}s deadline"
            continue
        exc = fut.exception()
        results[key] = exc if exc is not None else fut.result()
    return results, failed
