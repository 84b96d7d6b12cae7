"""The simulator's fast rank lines are byte for byte the client's lines (to_json without the node)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fabricmon.rank_timing import RankTiming, parse_line, to_json
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.job import JobSpec, SyntheticJob
from fabricmon.sim.rank_lines import RankLines
from fabricmon.sim.scenario import ClusterSpec, Scenario


def _client_line(t: RankTiming) -> str:
    return to_json(replace(t, node=""))


def test_the_simulators_timings_give_the_clients_bytes():
    c = ClusterState(Scenario(ClusterSpec(4, "ib", 2), 60))
    job = SyntheticJob(c.names, JobSpec(), epoch=c.epoch)
    timings = job.advance_to(6.0, c.effects())
    assert len(timings) > 32 and any(t.group for t in timings)
    lines = RankLines()
    for t in timings:
        assert lines.line(t) == _client_line(t)
        assert parse_line(lines.line(t), node=t.node) == t


def test_edge_values_give_the_clients_bytes():
    base = RankTiming("llm", 3, 3, 7, 1.25, 0.5, 1.7e9 + 0.125, node="n1")
    cases = [
        base,
        replace(base, gpu=5, group=(("tp", 1), ("pp", 0)), job_id="slurm-42"),
        replace(base, job='j\u00e9b "q"\\', job_id="\u4e2d"),  # json escapes and non-ASCII
        replace(base, step_seconds=1e-7, comm_seconds=0.0, ts=1e11),  # exponent notation as json writes it
        replace(base, group=(("dp", 2), ("dp", 3))),  # a repeated key: to_json's dict keeps the last
        replace(base, step_seconds=float("nan")),  # not covered by the fast form: to_json writes it
        replace(base, rank=np.int64(4)),  # a numpy scalar: to_json's own result (an error), not a guess
    ]
    lines = RankLines(max_cached=2)  # small: the bound is crossed and the caches refill
    for t in cases:
        try:
            want: str | type[Exception] = _client_line(t)
        except TypeError:
            want = TypeError
        try:
            got: str | type[Exception] = lines.line(t)
        except TypeError:
            got = TypeError
        assert got == want, t
