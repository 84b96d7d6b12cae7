"""The encoder builds its messages in place (``add()``, issue 39): the bytes must be exactly those of
messages built field by field and appended, the form the codec had before, so an agent of either
version is read the same by the aggregator."""

from __future__ import annotations

from fabricmon.batch import NodeBatch
from fabricmon.model import CounterDelta, Sample
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.proto.codec import COUNTER, GAUGE, SeriesDecoder, SeriesEncoder
from fabricmon.rank_timing import Heartbeat, JobLayout, RankTiming

PORT = (("device", "mlx5_0"), ("port", "1"))


def _batch(seq: int) -> NodeBatch:
    return NodeBatch(
        node="node-000", seq=seq, ts=1000.0 + seq, interval_seconds=1.0,
        deltas=(CounterDelta("fabricmon_ib_port_errors_total", (*PORT, ("counter", "symbol_error")), 3.0),
                CounterDelta("fabricmon_ib_port_errors_total", (*PORT, ("counter", "link_downed")), 0.0, False, True),
                CounterDelta("fabricmon_ib_port_data_bytes_total", (*PORT, ("direction", "rx")), 2.0**64, True)),
        gauges=(Sample("fabricmon_ib_port_state", PORT, 4.0), Sample("fabricmon_gpu_temperature_celsius",
                                                                      (("gpu", "3"),), 61.0)),
        ranks=(RankTiming("llm-70b", 17, 1, 12, 1.02, 0.2, 1000.5, gpu=1, group=(("dp", 1), ("pp", 2)),
                          job_id="4242"),
               RankTiming("llm-70b", 18, 2, 12, 1.01, 0.3, 1000.5)),
        layouts=(JobLayout("llm-70b", (("dp", 4), ("pp", 2))),),
        heartbeats=(Heartbeat("llm-70b", 17, 12, 9, True, 1000.4, job_id="4242", nccl_ras="127.0.0.1:28028"),),
    )


def _appended(b: NodeBatch, defined: bool) -> pb.Batch:
    """The same batch built message by message and appended (the codec before issue 39)."""
    out = pb.Batch(seq=b.seq, ts=b.ts, interval_seconds=b.interval_seconds)
    keys = [(d.family, d.labels) for d in b.deltas] + [(s.family, s.labels) for s in b.gauges]
    ids = {k: i + 1 for i, k in enumerate(keys)}
    gauge_keys = {(s.family, s.labels) for s in b.gauges}
    if not defined:
        for k in keys:
            labels = [pb.Label(name=n, value=v) for n, v in k[1]]
            out.new_series.append(pb.SeriesDef(id=ids[k], family=k[0], labels=labels,
                                               kind=GAUGE if k in gauge_keys else COUNTER))
    out.delta_ids.extend(ids[(d.family, d.labels)] for d in b.deltas)
    out.delta_values.extend(d.delta for d in b.deltas)
    out.saturated_ids.extend(ids[(d.family, d.labels)] for d in b.deltas if d.saturated)
    out.reset_ids.extend(ids[(d.family, d.labels)] for d in b.deltas if d.reset)
    out.gauge_ids.extend(ids[(s.family, s.labels)] for s in b.gauges)
    out.gauge_values.extend(s.value for s in b.gauges)
    for r in b.ranks:
        out.ranks.append(pb.RankTiming(job=r.job, rank=r.rank, local_rank=r.local_rank, step=r.step,
                                       step_seconds=r.step_seconds, comm_seconds=r.comm_seconds, ts=r.ts, gpu=r.gpu,
                                       job_id=r.job_id, group=[pb.IntPair(key=k, value=v) for k, v in r.group]))
    for lay in b.layouts:
        out.layouts.append(pb.JobLayout(job=lay.job, layout=[pb.IntPair(key=k, value=v) for k, v in lay.layout]))
    for h in b.heartbeats:
        out.heartbeats.append(pb.Heartbeat(job=h.job, rank=h.rank, step=h.step, coll_sn=h.coll_sn,
                                           in_collective=h.in_collective, ts=h.ts, job_id=h.job_id,
                                           nccl_ras=h.nccl_ras))
    return out


def test_encoded_bytes_equal_the_appended_form_and_decode_back():
    enc, dec = SeriesEncoder(), SeriesDecoder()
    for seq, defined in ((1, False), (2, True)):  # the first batch defines its series, the next reuses them
        b = _batch(seq)
        wire = enc.encode(b).SerializeToString()
        assert wire == _appended(b, defined).SerializeToString()
        got = dec.decode(pb.Batch.FromString(wire), "node-000")
        assert [(d.family, d.labels, d.delta, d.saturated, d.reset) for d in got.deltas if d.delta or d.reset] == \
               [(d.family, d.labels, d.delta, d.saturated, d.reset) for d in b.deltas if d.delta or d.reset]
        assert got.gauges == b.gauges and got.layouts == b.layouts
        assert [(r.job, r.rank, r.group, r.job_id) for r in got.ranks] == \
               [(r.job, r.rank, r.group, r.job_id) for r in b.ranks]
        assert [(h.job, h.rank, h.coll_sn, h.nccl_ras) for h in got.heartbeats] == \
               [(h.job, h.rank, h.coll_sn, h.nccl_ras) for h in b.heartbeats]
