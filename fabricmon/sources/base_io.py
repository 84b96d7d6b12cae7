"""Safe small-file reads shared by the sysfs sources."""

from __future__ import annotations

import os


_O_READ = os.O_RDONLY | os.O_CLOEXEC


def read_text(path: str) -> str:
    """Read a small sysfs file.  Raises OSError; callers turn it into an error count.

    One ``os.read`` on a raw fd: a buffered file object costs several times
    the syscalls themselves, and sysfs attributes are read whole by one read.
    At most 4096 bytes (a sysfs page) are read, whatever the file's size.
    """
    fd = os.open(path, _O_READ)
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def list_dir(path: str) -> list[str]:
    """Names in a directory, sorted; [] when it does not exist.  Never follows into links."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
