"""Per-rank step timings: the JSON-lines format training jobs send to the agent.

``{"job": "llm-7b", "rank": 17, "local_rank": 1, "step": 1200, "step_seconds": 1.82,
"comm_seconds": 0.41, "ts": 1764000000.5}`` with optional ``gpu`` (defaults to
``local_rank``) and ``group`` ({"tp", "pp", "dp"}); a layout line
``{"job": "llm-7b", "layout": {"tp": 8, "pp": 4, "dp": 64}}`` describes the job once.
The agent adds ``node``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field


class RankTimingError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RankTiming:
    job: str
    rank: int
    local_rank: int
    step: int
    step_seconds: float
    comm_seconds: float
    ts: float
    node: str = ""
    gpu: int = -1  # -1: same as local_rank
    group: tuple[tuple[str, int], ...] = ()

    @property
    def gpu_index(self) -> int:
        return self.local_rank if self.gpu < 0 else self.gpu


@dataclass(frozen=True, slots=True)
class JobLayout:
    job: str
    layout: tuple[tuple[str, int], ...] = field(default=())


def _num(obj: dict, key: str, kind: type, required: bool = True, default=None):
    if key not in obj:
        if required:
            raise RankTimingError(f"{key}: required")
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RankTimingError(f"{key}: expected a number, got {v!r}")
    if kind is int:
        if isinstance(v, float) and not v.is_integer():
            raise RankTimingError(f"{key}: expected an integer, got {v!r}")
        v = int(v)
        if v < 0:
            raise RankTimingError(f"{key}: must be >= 0, got {v}")
        return v
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise RankTimingError(f"{key}: must be a finite number >= 0, got {v!r}")
    return v


def parse_line(line: str | bytes, *, node: str = "", now: float | None = None) -> RankTiming | JobLayout:
    """Parse one JSON line; raises RankTimingError naming the field on bad input."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RankTimingError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RankTimingError("expected a JSON object")
    job = obj.get("job")
    if not isinstance(job, str) or not job or len(job) > 128:
        raise RankTimingError("job: required, a non-empty string of at most 128 characters")
    if "layout" in obj:
        lay = obj["layout"]
        if not isinstance(lay, dict) or not all(isinstance(v, int) and v > 0 for v in lay.values()):
            raise RankTimingError("layout: expected a mapping of positive integers")
        return JobLayout(job, tuple((str(k), int(v)) for k, v in lay.items()))
    group = obj.get("group") or {}
    if not isinstance(group, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in group.values()):
        raise RankTimingError("group: expected a mapping of integers")
    ts = _num(obj, "ts", float, required=now is None, default=now)
    local_rank = _num(obj, "local_rank", int, required=False, default=0)
    return RankTiming(
        job=job,
        rank=_num(obj, "rank", int),
        local_rank=local_rank,
        step=_num(obj, "step", int),
        step_seconds=_num(obj, "step_seconds", float),
        comm_seconds=_num(obj, "comm_seconds", float, required=False, default=0.0),
        ts=ts,
        node=node or str(obj.get("node", "")),
        gpu=_num(obj, "gpu", int, required=False, default=-1),
        group=tuple((str(k), int(v)) for k, v in group.items()),
    )


def to_json(t: RankTiming) -> str:
    obj = {"job": t.job, "rank": t.rank, "local_rank": t.local_rank, "step": t.step,
           "step_seconds": t.step_seconds, "comm_seconds": t.comm_seconds, "ts": t.ts}
    if t.node:
        obj["node"] = t.node
    if t.gpu >= 0:
        obj["gpu"] = t.gpu
    if t.group:
        obj["group"] = dict(t.group)
    return json.dumps(obj, separators=(",", ":"))
