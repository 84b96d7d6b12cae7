"""benchmarks/bench_soak.py's resend bookkeeping (the node side of a restarted shard): an agent
resends from the aggregator's last ack, seqs unchanged, and an ack is the oldest unacked seq."""

from __future__ import annotations

import sys

from support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from bench_soak import Resend  # noqa: E402


def test_acks_in_order_pop_the_oldest():
    r = Resend()
    for s in (11, 12, 13):
        r.add(s, f"b{s}")
    r.acked(11)
    r.acked(12)
    assert [s for s, _ in r.pending] == [13]
    assert (r.acked_total, r.out_of_order, r.last_acked) == (2, 0, 12)


def test_an_ack_that_is_not_the_oldest_counts_as_out_of_order():
    r = Resend()
    for s in (1, 2, 3):
        r.add(s, None)
    r.acked(2)
    assert r.out_of_order == 1
    assert [s for s, _ in r.pending] == [1, 2, 3]


def test_reconnect_to_a_process_that_forgot_everything_resends_every_unacked_batch():
    r = Resend()
    for s in (5, 6, 7, 8):
        r.add(s, f"b{s}")
    r.acked(5)
    again = r.reconnected(0)  # a restarted aggregator: its hello ack is 0
    assert [s for s, _ in again] == [6, 7, 8]  # seqs unchanged, in order
    assert [b for _, b in again] == ["b6", "b7", "b8"]
    assert r.resent == 3
    for s in (6, 7, 8):
        r.acked(s)
    assert not r.pending and r.out_of_order == 0


def test_reconnect_drops_what_the_aggregator_already_has():
    r = Resend()
    for s in (5, 6, 7, 8):
        r.add(s, None)
    # 6 was ingested but its ack was lost with the old stream: the hello ack says so
    again = r.reconnected(6)
    assert [s for s, _ in again] == [7, 8]
    assert r.acked_total == 2 and r.resent == 2
