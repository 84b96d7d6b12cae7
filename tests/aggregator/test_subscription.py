"""The aggregator's Subscription: agents leave out what it never reads (real gRPC on 127.0.0.1)."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NodeBatch, NodeHello
from fabricmon.model import CounterDelta, Sample, Snapshot
from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.proto.subscription import (
    MAX_FAMILIES,
    BadSubscription,
    Subscription,
    filter_batch,
    subscription_from_pb,
)
from support.grpcraw import raw_stream
from support.waiting import wait_until

P = (("device", "mlx5_0"), ("port", "1"))
ERR = CounterDelta("fabricmon_ib_port_errors_total", P + (("counter", "symbol_error"),), 2.0)
TRAFFIC = CounterDelta("fabricmon_ib_port_receive_bytes_total", P, 1e9)
TRAFFIC_RESET = CounterDelta("fabricmon_ib_port_transmit_bytes_total", P, 5.0, reset=True)
TRAFFIC_SAT = CounterDelta("fabricmon_ib_port_receive_packets_total", P, 7.0, saturated=True)
STATE = Sample("fabricmon_ib_port_state", P, 4.0)
UTIL = Sample("fabricmon_gpu_utilization_ratio", (("gpu", "0"),), 0.9)

SUB = Subscription(frozenset({"fabricmon_ib_port_errors_total"}), frozenset({"fabricmon_ib_port_state"}))


# ------------------------------------------------------------------ pure


def test_filter_keeps_read_families_and_every_flagged_delta():
    b = NodeBatch("n", 1, 1.0, 1.0, deltas=(ERR, TRAFFIC, TRAFFIC_RESET, TRAFFIC_SAT), gauges=(STATE, UTIL))
    out, left_out = filter_batch(b, SUB)
    assert out.deltas == (ERR, TRAFFIC_RESET, TRAFFIC_SAT)  # a reset of any family tells of a device reset
    assert out.gauges == (STATE,)
    assert left_out == 2
    assert (out.node, out.seq, out.ts) == ("n", 1, 1.0)


def test_filter_returns_the_same_batch_when_nothing_is_left_out():
    b = NodeBatch("n", 1, 1.0, 1.0, deltas=(ERR,), gauges=(STATE,))
    assert filter_batch(b, SUB) == (b, 0)


@pytest.mark.parametrize("msg, problem", [
    (pb.Subscription(delta_families=["f"] * (MAX_FAMILIES + 1)), "at most"),
    (pb.Subscription(gauge_families=[""]), "1 to 200"),
    (pb.Subscription(delta_families=["x" * 201]), "1 to 200"),
])
def test_a_hostile_subscription_is_refused(msg, problem):
    with pytest.raises(BadSubscription, match=problem):
        subscription_from_pb(msg)


def test_subscription_round_trips():
    assert subscription_from_pb(SUB.to_pb().subscription) == SUB


# ------------------------------------------------------------------ over gRPC


class Recording:
    """Records what the real decoder hands the engine; reads what the real Engine reads."""

    def __init__(self, read: bool = True) -> None:
        self.lock = threading.Lock()
        self.batches: list[NodeBatch] = []
        if read:
            self.read_delta_families = Engine.read_delta_families
            self.read_gauge_families = Engine.read_gauge_families

    def hello(self, hello: NodeHello) -> None:
        pass

    def ingest(self, batch: NodeBatch) -> None:
        with self.lock:
            self.batches.append(batch)

    def disconnected(self, node: str) -> None:
        pass


def _snap(i: int) -> Snapshot:
    return Snapshot(node="node-001", ts=1000.0 + i, seq=i, samples=(STATE, UTIL),
                    deltas=(ERR, TRAFFIC, TRAFFIC_RESET if i == 3 else TRAFFIC_SAT),
                    interval_seconds=1.0, sources=())


def _client(target: str) -> StreamClient:
    hello = NodeHello("node-001", "test", 1.0, gpus=8, boot_id="b1")
    return StreamClient(target, "node-001", lambda: hello, MemorySpool(), backoff_min=0.05, backoff_max=0.3,
                        hello_timeout=3.0)


def _run(engine, n: int = 4):
    srv = start_grpc_server(engine, "127.0.0.1:0")
    c = _client(srv.address).start()
    try:
        assert wait_until(lambda: c.connected)
        for i in range(1, n + 1):
            c.offer(_snap(i))
        assert wait_until(lambda: len(engine.batches) == n)
        return c.stats(), list(engine.batches)
    finally:
        c.stop(2.0)
        srv.stop(0.5)


def test_the_aggregator_subscribes_before_its_first_ack():
    engine = Recording()
    srv = start_grpc_server(engine, "127.0.0.1:0")
    try:
        hello = pb.AgentMessage(hello=codec.hello_to_pb(NodeHello("node-001", "t", 1.0)))
        resp, _ = raw_stream(srv.address, [hello], subscriptions=True, timeout=3.0)
    finally:
        srv.stop(0.5)
    assert [m.WhichOneof("msg") for m in resp] == ["subscription", "ack"]
    got = subscription_from_pb(resp[0].subscription)
    assert got.delta_families == Engine.read_delta_families and got.gauge_families == Engine.read_gauge_families


def test_an_agent_streams_only_what_the_engine_reads():
    stats, batches = _run(Recording())
    sent = [(d.family, d.reset, d.saturated) for b in batches for d in b.deltas]
    assert ("fabricmon_ib_port_receive_bytes_total", False, False) not in sent  # unread traffic left on the node
    assert ("fabricmon_ib_port_errors_total", False, False) in sent
    assert ("fabricmon_ib_port_transmit_bytes_total", True, False) in sent  # the reset still tells
    assert all(b.unread_deltas == 0 for b in batches)  # nothing came that the decoder had to skip
    assert {g.family for b in batches for g in b.gauges} == {"fabricmon_ib_port_state"}
    # per batch: the traffic delta; the utilization gauge once (gauges go only when they change)
    assert stats["items_unsubscribed_total"] == 4 + 1


def test_without_a_subscription_the_agent_sends_everything():
    stats, batches = _run(Recording(read=False))
    assert stats["items_unsubscribed_total"] == 0
    assert {d.family for d in batches[0].deltas} >= {"fabricmon_ib_port_receive_bytes_total"}
    assert {g.family for g in batches[0].gauges} == {"fabricmon_ib_port_state", "fabricmon_gpu_utilization_ratio"}


def test_a_refused_subscription_means_everything_is_sent():
    engine = Recording()
    engine.read_gauge_families = frozenset(f"fabricmon_g{i}" for i in range(MAX_FAMILIES + 1))  # too many
    with capture_logs() as logs:
        stats, batches = _run(engine)
    assert stats["items_unsubscribed_total"] == 0
    assert any(e["event"] == "stream_subscription_refused" for e in logs)
    # the aggregator's own decoder still builds only what it reads, and counts the rest
    assert sum(b.unread_deltas for b in batches) == 4
