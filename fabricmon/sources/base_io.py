"""Safe small-file reads shared by the sysfs sources."""

from __future__ import annotations

import os

from .guarded_io import read_regular


def read_text(path: str) -> str:
    """Read a small sysfs file.  Raises OSError; callers turn it into an error count.

    One ``os.read`` on a raw fd: a buffered file object costs several times
    the syscalls themselves, and sysfs attributes are read whole by one read.
    At most 4096 bytes (a sysfs page) are read, whatever the file's size.  Opened
    non-blocking without following a last symlink, and refused unless ``fstat`` on
    the descriptor says regular file (guarded_io): a FIFO in a fixture or
    ``--host-root`` tree cannot block discovery.
    """
    return read_regular(path, 4096).decode("ascii", "replace").strip()


def list_dir(path: str) -> list[str]:
    """Names in a directory, sorted; [] when it does not exist.  Never follows into links."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
