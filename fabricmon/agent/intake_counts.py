"""What became of the rank intake's lines: accepted, rejected by reason (with a log line at most once a
second, saying how many it held back), and the series it dropped, as the ``fabricmon_intake_*``
self-metrics with fixed label sets (a rate over them needs no guessing).

Not locked itself: ``intake.RankIntake`` counts and reads under its lock.
"""

from __future__ import annotations

import time

import structlog

from ..model import Reading, Semantics
from ..rank_timing import REJECT_REASONS

log = structlog.get_logger("fabricmon.intake")

# Every (result, reason) pair the intake counts: fixed, so input cannot add series.
LINE_RESULTS = (("accepted", "ok"),
                *(("rejected", r) for r in (*REJECT_REASONS, "job_limit", "series_limit", "conflict")))


class LineCounts:
    def __init__(self) -> None:
        self.lines = dict.fromkeys(LINE_RESULTS, 0)
        self.accepted_total = 0
        self.rejected_total = 0
        self.conflicts_total = 0
        self.dropped_total = 0  # accepted timings the stream did not drain in time
        self.expired_total = 0  # (job, rank) series forgotten after latest_ttl
        self._last_log = 0.0
        self._suppressed = 0

    def accepted(self) -> None:
        self.accepted_total += 1
        self.lines[("accepted", "ok")] += 1

    def rejected(self, reason: str, message: str, origin: str) -> tuple[bool, str]:
        """Count a rejected line and log it (rate limited); (False, message) for the caller to return."""
        self.rejected_total += 1
        self.lines[("rejected", reason)] += 1
        now = time.monotonic()
        if now - self._last_log < 1.0:
            self._suppressed += 1
            return False, message
        suppressed, self._suppressed, self._last_log = self._suppressed, 0, now
        log.warning("rank_line_rejected", origin=origin, reason=reason, error=message,
                    suppressed_since_last=suppressed, rejected_total=self.rejected_total)
        return False, message

    def readings(self, source: str, series: int) -> list[Reading]:
        """Lines by result and reason, the ``series`` held, and the series dropped by reason."""
        src = ("source", source)
        out = []
        for (result, reason), n in self.lines.items():
            out.append(Reading("fabricmon_intake_lines_total", (src, ("result", result), ("reason", reason)), n,
                               Semantics.MONOTONIC))
        out.append(Reading("fabricmon_intake_series", (src,), series))
        limit = self.lines[("rejected", "job_limit")] + self.lines[("rejected", "series_limit")]
        for reason, n in (("limit", limit), ("expired", self.expired_total), ("buffer_full", self.dropped_total)):
            out.append(Reading("fabricmon_intake_series_dropped_total", (src, ("reason", reason)), n,
                               Semantics.MONOTONIC))
        return out
