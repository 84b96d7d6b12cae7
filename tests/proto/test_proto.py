"""Wire format: checked-in stubs are current, and the codec round-trips and validates."""

from __future__ import annotations

import struct

import pytest

from fabricmon.batch import NodeBatch
from fabricmon.model import CounterDelta, Sample
from fabricmon.proto import codec, generate
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.rank_timing import JobLayout, RankTiming

P = (("device", "mlx5_3"), ("port", "1"))


def _batch(seq: int = 7) -> NodeBatch:
    return NodeBatch(
        node="node-017", seq=seq, ts=1764000000.5, interval_seconds=1.0,
        deltas=(CounterDelta("fabricmon_ib_port_errors_total", P + (("counter", "symbol_error"),), 12.0,
                             saturated=True),
                CounterDelta("fabricmon_ib_port_receive_bytes_total", P, 4.0e9),
                CounterDelta("fabricmon_rdma_hw_stat_total", P + (("counter", "out_of_sequence"),), 3.0, reset=True)),
        gauges=(Sample("fabricmon_ib_port_state", P, 4.0), Sample("fabricmon_host_load1", (), 0.25)),
        ranks=(RankTiming("llm-7b", 17, 1, 1200, 1.82, 0.41, 1764000000.5, node="node-017", gpu=-1,
                          group=(("tp", 0), ("pp", 2), ("dp", 5))),),
        layouts=(JobLayout("llm-7b", (("tp", 8), ("pp", 4), ("dp", 64))),),
    )


def test_checked_in_stubs_match_regeneration():
    pytest.importorskip("grpc_tools")
    assert generate.main(["--check"]) == 0


def test_generated_grpc_module_imports_relatively():
    from fabricmon.proto import fabricmon_pb2_grpc

    src = open(fabricmon_pb2_grpc.__file__).read()
    assert "from . import fabricmon_pb2" in src
    assert fabricmon_pb2_grpc.GRPC_GENERATED_VERSION == generate.GRPCIO_TOOLS_VERSION


@pytest.mark.parametrize("self_contained", [False, True])
def test_round_trip_through_bytes(self_contained):
    b = _batch()
    enc = codec.SeriesEncoder().encode(b, self_contained=self_contained)
    wire = pb.Batch.FromString(enc.SerializeToString())
    assert codec.SeriesDecoder().decode(wire, "node-017") == b


def test_series_defined_once_per_connection():
    enc, dec = codec.SeriesEncoder(), codec.SeriesDecoder()
    first = enc.encode(_batch(1))
    second = enc.encode(_batch(2))
    assert len(first.new_series) == 5 and len(second.new_series) == 0
    assert dec.decode(first, "node-017") == _batch(1)
    assert dec.decode(second, "node-017") == _batch(2)
    # a fresh connection (new decoder) does not know the ids
    with pytest.raises(codec.MalformedBatch, match="unknown series id"):
        codec.SeriesDecoder().decode(second, "node-017")


def test_self_contained_batch_leaves_connection_table_alone():
    enc, dec = codec.SeriesEncoder(), codec.SeriesDecoder()
    dec.decode(enc.encode(_batch(1)), "node-017")
    other = NodeBatch("node-017", 2, 2.0, 1.0, gauges=(Sample("fabricmon_host_load1", (("x", "y"),), 1.0),))
    sc = codec.encode_self_contained(other)  # id 1 here means something else
    assert dec.decode(sc, "node-017") == other
    assert dec.decode(enc.encode(_batch(3)), "node-017") == _batch(3)  # table unchanged


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: m.delta_ids.append(99), "differ in length"),
    (lambda m: (m.delta_ids.append(99), m.delta_values.append(1.0)), "unknown series id 99"),
    (lambda m: m.saturated_ids.append(4), "no delta"),
    (lambda m: m.new_series.append(pb.SeriesDef(id=1, family="other")), "redefined"),
    (lambda m: setattr(m, "seq", 0), "seq"),
    (lambda m: m.delta_values.__setitem__(0, float("nan")), "bad delta"),
])
def test_malformed_batches_are_refused_with_a_reason(mutate, reason):
    m = codec.encode_self_contained(_batch())
    mutate(m)
    with pytest.raises(codec.MalformedBatch, match=reason):
        codec.SeriesDecoder().decode(m, "node-017")


def test_hello_round_trip_and_version_check():
    from fabricmon.batch import NicHello, NodeHello

    h = NodeHello("node-017", "0.1.0", 1.0, (NicHello("mlx5_3", "1", "3", "InfiniBand", "ib3", 400.0, 4, 3),), 8,
                  "boot")
    assert codec.hello_from_pb(pb.Hello.FromString(codec.hello_to_pb(h).SerializeToString())) == h
    bad = codec.hello_to_pb(h)
    bad.protocol_version = 99
    with pytest.raises(codec.MalformedBatch, match="protocol_version"):
        codec.hello_from_pb(bad)


def test_framing_without_reparse():
    inner = codec.encode_self_contained(_batch()).SerializeToString()
    msg = pb.AgentMessage.FromString(codec.agent_message_from_batch_bytes(inner))
    assert msg.WhichOneof("msg") == "batch" and msg.batch.SerializeToString() == inner


def test_decoder_counts_but_does_not_build_unread_families():
    """Deltas of families the consumer does not read are counted, flagged ones are always built."""
    from fabricmon.batch import NodeBatch
    from fabricmon.model import CounterDelta
    from fabricmon.proto.codec import SeriesDecoder, SeriesEncoder

    port = (("device", "mlx5_0"), ("port", "1"))
    deltas = (CounterDelta("fabricmon_ib_port_receive_bytes_total", port, 5e9),
              CounterDelta("fabricmon_ib_port_errors_total", port + (("counter", "symbol_error"),), 3.0),
              CounterDelta("fabricmon_ib_port_errors_total", port + (("counter", "port_rcv_errors"),), 0.0),
              CounterDelta("fabricmon_ib_port_transmit_bytes_total", port, 0.0, reset=True))
    enc = SeriesEncoder()
    dec = SeriesDecoder(read_families=frozenset({"fabricmon_ib_port_errors_total"}))
    full = SeriesDecoder()
    for seq in (1, 2):
        m = enc.encode(NodeBatch("n1", seq, float(seq), 1.0, deltas))
        got = dec.decode(m, "n1")
        assert [(d.family, d.delta, d.reset) for d in got.deltas] == [
            ("fabricmon_ib_port_errors_total", 3.0, False), ("fabricmon_ib_port_errors_total", 0.0, False),
            ("fabricmon_ib_port_transmit_bytes_total", 0.0, True)]
        assert got.unread_deltas == 1
        assert full.decode(m, "n1").deltas == deltas


def test_retired_settings_field_is_reserved_and_ignored():
    # AggregatorMessage field 2 was ``Settings settings`` (double interval_seconds = 1), never sent by
    # an aggregator and now reserved: bytes in that old shape parse to a message with nothing set.
    assert 2 not in pb.AggregatorMessage.DESCRIPTOR.fields_by_number
    assert "settings" not in pb.AggregatorMessage.DESCRIPTOR.fields_by_name
    # tag 2 length-delimited, 9 bytes: tag 1 fixed64, the double 5.0
    old = bytes([0x12, 0x09, 0x09]) + struct.pack("<d", 5.0)
    msg = pb.AggregatorMessage.FromString(old)
    assert msg.WhichOneof("msg") is None
    assert pb.AggregatorMessage.FromString(pb.AggregatorMessage(ack=pb.Ack(seq=7)).SerializeToString()).ack.seq == 7
