"""Rate-limited logging of per-file source errors.

``fabricmon_collector_errors_total`` says that a collector hit errors, not
where.  Each source hands its poll's error messages here; the first failure of
each file is logged at once (path and error), and the same file is logged
again at most once per ``every`` seconds, with how many failures were not
logged in between.  A file failing every second therefore costs one log line
per ``every`` seconds, and the number of files remembered is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import structlog

log = structlog.get_logger("fabricmon.sources")

__all__ = ["ErrorLog", "subject_of"]


def subject_of(message: str) -> str:
    """The part of an error message that names what failed (``mlx5_0/1/counters/x``), before ``": "``."""
    return message.split(": ", 1)[0]


class ErrorLog:
    def __init__(
        self,
        collector: str,
        every: float = 300.0,
        max_subjects: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        logger=None,
        event: str = "source_file_error",
    ) -> None:
        self.collector = collector
        self.event = event
        self.every = every
        self.max_subjects = max_subjects
        self._clock = clock
        self._log = logger if logger is not None else log
        # subject -> (time last logged, failures since then not logged)
        self._seen: dict[str, list] = {}

    def report(self, messages: Iterable[str], path_of: Callable[[str], str] | None = None) -> int:
        """Log what is due among ``messages``; returns how many lines were logged.

        ``path_of`` maps a message subject to the file's full path where the
        message names it relative to something (a port key).
        """
        now = self._clock()
        logged = 0
        for message in messages:
            subject = subject_of(message)
            entry = self._seen.get(subject)
            if entry is not None and now - entry[0] < self.every:
                entry[1] += 1
                continue
            if entry is None and len(self._seen) >= self.max_subjects:
                self._forget(now)
                if len(self._seen) >= self.max_subjects:
                    continue  # thousands of distinct failing files: the counter still says so
            suppressed = entry[1] if entry is not None else 0
            self._seen[subject] = [now, 0]
            self._log.warning(
                self.event, collector=self.collector,
                path=path_of(subject) if path_of is not None else subject,
                error=message[len(subject) + 2:] if len(message) > len(subject) else message,
                suppressed_since_last=suppressed,
            )
            logged += 1
        return logged

    def _forget(self, now: float) -> None:
        for subject in [s for s, (t, _) in self._seen.items() if now - t >= self.every]:
            del self._seen[subject]
