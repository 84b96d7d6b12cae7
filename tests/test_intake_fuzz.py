"""Property tests: any input line is either a record within the wire's bounds or a counted rejection."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricmon.agent.intake import RankIntake
from fabricmon.agent.nccl_inspector import REJECT_REASONS as NCCL_REASONS
from fabricmon.agent.nccl_inspector import NcclRecord, NcclRecordError, parse_record
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.rank_timing import REJECT_REASONS, JobLayout, RankTiming, RankTimingError, parse_line

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Values that sit on and beyond every wire boundary, plus the usual JSON suspects.
edge_numbers = st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63, 2**64, 10**400,
                                0.5, -0.0, 1e308, -1e308, 1e-320, 1.5, 7.0])
edge_strings = st.sampled_from(["", "j", "a" * 128, "a" * 129, "\ud800", "x\udfffy", "\x00", "tab\t", "é", "AllReduce",
                                "nan", "inf", "1e308", "0x7f"])
scalar = st.one_of(st.none(), st.booleans(), edge_numbers, st.integers(), st.floats(allow_nan=False),
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
        return
    check_rank_result(item)


@SETTINGS
@given(st.binary(max_size=300))
def test_rank_parser_any_bytes(raw):
    parse_rank(raw)


@SETTINGS
@given(st.fixed_dictionaries({}, optional={
    "job": st.one_of(edge_strings, value), "rank": st.one_of(edge_numbers, value),
    "local_rank": st.one_of(edge_numbers, value), "step": st.one_of(edge_numbers, value),
    "step_seconds": st.one_of(edge_numbers, value), "comm_seconds": st.one_of(edge_numbers, value),
    "ts": st.one_of(edge_numbers, value), "gpu": st.one_of(edge_numbers, value), "node": value,
    "group": st.one_of(st.dictionaries(edge_strings, edge_numbers, max_size=4), value),
    "layout": st.one_of(st.dictionaries(edge_strings, edge_numbers, max_size=4), value),
}))
def test_rank_parser_structured(obj):
    parse_rank(dumps(obj))


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
        r = parse_record(raw)
    except NcclRecordError as exc:
        assert exc.reason in NCCL_REASONS
        return
    assert isinstance(r, NcclRecord)
    check_string(r.comm, 64)
    check_string(r.coll, 64)
    assert 0 <= r.rank < 2**32
    for v in (r.exec_us, r.size_bytes, r.busbw_gbs):
        assert v is None or (math.isfinite(v) and v >= 0)


@SETTINGS
@given(st.binary(max_size=300))
def test_nccl_parser_any_bytes(raw):
    check_nccl(raw)


@SETTINGS
@given(st.fixed_dictionaries({}, optional={
    "header": st.one_of(st.fixed_dictionaries({}, optional={"id": st.one_of(edge_strings, value),
                                                            "rank": st.one_of(edge_numbers, value)}), value),
    "coll_perf": st.one_of(st.fixed_dictionaries({}, optional={
        "coll": st.one_of(edge_strings, value), "coll_msg_size_bytes": st.one_of(edge_numbers, edge_strings, value),
        "coll_exec_time_us": st.one_of(edge_numbers, edge_strings, value),
        "coll_busbw_gbs": st.one_of(edge_numbers, edge_strings, value)}), value),
}))
def test_nccl_parser_structured(obj):
    check_nccl(dumps(obj))
