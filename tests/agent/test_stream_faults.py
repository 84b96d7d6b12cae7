"""The stream client against values the wire cannot carry and aggregators that misbehave.

A rank timing, series or delta that cannot be encoded (out of its protobuf field's
range, a lone surrogate, a value the aggregator would reject) costs that one item,
counted by reason; never the batch, the session or the stream thread.  An ack the
agent cannot honour (beyond what it sent, or a high-water mark at the end of the
seq range) is refused and counted; it never deletes spooled batches nor kills the
thread.  Real gRPC on 127.0.0.1.
"""

from __future__ import annotations

import math
import threading
from concurrent import futures

import grpc
import pytest

from fabricmon.agent.spool import Spool
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.model import CounterDelta, Sample
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.rank_timing import JobLayout, RankTiming
from support.net import free_port
from support.streamrig import P, RecordingEngine, client, snap
from support.waiting import wait_until

pytestmark = pytest.mark.integration

U64_MAX = 2**64 - 1
GOOD = RankTiming("llm-7b", 3, 3, 10, 1.5, 0.25, 1001.0, node="node-001")


class ListIntake:
    """An intake that hands out whatever the test queued (the stream must survive any of it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ranks: list = []
        self.layouts_: list = []

    def put(self, ranks=(), layouts=()) -> None:
        with self.lock:
            self.ranks.extend(ranks)
            self.layouts_.extend(layouts)

    def drain(self):
        with self.lock:
            r, lay = self.ranks, self.layouts_
            self.ranks, self.layouts_ = [], []
        return r, lay

    def layouts(self):
        return []


BAD_RANKS = {
    "rank_2^32": RankTiming("j", 2**32, 0, 1, 1.0, 0.0, 1001.0),
    "local_rank_negative": RankTiming("j", 1, -1, 1, 1.0, 0.0, 1001.0),
    "step_2^64": RankTiming("j", 1, 0, 2**64, 1.0, 0.0, 1001.0),
    "gpu_2^31": RankTiming("j", 1, 0, 1, 1.0, 0.0, 1001.0, gpu=2**31),
    "group_2^63": RankTiming("j", 1, 0, 1, 1.0, 0.0, 1001.0, group=(("tp", 2**63),)),
    "job_lone_surrogate": RankTiming("j\ud800", 1, 0, 1, 1.0, 0.0, 1001.0),
    "group_key_surrogate": RankTiming("j", 1, 0, 1, 1.0, 0.0, 1001.0, group=(("\udcff", 1),)),
    "job_empty": RankTiming("", 1, 0, 1, 1.0, 0.0, 1001.0),
    "job_too_long": RankTiming("j" * 129, 1, 0, 1, 1.0, 0.0, 1001.0),
    "step_seconds_nan": RankTiming("j", 1, 0, 1, math.nan, 0.0, 1001.0),
    "ts_inf": RankTiming("j", 1, 0, 1, 1.0, 0.0, math.inf),
    "rank_float": RankTiming("j", 1.5, 0, 1, 1.0, 0.0, 1001.0),  # type: ignore[arg-type]
}
BAD_LAYOUTS = {
    "layout_2^63": JobLayout("j", (("tp", 2**63),)),
    "layout_job_surrogate": JobLayout("\ud834", (("tp", 8),)),
}


def _stream_thread_alive(c) -> bool:
    return c._thread is not None and c._thread.is_alive()


@pytest.mark.parametrize("bad", sorted(BAD_RANKS))
def test_unencodable_rank_while_down_costs_one_item_not_the_thread(tmp_path, engine_factory, bad):
    """The issue's case: the aggregator is unreachable and a rank line out of the wire's range arrives."""
    port = free_port()
    intake = ListIntake()
    c = client(f"127.0.0.1:{port}", intake=intake, spool=Spool(tmp_path / "spool", 1 << 20)).start()
    srv = None
    try:
        intake.put([BAD_RANKS[bad], GOOD])
        c.offer(snap(1))
        assert wait_until(lambda: len(c.spool) == 1)
        for i in range(2, 4):
            c.offer(snap(i))
        assert wait_until(lambda: len(c.spool) == 3), c.stats()
        assert _stream_thread_alive(c)
        st = c.stats()
        assert st["items_dropped"]["rank"] == 1 and st["items_dropped_total"] == 1
        engine = engine_factory()
        srv = start_grpc_server(engine, f"127.0.0.1:{port}")
        assert wait_until(lambda: len(engine.batches) == 3, 15)
    finally:
        c.stop()
        if srv:
            srv.stop(0.5)
    b = engine.batches
    assert [x.ts for x in b] == [1001.0, 1002.0, 1003.0]
    assert b[0].ranks == (GOOD,)  # the good line of the same poll still arrives
    assert b[0].deltas == snap(1).deltas  # and that poll's deltas


@pytest.mark.parametrize("bad", sorted(BAD_RANKS) + sorted(BAD_LAYOUTS))
def test_unencodable_item_while_connected_keeps_the_session_and_the_deltas(engine, server, bad):
    intake = ListIntake()
    c = client(server.address, intake=intake).start()
    try:
        assert wait_until(lambda: c.connected)
        if bad in BAD_RANKS:
            intake.put([BAD_RANKS[bad], GOOD])
        else:
            intake.put([GOOD], [BAD_LAYOUTS[bad], JobLayout("ok", (("tp", 2),))])
        c.offer(snap(1))
        c.offer(snap(2))
        assert wait_until(lambda: len(engine.batches) == 2), c.stats()
        st = c.stats()
    finally:
        c.stop()
    assert st["connects_total"] == 1 and st["items_dropped_total"] == 1, st
    assert engine.batches[0].deltas == snap(1).deltas
    assert engine.batches[0].ranks == (GOOD,)
    if bad in BAD_LAYOUTS:
        assert engine.batches[0].layouts == (JobLayout("ok", (("tp", 2),)),)


def test_bad_series_and_delta_cost_only_themselves(engine, server):
    from fabricmon.model import Snapshot

    c = client(server.address).start()
    bad_label = (("device", "x" * 2000), ("port", "1"))
    s = Snapshot(
        node="node-001", ts=1001.0, seq=1,
        samples=(Sample("fabricmon_ib_port_state", P, 4.0), Sample("fabricmon_ib_port_state", bad_label, 4.0),
                 Sample("fabricmon_host_load1", (("x\udc80", "y"),), 1.0)),
        deltas=(CounterDelta("fabricmon_ib_port_errors_total", P, 1.0),
                CounterDelta("fabricmon_ib_port_errors_total", P + (("counter", "nan"),), math.nan),
                CounterDelta("fabricmon_ib_port_errors_total", P + (("counter", "neg"),), -5.0)),
        interval_seconds=1.0, sources=())
    try:
        assert wait_until(lambda: c.connected)
        c.offer(s)
        assert wait_until(lambda: len(engine.batches) == 1), c.stats()
        st = c.stats()
    finally:
        c.stop()
    b = engine.batches[0]
    assert b.deltas == (CounterDelta("fabricmon_ib_port_errors_total", P, 1.0),)
    assert b.gauges == (Sample("fabricmon_ib_port_state", P, 4.0),)
    assert st["items_dropped"]["series"] == 2 and st["items_dropped"]["delta"] == 2, st
    assert st["connects_total"] == 1


def test_hello_ack_at_the_end_of_the_seq_range_is_refused_not_fatal(tmp_path, engine):
    """An aggregator whose high-water mark for this node is 2^64-1: the agent cannot send
    anything above it, so it refuses that session (counted), keeps spooling and retries."""
    port = free_port()
    srv = start_grpc_server(engine, f"127.0.0.1:{port}")
    srv.servicer._last_seq["node-001"] = U64_MAX
    c = client(f"127.0.0.1:{port}", spool=Spool(tmp_path / "spool", 1 << 20)).start()
    try:
        for i in range(1, 4):
            c.offer(snap(i))
        assert wait_until(lambda: c.stats()["acks_refused_total"] >= 2 and len(c.spool) == 3), c.stats()
        assert _stream_thread_alive(c) and not c.connected
        assert engine.batches == []
        assert c.stats()["next_seq"] < U64_MAX
        srv.servicer._last_seq["node-001"] = 0  # the aggregator's state was reset
        assert wait_until(lambda: len(engine.batches) == 3, 15), c.stats()
        c.offer(snap(4))
        assert wait_until(lambda: len(engine.batches) == 4)
    finally:
        c.stop()
        srv.stop(0.5)
    assert [b.ts for b in engine.batches] == [1001.0, 1002.0, 1003.0, 1004.0]


class AckBeyondServer:
    """A misbehaving aggregator: acks every batch with seq + ``ahead`` (beyond what was sent)."""

    def __init__(self, port: int, ahead: int) -> None:
        self.seqs: list[int] = []
        self.lock = threading.Lock()
        self.ahead = ahead

        def stream(request_iterator, context):
            for msg in request_iterator:
                kind = msg.WhichOneof("msg")
                if kind == "hello":
                    yield pb.AggregatorMessage(ack=pb.Ack(seq=0))
                elif kind == "batch":
                    with self.lock:
                        self.seqs.append(msg.batch.seq)
                    yield pb.AggregatorMessage(ack=pb.Ack(seq=min(U64_MAX, msg.batch.seq + self.ahead)))

        handler = grpc.method_handlers_generic_handler("fabricmon.v1.FabricStream", {
            "Stream": grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=pb.AgentMessage.FromString,
                response_serializer=pb.AggregatorMessage.SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=(handler,))
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait(5)


@pytest.mark.parametrize("ahead", [1000, U64_MAX])
def test_ack_beyond_what_was_sent_never_deletes_unsent_spool(tmp_path, ahead):
    port = free_port()
    c = client(f"127.0.0.1:{port}", spool=Spool(tmp_path / "spool", 1 << 20), max_inflight=1).start()
    srv = None
    try:
        for i in range(1, 6):
            c.offer(snap(i))
        assert wait_until(lambda: len(c.spool) == 5)
        spooled = c.spool.seqs()
        srv = AckBeyondServer(port, ahead)
        assert wait_until(lambda: set(spooled) <= set(srv.seqs), 15), (spooled, srv.seqs, c.stats())
        assert _stream_thread_alive(c)
        assert c.stats()["acks_refused_total"] >= 1
        assert c.stats()["next_seq"] < U64_MAX
    finally:
        c.stop()
        if srv:
            srv.stop()


@pytest.fixture
def engine():
    return RecordingEngine()


@pytest.fixture
def engine_factory():
    return RecordingEngine


@pytest.fixture
def server(engine):
    srv = start_grpc_server(engine, "127.0.0.1:0")
    yield srv
    srv.stop(0.5)


class KnownLayoutsIntake(ListIntake):
    """An intake whose known layouts (resent on every connect) hold one the wire cannot carry."""

    def layouts(self):
        return [JobLayout("bad", (("tp", 2**63),)), JobLayout("ok", (("tp", 2),))]


def test_unencodable_known_layout_resent_on_connect_costs_only_itself(engine, server):
    intake = KnownLayoutsIntake()
    c = client(server.address, intake=intake).start()
    try:
        assert wait_until(lambda: c.connected)
        c.offer(snap(1))
        c.offer(snap(2))
        assert wait_until(lambda: len(engine.batches) == 2), c.stats()
        st = c.stats()
    finally:
        c.stop()
    assert st["connects_total"] == 1 and st["items_dropped"]["layout"] == 1, st
    assert engine.batches[0].layouts == (JobLayout("ok", (("tp", 2),)),)
    assert engine.batches[0].deltas == snap(1).deltas


def test_encoder_backstop_keeps_the_deltas_when_the_guard_misses(tmp_path, monkeypatch):
    """Were the guard to miss an item, the spooled batch still carries the poll's deltas."""
    from fabricmon.agent import wire_guard

    monkeypatch.setattr(wire_guard.WireGuard, "clean", lambda self, b: b)
    intake = ListIntake()
    c = client(f"127.0.0.1:{free_port()}", intake=intake, spool=Spool(tmp_path / "spool", 1 << 20))
    intake.put([BAD_RANKS["rank_2^32"], GOOD])
    c.offer(snap(1))
    c.stop()  # not started: stop() spools the queue
    assert len(c.spool) == 1
    m = pb.Batch.FromString(c.spool.read(c.spool.seqs()[0]))
    assert len(m.delta_values) == 1 and list(m.ranks) == []
    assert c.stats()["items_dropped"]["rank"] == 2
    assert c.stats()["batches_dropped"]["unencodable"] == 0
