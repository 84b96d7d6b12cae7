"""Safe small-file reads shared by the sysfs sources."""

from __future__ import annotations

import os


_O_READ = os.O_RDONLY | os.O_CLOEXEC


def read_text(path: str) -> str:
    """Read a small sysfs file.  Raises OSError; callers turn it into an error count.

    One ``os.read`` on a raw fd: a buffered file object costs several times
    the syscalls themselves, and sysfs attributes are read whole by one read.
    """
    fd = os.open(path, _O_READ)
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def read_int(path: str) -> int:
    text = read_text(path)
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        raise ValueError(f"{path}: not an integer: {text[:40]!r}") from None


def list_dir(path: str) -> list[str]:
    """Names in a directory, sorted; [] when it does not exist.  Never follows into links."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
