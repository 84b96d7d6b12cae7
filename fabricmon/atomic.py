"""Atomic file writes: a reader never sees a half-written state, spool or tree file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_output(path: str | Path) -> Iterator[str]:
    """Yield a temporary path beside ``path``; renamed over it when the block ends, removed on error."""
    p = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=os.path.dirname(p) or ".")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | Path, data: bytes, *, fsync: bool = False) -> None:
    """Write to a temporary file in the same directory, then rename over ``path``.

    ``fsync`` makes the data durable across a power loss (spools); simulator
    trees skip it because they only need atomicity against readers.
    """
    p = os.fspath(path)
    with atomic_output(p) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    if fsync:
        dfd = os.open(os.path.dirname(p) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def atomic_write_text(path: str | Path, text: str, *, fsync: bool = False) -> None:
    atomic_write_bytes(path, text.encode(), fsync=fsync)
