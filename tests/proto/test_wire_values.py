"""Every value on the wire is checked for finiteness and range at decode, gauges included
(issue 26: a NaN or infinite gauge from a peer got past the codec, which checked deltas only)."""

from __future__ import annotations

import math

import pytest

from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb

GAUGE = pb.SeriesDef(id=1, family="fabricmon_ib_port_state", labels=[pb.Label(name="device", value="mlx5_0")])


def _batch(**kw) -> pb.Batch:
    return pb.Batch(seq=1, ts=1.0e9, interval_seconds=1.0, **kw)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_gauge_refused_with_its_series_named(bad):
    dec = codec.SeriesDecoder()
    m = _batch(new_series=[GAUGE], gauge_ids=[1], gauge_values=[bad])
    with pytest.raises(codec.MalformedBatch, match="gauge_values: series fabricmon_ib_port_state has a non-finite"):
        dec.decode(m, "node-000")
    assert len(dec) == 0  # the table is untouched by a refused batch
    # the next, honest batch on the same connection decodes
    ok = dec.decode(_batch(new_series=[GAUGE], gauge_ids=[1], gauge_values=[4.0]), "node-000")
    assert [g.value for g in ok.gauges] == [4.0]


def _rank(**kw) -> pb.RankTiming:
    base = dict(job="llm-7b", rank=0, step=10, step_seconds=1.0, comm_seconds=0.1, ts=1.0e9)
    base.update(kw)
    return pb.RankTiming(**base)


@pytest.mark.parametrize("field,value", [
    ("step", 2**53), ("step", 2**64 - 1), ("step_seconds", -1.0), ("step_seconds", 1e300),
    ("comm_seconds", -0.5), ("ts", -5.0), ("ts", 1e15), ("gpu", 5000), ("gpu", -7), ("local_rank", 2**20),
])
def test_rank_values_out_of_range_refused(field, value):
    with pytest.raises(codec.MalformedBatch, match="out of range"):
        codec.SeriesDecoder().decode(_batch(ranks=[_rank(**{field: value})]), "node-000")


def test_rank_group_and_layout_values_in_range():
    dec = codec.SeriesDecoder()
    with pytest.raises(codec.MalformedBatch, match="group value out of range"):
        dec.decode(_batch(ranks=[_rank(group=[pb.IntPair(key="dp", value=-1)])]), "node-000")
    with pytest.raises(codec.MalformedBatch, match="layout value out of range"):
        dec.decode(_batch(layouts=[pb.JobLayout(job="j", layout=[pb.IntPair(key="tp", value=0)])]), "node-000")
    good = dec.decode(_batch(ranks=[_rank(step=2**53 - 1, group=[pb.IntPair(key="dp", value=3)])]), "node-000")
    assert good.ranks[0].step == 2**53 - 1


@pytest.mark.parametrize("nic,match", [
    (pb.Nic(device="mlx5_0", rate_gbps=math.nan), "rate_gbps"),
    (pb.Nic(device="mlx5_0", rate_gbps=-400.0), "rate_gbps"),
    (pb.Nic(device="mlx5_0", rate_gbps=400.0, width=10_000), "width"),
    (pb.Nic(device="mlx5_0", rate_gbps=400.0, gpu=-9), "gpu"),
])
def test_hello_values_in_range(nic, match):
    m = pb.Hello(node="node-000", protocol_version=codec.PROTOCOL_VERSION, interval_seconds=1.0, nics=[nic])
    with pytest.raises(codec.MalformedBatch, match=match):
        codec.hello_from_pb(m)
    m = pb.Hello(node="node-000", protocol_version=codec.PROTOCOL_VERSION, gpus=2**31)
    with pytest.raises(codec.MalformedBatch, match="hello.gpus"):
        codec.hello_from_pb(m)


@pytest.mark.parametrize("field", ["step_seconds", "comm_seconds", "ts"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rank_times_not_finite_refused_as_such(field, bad):
    # the decoder judges the usual in-range case with one comparison chain; a NaN or an infinity must
    # still be named for what it is, not as out of range
    with pytest.raises(codec.MalformedBatch, match="non-finite time"):
        codec.SeriesDecoder().decode(_batch(ranks=[_rank(**{field: bad})]), "node-000")


def test_job_names_checked_on_every_batch_not_only_the_first():
    # valid job names are remembered (one check per process): a bad one never is, whichever field it is in
    dec = codec.SeriesDecoder()
    assert dec.decode(_batch(ranks=[_rank(job="llm-7b", job_id="slurm-1")]), "node-000").ranks[0].job == "llm-7b"
    for _ in range(2):
        with pytest.raises(codec.MalformedBatch, match="ranks.job:"):
            dec.decode(_batch(ranks=[_rank(job="llm\u202e7b")]), "node-000")
        with pytest.raises(codec.MalformedBatch, match="ranks.job_id:"):
            dec.decode(_batch(ranks=[_rank(job_id="x" * 129)]), "node-000")
        with pytest.raises(codec.MalformedBatch, match="heartbeats.job:"):
            dec.decode(_batch(heartbeats=[pb.Heartbeat(job="llm-7b", job_id="bad\x00id", ts=1.0e9)]), "node-000")
        with pytest.raises(codec.MalformedBatch, match="layouts.job:"):
            dec.decode(_batch(layouts=[pb.JobLayout(job="", layout=[pb.IntPair(key="tp", value=2)])]), "node-000")
