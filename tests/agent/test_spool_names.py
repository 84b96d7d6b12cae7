"""Spool entries named outside the seq range are set aside and counted; numbering never starts
from them (issue 26: a name past 2^64 made every later batch unencodable, a far-future one made
every batch ``seq_ahead`` at the aggregator)."""

from __future__ import annotations

import os

from fabricmon.agent.spool import FUTURE_SLACK_MS, Spool, frame
from fabricmon.agent.stream import StreamClient

NOW = 1_764_000_000.0  # the spool's wall clock in these tests
NOW_MS = int(NOW * 1000)


def _entry(d, seq: int, payload: bytes = b"x") -> str:
    name = f"{seq:020d}.batch"
    (d / name).write_bytes(frame(payload))
    return name


def test_out_of_range_names_set_aside_counted_and_never_numbered_from(tmp_path):
    d = tmp_path / "spool"
    d.mkdir()
    good = [_entry(d, NOW_MS - 5_000), _entry(d, NOW_MS - 4_000)]
    past_u64 = _entry(d, 2**64)  # 20 digits: matches the entry pattern
    far_future = _entry(d, NOW_MS + 10 * 365 * 86_400_000)
    zero = _entry(d, 0)
    sp = Spool(d, 1 << 20, fsync=False, wall=lambda: NOW)
    assert sp.seqs() == [NOW_MS - 5_000, NOW_MS - 4_000]
    assert sp.max_seq == NOW_MS - 4_000
    assert sp.stats()["set_aside_total"] == 3
    names = set(os.listdir(d))
    assert set(good) <= names
    for bad in (past_u64, far_future, zero):
        assert bad not in names and f"set-aside-{bad}" in names  # kept for whoever looks, out of the way
    # a restart does not count them again
    again = Spool(d, 1 << 20, fsync=False, wall=lambda: NOW)
    assert again.stats()["set_aside_total"] == 0 and again.seqs() == sp.seqs()


def test_just_ahead_of_the_clock_is_kept(tmp_path):
    d = tmp_path / "spool"
    d.mkdir()
    _entry(d, NOW_MS + FUTURE_SLACK_MS)
    _entry(d, NOW_MS + FUTURE_SLACK_MS + 1)
    sp = Spool(d, 1 << 20, fsync=False, wall=lambda: NOW)
    assert sp.seqs() == [NOW_MS + FUTURE_SLACK_MS] and sp.stats()["set_aside_total"] == 1


def test_stream_numbers_from_the_clock_not_from_a_set_aside_name(tmp_path):
    d = tmp_path / "spool"
    d.mkdir()
    _entry(d, 2**64)
    sp = Spool(d, 1 << 20, fsync=False)
    client = StreamClient("127.0.0.1:9", "node-000", spool=sp)
    st = client.stats()
    assert st["next_seq"] < 2**64 - 1 and st["spool_set_aside_total"] == 1
