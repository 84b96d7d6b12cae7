"""SeriesDef.kind: the agent says what a series is, and the aggregator holds every batch to it."""

from __future__ import annotations

import pytest

from fabricmon.batch import NodeBatch
from fabricmon.model import CounterDelta, Sample
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.proto.codec import MalformedBatch, SeriesDecoder, SeriesEncoder

LAB = (("device", "bnxt_re0"), ("port", "1"), ("counter", "active_qps"))


def _batch(seq: int, deltas=(), gauges=()) -> NodeBatch:
    return NodeBatch("n1", seq, 100.0 + seq, 1.0, tuple(deltas), tuple(gauges))


def test_encoder_defines_deltas_as_counters_and_gauges_as_gauges() -> None:
    m = SeriesEncoder().encode(_batch(1, [CounterDelta("fabricmon_rdma_hw_stat_total", LAB, 3.0)],
                                      [Sample("fabricmon_rdma_hw_stat_level", LAB, 17.0)]))
    kinds = {sd.family: sd.kind for sd in m.new_series}
    assert kinds == {"fabricmon_rdma_hw_stat_total": pb.SERIES_KIND_COUNTER,
                     "fabricmon_rdma_hw_stat_level": pb.SERIES_KIND_GAUGE}
    got = SeriesDecoder().decode(m, "n1")
    assert [d.delta for d in got.deltas] == [3.0] and [g.value for g in got.gauges] == [17.0]


def _def(sid: int, family: str, kind: int) -> pb.SeriesDef:
    return pb.SeriesDef(id=sid, family=family, labels=[pb.Label(name=k, value=v) for k, v in LAB], kind=kind)


def test_a_delta_of_a_gauge_series_is_malformed_so_a_fall_cannot_become_a_reset() -> None:
    dec = SeriesDecoder()
    dec.decode(pb.Batch(seq=1, ts=1.0, new_series=[_def(1, "fabricmon_rdma_hw_stat_level", pb.SERIES_KIND_GAUGE)],
                        gauge_ids=[1], gauge_values=[50.0]), "n1")
    bad = pb.Batch(seq=2, ts=2.0, delta_ids=[1], delta_values=[40.0], reset_ids=[1])
    with pytest.raises(MalformedBatch, match="delta_ids: series fabricmon_rdma_hw_stat_level is a gauge"):
        dec.decode(bad, "n1")
    # defined and misused in the same batch, and in a self-contained (spooled) one
    for sc in (False, True):
        with pytest.raises(MalformedBatch, match="is a gauge"):
            SeriesDecoder().decode(pb.Batch(
                seq=3, ts=3.0, self_contained=sc, new_series=[_def(5, "x_gauge", pb.SERIES_KIND_GAUGE)],
                delta_ids=[5], delta_values=[1.0]), "n1")


def test_a_gauge_value_of_a_counter_series_and_a_changed_kind_are_malformed() -> None:
    dec = SeriesDecoder()
    dec.decode(pb.Batch(seq=1, ts=1.0, new_series=[_def(1, "c_total", pb.SERIES_KIND_COUNTER)],
                        delta_ids=[1], delta_values=[1.0]), "n1")
    with pytest.raises(MalformedBatch, match="gauge_ids: series c_total is a counter"):
        dec.decode(pb.Batch(seq=2, ts=2.0, gauge_ids=[1], gauge_values=[5.0]), "n1")
    with pytest.raises(MalformedBatch, match="kind redefined"):
        dec.decode(pb.Batch(seq=3, ts=3.0, new_series=[_def(1, "c_total", pb.SERIES_KIND_GAUGE)]), "n1")
    with pytest.raises(MalformedBatch, match="unknown kind"):
        SeriesDecoder().decode(pb.Batch(seq=1, ts=1.0, new_series=[_def(2, "y", 9)]), "n1")


def test_an_agent_older_than_the_field_is_taken_as_before() -> None:
    dec = SeriesDecoder()
    m = pb.Batch(seq=1, ts=1.0, new_series=[_def(1, "a_total", pb.SERIES_KIND_UNSPECIFIED),
                                             _def(2, "b", pb.SERIES_KIND_UNSPECIFIED)],
                 delta_ids=[1], delta_values=[2.0], reset_ids=[1], gauge_ids=[2], gauge_values=[7.0])
    got = dec.decode(m, "n1")
    assert got.deltas[0].reset and got.gauges[0].value == 7.0
