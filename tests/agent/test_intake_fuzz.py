"""Property tests: any input line is either a record within the wire's bounds or a counted rejection."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fabricmon.agent.intake import RankIntake
from fabricmon.agent.nccl_records import REJECT_REASONS as NCCL_REASONS
from fabricmon.agent.nccl_records import NcclRecordError, Op
from fabricmon.agent.nccl_records import parse_line as parse_nccl_line
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.rank_timing import REJECT_REASONS, JobLayout, RankTiming, RankTimingError, parse_line

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Raw lines: arbitrary bytes, and arbitrary text (lone surrogates included, as UTF-8-encoded surrogates).
any_line = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))

# Values that sit on and beyond every wire boundary, plus the usual JSON suspects.
edge_numbers = st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63, 2**64, 10**400,
                                0.5, -0.0, 1e308, -1e308, 1e-320, 1.5, 7.0])
edge_strings = st.sampled_from(["", "j", "a" * 128, "a" * 129, "\ud800", "x\udfffy", "\x00", "tab\t", "é", "AllReduce",
                                "nan", "inf", "1e308", "0x7f"])
scalar = st.one_of(st.none(), st.booleans(), edge_numbers, st.integers(),
                   st.floats(allow_nan=False, allow_infinity=False),
                   edge_strings, st.text(max_size=20))
value = st.recursive(scalar, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(edge_strings, c, max_size=3)),
                     max_leaves=8)


def dumps(obj) -> bytes:
    # ensure_ascii keeps lone surrogates as \\u escapes, as a hostile client would send them
    return json.dumps(obj, allow_nan=False).encode()


def check_string(s: str, max_len: int) -> None:
    assert isinstance(s, str) and 0 < len(s) <= max_len
    s.encode("utf-8")  # strict: no surrogates
    assert all(c.isprintable() for c in s)


def check_rank_result(item) -> None:
    if isinstance(item, JobLayout):
        check_string(item.job, 128)
        pb.JobLayout(job=item.job, layout=[pb.IntPair(key=k, value=v) for k, v in item.layout]).SerializeToString()
        for k, _ in item.layout:
            check_string(k, 32)
        return
    assert isinstance(item, RankTiming)
    check_string(item.job, 128)
    for v in (item.step_seconds, item.comm_seconds, item.ts):
        assert math.isfinite(v) and v >= 0
    assert 0 <= item.rank < 2**32 and 0 <= item.local_rank < 2**32 and 0 <= item.step < 2**64
    assert -1 <= item.gpu < 2**31
    pb.RankTiming(job=item.job, rank=item.rank, local_rank=item.local_rank, step=item.step,
                  step_seconds=item.step_seconds, comm_seconds=item.comm_seconds, ts=item.ts, gpu=item.gpu,
                  group=[pb.IntPair(key=k, value=v) for k, v in item.group]).SerializeToString()


def parse_rank(raw: bytes) -> None:
    try:
        item = parse_line(raw, node="n", now=1.0)
    except RankTimingError as exc:
        assert exc.reason in REJECT_REASONS
        event(f"rejected: {exc.reason}")
        return
    event("accepted")
    check_rank_result(item)


@SETTINGS
@given(any_line)
def test_rank_parser_any_bytes(raw):
    parse_rank(raw)


DELETE = object()
mutant = st.one_of(edge_numbers, edge_strings, value, st.just(DELETE))
names = st.one_of(st.text(min_size=1, max_size=24), st.from_regex(r"[a-z0-9._-]{1,24}", fullmatch=True))
valid_rank_line = st.fixed_dictionaries({
    "job": names, "rank": st.integers(0, 2**32 - 1), "step": st.integers(0, 2**53 - 1),
    "step_seconds": st.floats(0, 1e6),
}, optional={
    "local_rank": st.integers(0, 2**16 - 1), "comm_seconds": st.floats(0, 1e6), "ts": st.floats(0, 1e11),
    "gpu": st.integers(-1, 1023), "node": names,
    "group": st.dictionaries(st.sampled_from(["tp", "pp", "dp"]), st.integers(0, 2**31 - 1)),
})
valid_layout_line = st.fixed_dictionaries({
    "job": names, "layout": st.dictionaries(st.sampled_from(["tp", "pp", "dp"]), st.integers(1, 2**31 - 1), min_size=1),
})


def mutate(obj: dict, mutations: list) -> dict:
    """Replace or delete fields (a path of keys) of an otherwise valid record."""
    for path, new in mutations:
        target = obj
        for k in path[:-1]:
            target = target.get(k) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            continue
        if new is DELETE:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = new
    return obj


RANK_PATHS = st.sampled_from([(k,) for k in ("job", "rank", "local_rank", "step", "step_seconds", "comm_seconds",
                                             "ts", "gpu", "node", "group", "layout")] + [("group", "tp"),
                                                                                         ("layout", "tp")])


@SETTINGS
@given(st.one_of(valid_rank_line, valid_layout_line), st.lists(st.tuples(RANK_PATHS, mutant), max_size=2))
def test_rank_parser_structured(obj, mutations):
    parse_rank(dumps(mutate(obj, mutations)))


@SETTINGS
@given(st.lists(st.binary(max_size=120), max_size=8))
def test_intake_counts_every_line(chunks):
    it = RankIntake("n")
    body = b"\n".join(chunks)
    acc, rej, _ = it.submit_lines(body)
    lines = [c for c in body.split(b"\n") if c.strip()]
    assert acc + rej == len(lines)
    stats = it.stats()
    assert stats["accepted_total"] == acc and stats["rejected_total"] == rej


def check_nccl(raw: bytes) -> None:
    try:
        r = parse_nccl_line(raw)
    except NcclRecordError as exc:
        assert exc.reason in NCCL_REASONS
        event(f"rejected: {exc.reason}")
        return
    event("accepted")
    assert isinstance(r, Op)
    check_string(r.header.comm, 64)
    assert 0 <= int(r.header.rank) < 2**32
    if r.header.comm_name:
        check_string(r.header.comm_name, 128)
    check_string(r.name, 64)
    assert r.peer == "" or 0 <= int(r.peer) < 2**32
    for v in (r.exec_us, r.size_bytes, r.busbw_gbs):
        assert v is None or (math.isfinite(v) and v >= 0)


@SETTINGS
@given(any_line)
def test_nccl_parser_any_bytes(raw):
    check_nccl(raw)


valid_nccl_record = st.fixed_dictionaries({
    "header": st.fixed_dictionaries({"id": st.one_of(names, st.integers(0, 2**64 - 1)),
                                     "rank": st.integers(0, 2**32 - 1),
                                     "n_ranks": st.integers(1, 8)}),
    "coll_perf": st.fixed_dictionaries({"coll": names}, optional={
        "coll_sn": st.integers(0, 2**40), "coll_msg_size_bytes": st.integers(0, 2**48),
        "coll_exec_time_us": st.one_of(st.floats(0, 1e12), st.just("nan")),
        "coll_busbw_gbs": st.one_of(st.floats(0, 1e6), st.just("nan")), "coll_timing_source": st.just("kernel_gpu")}),
})
NCCL_PATHS = st.sampled_from([("header",), ("coll_perf",), ("header", "id"), ("header", "rank"), ("coll_perf", "coll"),
                              ("coll_perf", "coll_msg_size_bytes"), ("coll_perf", "coll_exec_time_us"),
                              ("coll_perf", "coll_busbw_gbs")])


@SETTINGS
@given(valid_nccl_record, st.lists(st.tuples(NCCL_PATHS, mutant), max_size=2))
def test_nccl_parser_structured(obj, mutations):
    check_nccl(dumps(mutate(obj, mutations)))
