"""``batch.DeltaColumns``: the simulator's deltas as columns (issue 39).  The stream encoder reads the
columns without making a ``CounterDelta`` per delta: the bytes must be exactly those of the same batch
with its deltas as a tuple, on a fresh series table and on one that already holds the series; and read
any other way the columns are that tuple."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from fabricmon.batch import DeltaColumns, NodeBatch
from fabricmon.model import CounterDelta
from fabricmon.proto.codec import SeriesEncoder

PORT = (("device", "mlx5_0"), ("port", "1"))
DELTAS = (CounterDelta("fabricmon_ib_port_errors_total", (*PORT, ("counter", "symbol_error")), 3.0),
          CounterDelta("fabricmon_ib_port_errors_total", (*PORT, ("counter", "link_downed")), 1.0, False, True),
          CounterDelta("fabricmon_ib_port_data_bytes_total", (*PORT, ("direction", "rx")), 2.0**64, True),
          CounterDelta("fabricmon_ib_port_data_bytes_total", (*PORT, ("direction", "tx")), 5.5, True, True))


def _columns(deltas: tuple[CounterDelta, ...]) -> DeltaColumns:
    return DeltaColumns([(d.family, d.labels) for d in deltas], [d.delta for d in deltas],
                        [d.saturated for d in deltas], [d.reset for d in deltas])


def _batch(seq: int, deltas) -> NodeBatch:
    return NodeBatch(node="node-000", seq=seq, ts=1000.0 + seq, interval_seconds=1.0, deltas=deltas)


@pytest.mark.parametrize("deltas", [DELTAS, DELTAS[:2], DELTAS[2:], DELTAS[::-1]])
def test_columns_encode_to_the_bytes_of_the_tuple(deltas):
    as_tuple, as_columns = SeriesEncoder(), SeriesEncoder()
    for seq in (1, 2):  # first the series defined, then only their ids
        want = as_tuple.encode(_batch(seq, deltas)).SerializeToString()
        got = as_columns.encode(_batch(seq, _columns(deltas))).SerializeToString()
        assert got == want


def test_columns_read_as_the_tuple_they_describe():
    cols = _columns(DELTAS)
    assert len(cols) == 4 and cols[1] == DELTAS[1] and cols[1:] == DELTAS[1:]
    assert tuple(cols) == DELTAS and list(cols) == list(DELTAS)
    assert cols == DELTAS and DELTAS == cols and cols == _columns(DELTAS) and cols != DELTAS[:3]
    assert hash(cols) == hash(DELTAS) and repr(cols) == repr(DELTAS)
    assert cols + DELTAS[:1] == DELTAS + DELTAS[:1] and DELTAS[:1] + cols == DELTAS[:1] + DELTAS
    assert pickle.loads(pickle.dumps(cols)) == DELTAS
    b = _batch(1, cols)
    assert b == _batch(1, DELTAS) and hash(b) == hash(_batch(1, DELTAS))
    assert dataclasses.replace(b, seq=2).deltas is cols


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="different lengths"):
        DeltaColumns([("f", ())], [1.0, 2.0], [False], [False])
