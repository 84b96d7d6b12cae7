"""The JSON lines a job's client writes for its rank timings, made fast for the simulator.

A simulated 4,096-node cluster sends about 100,000 rank timings per simulated second through
the agents' real rank intake (``agent.intake.RankIntake``), which parses each as the JSON line a
job's client (``fabricmon.client``) would write.  ``rank_timing.to_json`` builds a dict and runs
``json.dumps`` per line, and the line carries no ``node`` (the agent adds it), so the simulator
also copied every timing with ``node=""`` first.  Here the line is one format string: the parts
that stay the same for a rank (its job's quoted name; its gpu, group and job_id) are encoded once
with ``json.dumps`` and kept, and the numbers are written as ``json`` writes them (``int.__repr__``
and ``float.__repr__``).  The bytes are those of ``to_json(replace(t, node=""))``:
``tests/sim/test_sim_rank_lines.py`` compares the two over the simulator's own timings and edge
cases.  A value the fast form does not cover (a non-finite float, a numpy scalar) is written by
``to_json`` itself.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

from ..rank_timing import RankTiming, optional_keys, to_json

_SEP = (",", ":")


class RankLines:
    """``line(t)``: the client's JSON line for ``t`` without its node (caches bounded by ``max_cached``)."""

    def __init__(self, max_cached: int = 65536) -> None:
        self._head: dict[str, str] = {}  # job -> '{"job":"<job>","rank":'
        self._tail: dict[tuple[int, tuple[tuple[str, int], ...], str], str] = {}  # (gpu, group, job_id) -> tail
        self._max = max_cached

    def line(self, t: RankTiming) -> str:
        rank, local_rank, step = t.rank, t.local_rank, t.step
        step_s, comm_s, ts = t.step_seconds, t.comm_seconds, t.ts
        if not (type(rank) is int and type(local_rank) is int and type(step) is int and type(t.gpu) is int
                and type(step_s) is float and type(comm_s) is float and type(ts) is float
                and math.isfinite(step_s + comm_s + ts)):
            return to_json(replace(t, node=""))
        head = self._head.get(t.job)
        if head is None:
            head = self._cache(self._head, t.job, '{"job":' + json.dumps(t.job) + ',"rank":')
        key = (t.gpu, t.group, t.job_id)
        tail = self._tail.get(key)
        if tail is None:
            tail = self._cache(self._tail, key, self._make_tail(t))
        return (f'{head}{rank},"local_rank":{local_rank},"step":{step},"step_seconds":{step_s!r},'
                f'"comm_seconds":{comm_s!r},"ts":{ts!r}{tail}')

    def _cache(self, table: dict, key, value: str) -> str:
        if len(table) >= self._max:
            table.clear()  # a bound, not an eviction policy: the simulator's jobs fit many times over
        table[key] = value
        return value

    @staticmethod
    def _make_tail(t: RankTiming) -> str:
        """What follows ``ts`` in ``to_json``'s line: its optional keys in its order, and the closing brace."""
        obj = optional_keys(t)
        if not obj:
            return "}"
        return "," + json.dumps(obj, separators=_SEP)[1:]
