"""A source that only counts its polls (and exports the count): for tests of the poll loop's cadence."""

from __future__ import annotations

from fabricmon.model import Reading, Semantics, SourceResult


class CountingSource:
    name = "counting"
    timeout = 1.0
    self_bounded = True

    def __init__(self) -> None:
        self.polls = 0

    def poll(self, inventory):
        self.polls += 1
        r = SourceResult(self.name)
        r.readings.append(Reading("fabricmon_test_polls_total", (), self.polls, Semantics.MONOTONIC, 64))
        return r

    def close(self) -> None:
        pass
