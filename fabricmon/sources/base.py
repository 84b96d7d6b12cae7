"""The protocol every source implements."""

from __future__ import annotations

from typing import Protocol

from ..model import SourceResult
from .inventory import Inventory


class Source(Protocol):
    """A hardware source.  ``poll`` runs in a worker thread under a deadline.

    It must never raise for a per-device problem: count it with
    ``result.error(...)`` and keep going, so one bad file costs one series.
    Raising (or overrunning the deadline) marks the whole source down for this
    poll; the poller then serves nothing from it rather than stale values.

    Every number taken from outside (a file, a dump, a driver call) passes
    ``sources.bounds`` first: an integer within its counter's width, a finite
    gauge within its documented range, a bounded read.  A refused value costs
    its own series, one ``result.error`` and one count in the source's
    ``RejectCounts`` (``fabricmon_source_values_rejected_total{collector,reason}``);
    it never reaches the counter tracker, which would raise on a NaN counter.
    Per-file errors go to an ``errorlog.ErrorLog`` so the failing path is logged,
    rate-limited.

    Optional class attribute ``self_bounded = True``: ``poll`` itself never
    blocks longer than ``timeout`` (it makes its blocking calls on a thread of
    its own and waits with a deadline, like NvmlSource), so the poller runs it
    inline in the poll thread instead of handing it to a worker.
    """

    name: str
    timeout: float

    def poll(self, inventory: Inventory) -> SourceResult: ...

    def close(self) -> object: ...  # what it returns is not read (NvmlSource: whether it stopped)
