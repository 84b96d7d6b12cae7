"""Per-rank step timings: the JSON-lines format training jobs send to the agent.

``{"job": "llm-7b", "rank": 17, "local_rank": 1, "step": 1200, "step_seconds": 1.82,
"comm_seconds": 0.41, "ts": 1764000000.5}`` with optional ``gpu`` (defaults to
``local_rank``), ``group`` ({"tp", "pp", "dp"}) and ``job_id``; a layout line
``{"job": "llm-7b", "layout": {"tp": 8, "pp": 4, "dp": 64}}`` describes the job once; a heartbeat
``{"job": "llm-70b", "job_id": "slurm-81723", "rank": 17, "heartbeat": {"step": 1200,
"coll_sn": 48211, "in_collective": true}, "ts": 1764000000.5}`` comes every 5 s from a rank's
background thread (DESIGN "Jobs, decoys and cost"): heartbeats that go on while ``coll_sn`` stays is
a hung job, heartbeats that stop an ended or restarting one; a heartbeat's optional ``nccl_ras``
(``"localhost:28028"``, the job's NCCL_RAS_ADDR) asks for the job's NCCL RAS to be queried when it is
suspected of hanging.  The agent adds ``node``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .model import _fast_frozen_init
from .nccl_ras.protocol import BadAddress, parse_addr
from .rejected import InputRejected
from .textcheck import MAX_JOB_NAME, MAX_NODE_NAME, label_text_ok, node_name_problem

# Why a line was rejected: a fixed set, so the self-metric label stays bounded.
REJECT_REASONS = ("too_long", "not_utf8", "not_json", "not_object", "missing_field", "bad_type", "out_of_range",
                  "bad_string")

MAX_LINE_BYTES = 64 * 1024
MAX_JOB_CHARS = MAX_JOB_NAME
MAX_KEY_CHARS = 32
MAX_GROUP_KEYS = 8
# Bounds are those of the wire fields (fabricmon.proto RankTiming) where a wider
# value would make the stream's encoder raise, tighter where the wire's range is
# not a sane value: 2**53 steps keep a float round trip exact, a step or
# communication time over 10**6 s (11.6 days) or a ts past 10**11 (year 5138, a
# timestamp sent in milliseconds) is a unit error, not a measurement.
MAX_RANK = 2**32 - 1          # uint32
MAX_LOCAL_RANK = 2**16 - 1
MAX_STEP = 2**53 - 1  # 2**53 and above are refused everywhere (aggregator intake too)
MAX_GPU = 1023                # sint32 on the wire; -1 means "same as local_rank"
MAX_GROUP_VALUE = 2**31 - 1   # int64 on the wire
MAX_SECONDS = 1e6
MAX_TS = 1e11


class RankTimingError(InputRejected):
    """A rank line refused; ``reason`` is one of REJECT_REASONS."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    job: str
    rank: int
    step: int
    coll_sn: int  # the rank's collective sequence number: frozen while it is stuck
    in_collective: bool
    ts: float
    node: str = ""
    job_id: str = ""
    nccl_ras: str = ""  # the job's NCCL RAS address when it asks to be queried on suspicion, else ""


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
    job_id: str = ""  # optional identity (a scheduler's job id): same-named jobs stay apart

    @property
    def gpu_index(self) -> int:
        return self.local_rank if self.gpu < 0 else self.gpu


@dataclass(frozen=True, slots=True)
class JobLayout:
    job: str
    layout: tuple[tuple[str, int], ...] = field(default=())


# Built per rank per interval on both sides of the wire (about 100,000 a simulated second at 4,096
# nodes): the slot-descriptor __init__ (model._fast_frozen_init) at about half the generated one's cost.
for _cls in (Heartbeat, RankTiming, JobLayout):
    _fast_frozen_init(_cls)
del _cls


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# One decoder for every line: json.loads with a keyword builds a new JSONDecoder on each call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# what JSONDecoder.decode runs after skipping leading whitespace (set by its __init__; typeshed omits it)
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]


def _scan_object(line: str) -> object | None:
    """A line that is one JSON object with no whitespace around it, decoded by the decoder's own
    scanner (``decode`` is that scan plus two whitespace matches); None for anything else, which
    ``decode`` then parses, or refuses with its own message."""
    if line[:1] != "{":
        return None
    try:
        obj, end = _SCAN(line, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return obj if end == len(line) else None


def _int(obj: dict, key: str, lo: int, hi: int, default: int | None = None) -> int:
    if key not in obj:
        if default is None:
            raise RankTimingError("missing_field", f"{key}: required")
        return default
    v = obj[key]
    if type(v) is int and lo <= v <= hi:  # the common case, decided in one test (bool is not exactly int)
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise RankTimingError("bad_type", f"{key}: expected an integer, got {_short(v)}")
    if not lo <= v <= hi:
        raise RankTimingError("out_of_range", f"{key}: must be in [{lo}, {hi}], got {_short(v)}")
    return int(v)


def _seconds(obj: dict, key: str, hi: float, default: float | None = None) -> float:
    if key not in obj:
        if default is None:
            raise RankTimingError("missing_field", f"{key}: required")
        return default
    v = obj[key]
    if type(v) is float and 0.0 <= v <= hi:  # the common case: a NaN fails the comparison, an infinity the bound
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RankTimingError("bad_type", f"{key}: expected a number, got {_short(v)}")
    try:
        f = float(v)
    except OverflowError:  # an integer literal beyond any double
        f = math.inf
    if not (math.isfinite(f) and 0.0 <= f <= hi):
        raise RankTimingError("out_of_range", f"{key}: must be a finite number in [0, {hi:g}], got {_short(v)}")
    return f


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _text(v, key: str, max_len: int) -> str:
    if not isinstance(v, str):
        raise RankTimingError("missing_field" if v is None else "bad_type", f"{key}: required, a string")
    if not label_text_ok(v, max_len):
        raise RankTimingError("bad_string", f"{key}: must be 1 to {max_len} printable characters (no control "
                                            "characters or lone surrogates)")
    return v


def _pairs(v, key: str, lo: int) -> tuple[tuple[str, int], ...]:
    if not isinstance(v, dict):
        raise RankTimingError("bad_type", f"{key}: expected a mapping of integers")
    if len(v) > MAX_GROUP_KEYS:
        raise RankTimingError("out_of_range", f"{key}: at most {MAX_GROUP_KEYS} entries")
    out = []
    for k, x in v.items():
        # the common case in one test (what _text and _int accept); anything else gets their checks and errors
        if not (type(k) is str and 0 < len(k) <= MAX_KEY_CHARS and k.isprintable()
                and type(x) is int and lo <= x <= MAX_GROUP_VALUE):
            _text(k, f"{key} key", MAX_KEY_CHARS)
            x = _int(v, k, lo, MAX_GROUP_VALUE)
        out.append((k, x))
    return tuple(out)


def parse_line(line: str | bytes, *, node: str = "",
               now: float | None = None) -> RankTiming | JobLayout | Heartbeat:
    """Parse one JSON line; raises RankTimingError (with a ``reason`` of REJECT_REASONS) naming the field.

    Every value that comes back fits its wire field, and every string is a
    valid label value.
    """
    if len(line) > MAX_LINE_BYTES:
        raise RankTimingError("too_long", f"line longer than {MAX_LINE_BYTES} bytes")
    if isinstance(line, (bytes, bytearray)):
        try:
            line = bytes(line).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RankTimingError("not_utf8", f"not UTF-8 at byte {exc.start}") from None
    obj = _scan_object(line)
    if obj is None:
        try:
            obj = _DECODER.decode(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the stack
            raise RankTimingError("not_json", f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(obj, dict):
        raise RankTimingError("not_object", "expected a JSON object")
    job = _text(obj.get("job"), "job", MAX_JOB_CHARS)
    if "layout" in obj:
        layout = _pairs(obj["layout"], "layout", 1)
        if not layout:
            raise RankTimingError("out_of_range", "layout: at least one entry")
        return JobLayout(job, layout)
    if not node and "node" in obj:
        node = _text(obj["node"], "node", MAX_NODE_NAME)
        if (why := node_name_problem(node)) is not None:  # the rule every node name follows
            raise RankTimingError("bad_string", f"node: {why}")
    job_id = _text(obj["job_id"], "job_id", MAX_JOB_CHARS) if obj.get("job_id") is not None else ""
    if "heartbeat" in obj:
        hb = obj["heartbeat"]
        if not isinstance(hb, dict):
            raise RankTimingError("bad_type", "heartbeat: expected an object")
        flag = hb.get("in_collective", False)
        if not isinstance(flag, bool):
            raise RankTimingError("bad_type", f"heartbeat.in_collective: expected true or false, got {_short(flag)}")
        ras = obj.get("nccl_ras")
        if ras is not None:
            if not isinstance(ras, str):
                raise RankTimingError("bad_type", f"nccl_ras: expected HOST:PORT, got {_short(ras)}")
            try:
                parse_addr(ras)
            except BadAddress as exc:
                raise RankTimingError("bad_string", f"nccl_ras: {exc}") from None
        return Heartbeat(job=job, rank=_int(obj, "rank", 0, MAX_RANK), step=_int(hb, "step", 0, MAX_STEP),
                         coll_sn=_int(hb, "coll_sn", 0, MAX_STEP, default=0), in_collective=flag,
                         ts=_seconds(obj, "ts", MAX_TS, default=now), node=node, job_id=job_id, nccl_ras=ras or "")
    group = _pairs(obj["group"], "group", 0) if obj.get("group") is not None else ()
    get = obj.get
    # The usual line decided in one test, each value as _int and _seconds accept it in their own
    # first test (a default stands for a missing key, as there); anything else goes through them
    # below, for their checks and errors.
    rank, local_rank, step, gpu = get("rank"), get("local_rank", 0), get("step"), get("gpu", -1)
    step_s, comm_s, ts = get("step_seconds"), get("comm_seconds", 0.0), get("ts", now)
    if (type(rank) is int and 0 <= rank <= MAX_RANK and type(local_rank) is int and 0 <= local_rank <= MAX_LOCAL_RANK
            and type(step) is int and 0 <= step <= MAX_STEP and type(gpu) is int and -1 <= gpu <= MAX_GPU
            and type(step_s) is float and 0.0 <= step_s <= MAX_SECONDS
            and type(comm_s) is float and 0.0 <= comm_s <= MAX_SECONDS and type(ts) is float and 0.0 <= ts <= MAX_TS):
        return RankTiming(job, rank, local_rank, step, step_s, comm_s, ts, node, gpu, group, job_id)
    return RankTiming(
        job=job,
        rank=_int(obj, "rank", 0, MAX_RANK),
        local_rank=_int(obj, "local_rank", 0, MAX_LOCAL_RANK, default=0),
        step=_int(obj, "step", 0, MAX_STEP),
        step_seconds=_seconds(obj, "step_seconds", MAX_SECONDS),
        comm_seconds=_seconds(obj, "comm_seconds", MAX_SECONDS, default=0.0),
        ts=_seconds(obj, "ts", MAX_TS, default=now),
        node=node,
        gpu=_int(obj, "gpu", -1, MAX_GPU, default=-1),
        group=group,
        job_id=job_id,
    )


def optional_keys(t: RankTiming) -> dict:
    """The keys ``to_json`` writes after ``node`` only when set, in its order (the simulator's cached lines
    write the same tail)."""
    obj: dict = {}
    if t.gpu >= 0:
        obj["gpu"] = t.gpu
    if t.group:
        obj["group"] = dict(t.group)
    if t.job_id:
        obj["job_id"] = t.job_id
    return obj


def to_json(t: RankTiming) -> str:
    obj = {"job": t.job, "rank": t.rank, "local_rank": t.local_rank, "step": t.step,
           "step_seconds": t.step_seconds, "comm_seconds": t.comm_seconds, "ts": t.ts}
    if t.node:
        obj["node"] = t.node
    obj.update(optional_keys(t))
    return json.dumps(obj, separators=(",", ":"))


def heartbeat_json(h: Heartbeat) -> str:
    obj: dict = {"job": h.job, "rank": h.rank,
                 "heartbeat": {"step": h.step, "coll_sn": h.coll_sn, "in_collective": h.in_collective}, "ts": h.ts}
    if h.job_id:
        obj["job_id"] = h.job_id
    if h.node:
        obj["node"] = h.node
    if h.nccl_ras:
        obj["nccl_ras"] = h.nccl_ras
    return json.dumps(obj, separators=(",", ":"))
