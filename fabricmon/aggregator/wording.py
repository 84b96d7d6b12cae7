"""How times and durations read in alert text (evidence and descriptions): what a technician reads on a
page.  Sample times are epoch seconds; a page said "since t=1795847686" and "+110 in 3.00087s" (issue 36).
"""

from __future__ import annotations

from datetime import datetime

from ..compat import UTC


def at(ts: float) -> str:
    """An epoch time as RFC3339 UTC to the second: ``2026-11-28T09:31:23Z``."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def secs(x: float) -> str:
    """A duration rounded for reading: whole seconds from 1 s up (``3s``, ``120s``), one decimal below."""
    return f"{round(x)}s" if x >= 1 else f"{x:.1f}s"
