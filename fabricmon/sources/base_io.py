"""Safe small-file reads shared by the sysfs sources."""

from __future__ import annotations

import os


def read_text(path: str) -> str:
    """Read a small sysfs file.  Raises OSError; callers turn it into an error count."""
    with open(path, "rb") as fh:
        return fh.read(4096).decode("ascii", "replace").strip()


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
