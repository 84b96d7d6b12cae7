"""Atomic file writes: a reader never sees a half-written state, spool or tree file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes, *, fsync: bool = False) -> None:
    """Write to a temporary file in the same directory, then rename over ``path``.

    ``fsync`` makes the data durable across a power loss (spools); simulator
    trees skip it because they only need atomicity against readers.
    """
    p = os.fspath(path)
    directory = os.path.dirname(p) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def atomic_write_text(path: str | Path, text: str, *, fsync: bool = False) -> None:
    atomic_write_bytes(path, text.encode(), fsync=fsync)
