"""No peer can blind or impersonate: per-node bounded time, per-session seqs, identity bound to the
credential.  The stream tests run real gRPC on 127.0.0.1 with real certificates."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient, TlsFiles
from fabricmon.aggregator.admission import ClusterClock
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import ServerTls, start_grpc_server
from fabricmon.batch import NodeBatch, NodeHello
from fabricmon.model import CounterDelta, Sample, Snapshot
from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.topology import generate_topology
from support.grpcraw import raw_stream
from support.waiting import wait_until

T0 = 1_764_000_000.0
TEN_YEARS = 10 * 365 * 86400.0


def _errors(dev: str) -> tuple[CounterDelta, ...]:
    lab = (("device", dev), ("port", "1"))
    return (CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),), 2000.0),
            CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "port_rcv_errors"),), 20.0),
            CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "link_error_recovery"),), 1.0))


class Nodes:
    """Hand-built batches for a small generated cluster, one per node per second."""

    def __init__(self, engine: Engine, nodes: list[str]) -> None:
        self.engine, self.nodes = engine, nodes
        self.seq = dict.fromkeys(nodes, 0)
        for n in nodes:
            engine.hello(NodeHello(n, "test", 1.0))

    def send(self, node: str, ts: float, deltas=()) -> bool:
        self.seq[node] += 1
        return self.engine.ingest(NodeBatch(node, self.seq[node], ts, 1.0, tuple(deltas)))


# ---------------------------------------------------------------- time


def test_one_batch_ten_years_ahead_neither_moves_the_clock_nor_blinds_detection():
    topo = generate_topology(8, nodes_per_unit=8, layout="roce", cluster="test")
    eng = Engine(topo)
    names = sorted(topo.nodes)
    c = Nodes(eng, names)
    for t in range(10):
        for n in names:
            c.send(n, T0 + t)
        eng.tick(eng.newest_ts)
    # a token holder (or an agent with a broken clock) sends one batch from the future
    assert c.send(names[0], T0 + TEN_YEARS) is False
    assert eng.admission.admission_snapshot() == {"ts_ahead": 1}
    assert eng.newest_ts == pytest.approx(T0 + 9)
    burst = names[3]
    for t in range(10, 60):
        for n in names:
            c.send(n, T0 + t, _errors("mlx5_2") if n == burst and 15 <= t < 25 else ())
        eng.tick(eng.newest_ts)
    incs = eng.incidents()
    # the burst is detected, nobody is "down", and the incident resolves once the burst stops
    assert [(i.alertname, i.component) for i in incs] == [("FabricLinkErrors", f"{burst}/mlx5_2/1")], incs
    assert incs[0].first_seen - (T0 + 15) <= 5.0
    assert incs[0].resolved_at is not None and incs[0].resolved_at < T0 + 59
    assert eng.newest_ts == pytest.approx(T0 + 59)


def test_wall_clock_mode_detects_and_resolves_with_batches_arriving_late_and_a_node_running_fast():
    """Production mode: ticks at the aggregator's clock while batches arrive 0.4 s after their
    sample time (and one node's clock runs 2 s fast); the burst opens within 5 s and resolves, the
    node that stops sending is reported down, nobody else is."""
    now = [T0]
    topo = generate_topology(8, nodes_per_unit=8, layout="roce", cluster="test")
    eng = Engine(topo, cluster_clock=ClusterClock("wall", wall=lambda: now[0]))
    names = sorted(topo.nodes)
    c = Nodes(eng, names)
    burst, fast, dies = names[3], names[5], names[7]
    for step in range(80):
        for sub in range(4):  # ticks every 0.25 s of wall time, batches once a second
            now[0] = T0 + step + sub * 0.25
            if sub == 2:
                for n in names:
                    if n == dies and step >= 50:
                        continue
                    ts = T0 + step + (2.0 if n == fast else 0.0)
                    assert c.send(n, ts, _errors("mlx5_2") if n == burst and 15 <= step < 25 else ()), (n, step)
            eng.tick(eng.newest_ts)
    incs = {(i.alertname, i.component): i for i in eng.incidents()}
    assert set(incs) == {("FabricLinkErrors", f"{burst}/mlx5_2/1"), ("FabricmonAgentDown", dies)}, incs
    link = incs[("FabricLinkErrors", f"{burst}/mlx5_2/1")]
    assert link.first_seen - (T0 + 15) <= 5.0 and link.resolved_at is not None
    down = incs[("FabricmonAgentDown", dies)]
    assert down.open and down.first_seen - (T0 + 49) <= 20.0


def test_rank_timing_from_the_future_is_not_scored():
    from fabricmon.rank_timing import RankTiming

    topo = generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test")
    eng = Engine(topo, cluster_clock=ClusterClock("wall", wall=lambda: T0))
    ok = RankTiming("llm", 0, 0, 10, 1.0, 0.2, T0 - 1)
    bad = RankTiming("llm", 1, 1, 10, 1.0, 0.2, T0 + TEN_YEARS)
    assert eng.ingest(NodeBatch("node-000", 1, T0, 1.0, ranks=(ok, bad)))
    assert eng.admission.rank_admission_snapshot() == {"ts_ahead": 1}
    assert list(eng.stragglers.jobs["llm"].ranks) == [0]
    assert eng.stragglers.jobs["llm"].last_ts == T0 - 1


def test_sample_clock_is_robust_to_a_bad_first_batch_and_follows_the_majority():
    clock = ClusterClock("sample", max_skew_s=300.0)
    assert clock.admit("node-000", T0 + TEN_YEARS) is None  # alone: nothing to judge it against
    for n in ("node-001", "node-002", "node-003"):
        assert clock.admit(n, T0) is None
    assert clock.now() == T0
    assert clock.admit("node-000", T0 + TEN_YEARS + 1) == "ts_ahead"
    assert clock.admit("node-001", T0 - 1) == "ts_behind"  # behind its own last time
    assert clock.admit("node-004", T0 - 4000) == "ts_stale"  # older than max_age_s behind the clock
    assert clock.now() == T0
    # the whole cluster skips ahead (a simulation jumping time): the clock follows the majority
    jump = T0 + 1000
    results = [clock.admit(n, jump) for n in ("node-001", "node-002", "node-003")]
    assert results[0] == "ts_ahead"
    for n in ("node-001", "node-002", "node-003"):
        clock.admit(n, jump + 1)
    assert clock.now() == pytest.approx(jump + 1)
    # disconnected nodes stop voting: one live node's time then is the clock
    clock.disconnected("node-000")
    clock.disconnected("node-002")
    clock.disconnected("node-003")
    assert clock.admit("node-001", jump + 50) is None
    assert clock.now() == jump + 50


def test_wall_clock_bounds_every_node_by_the_aggregators_clock():
    now = [T0]
    clock = ClusterClock("wall", max_skew_s=300.0, max_age_s=3600.0, wall=lambda: now[0])
    assert clock.admit("a", T0 + 301) == "ts_ahead"
    assert clock.admit("a", T0 - 3601) == "ts_stale"
    assert clock.admit("a", T0 + 10) is None  # a node running 10 s fast is tolerated
    assert clock.admit("a", T0 + 5) == "ts_behind"
    assert clock.admit("b", T0 + 299) is None  # no node moves the clock
    assert clock.now() == T0
    now[0] += 1
    assert clock.now() == T0 + 1


# ---------------------------------------------------------------- seq (real gRPC)


def _snap(node: str, i: int) -> Snapshot:
    return Snapshot(node=node, ts=time.time(), seq=i,
                    samples=(Sample("fabricmon_host_load1", (), float(i)),),
                    deltas=(CounterDelta("fabricmon_ib_port_errors_total",
                                         (("device", "mlx5_0"), ("port", "1"), ("counter", "symbol_error")), 0.0),),
                    interval_seconds=1.0, sources=())


def _client(target: str, node: str, **kw) -> StreamClient:
    hello = NodeHello(node, "test", 1.0, boot_id="b1")
    return StreamClient(target, node, lambda: hello, MemorySpool(), backoff_min=0.05, backoff_max=0.3,
                        hello_timeout=3.0, **kw)


def _hello_msg(node: str) -> pb.AgentMessage:
    return pb.AgentMessage(hello=codec.hello_to_pb(NodeHello(node, "raw", 1.0)))


def _batch_msg(node: str, seq: int, ts: float) -> pb.AgentMessage:
    return pb.AgentMessage(batch=codec.SeriesEncoder().encode(NodeBatch(node, seq, ts, 1.0), self_contained=True))


@pytest.fixture
def engine():
    topo = generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test")
    eng = Engine(topo)
    return eng


def test_seq_two_to_the_64_cannot_poison_a_node(engine):
    lock = threading.Lock()
    srv = start_grpc_server(engine, "127.0.0.1:0", lock=lock)
    try:
        # a peer speaking for node-001 sends one batch with the largest seq there is
        resp, code = raw_stream(srv.address, [_hello_msg("node-001"), _batch_msg("node-001", 2**64 - 1, time.time())])
        assert code == grpc.StatusCode.OK and [m.ack.seq for m in resp] == [0, 2**64 - 1]  # acked, not believed
        assert srv.servicer.drop_counts()["seq_ahead"] == 1
        # the real agent's batches still count
        real = _client(srv.address, "node-001")
        real.start()
        try:
            for i in range(1, 4):
                real.offer(_snap("node-001", i))
            assert wait_until(lambda: engine.admission.batches_total == 3)
        finally:
            real.stop()
        assert srv.stats()["batches_duplicate_total"] == 0
        # and a replay after a lost ack is still a duplicate, counted as one
        last = engine.nodes["node-001"].last_seq
        resp, _ = raw_stream(srv.address, [_hello_msg("node-001"), _batch_msg("node-001", last, time.time())])
        assert [m.ack.seq for m in resp] == [last, last]
        assert srv.servicer.drop_counts() == {"duplicate": 1, "seq_ahead": 1}
    finally:
        srv.stop(0.5)


def test_a_high_but_plausible_seq_from_another_session_does_not_silence_the_live_agent(engine):
    srv = start_grpc_server(engine, "127.0.0.1:0")
    real = _client(srv.address, "node-002")
    real.start()
    try:
        real.offer(_snap("node-002", 1))
        assert wait_until(lambda: engine.admission.batches_total == 1)
        # a second session for the same node, seq just under the ceiling (wall ms + skew)
        high = int(time.time() * 1000) + 200_000
        resp, code = raw_stream(srv.address, [_hello_msg("node-002"), _batch_msg("node-002", high, time.time())])
        assert code == grpc.StatusCode.OK and resp[-1].ack.seq == high
        assert engine.admission.batches_total == 2
        # the live agent's session keeps its own floor: its next batches still count
        for i in range(2, 5):
            real.offer(_snap("node-002", i))
        assert wait_until(lambda: engine.admission.batches_total == 5)
        assert srv.servicer.drop_counts()["duplicate"] == 0
    finally:
        real.stop()
    # and after a reconnect the agent is told the high-water mark and numbers above it
    again = _client(srv.address, "node-002")
    again.start()
    try:
        again.offer(_snap("node-002", 9))
        assert wait_until(lambda: engine.admission.batches_total == 6)
        assert engine.nodes["node-002"].last_seq > high
    finally:
        again.stop()
        srv.stop(0.5)


# ---------------------------------------------------------------- identity (real gRPC, real certs)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pytest.importorskip("cryptography")
    from support.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"), {
        "node1": ("node-001", ()),
        "node2": ("node-002", ()),
        "san": ("agent cert", ("node-003",)),
    })


def _mtls_client(srv, pki, stem: str, node: str) -> StreamClient:
    key, cert = pki[stem]
    return _client(srv.address, node, tls=TlsFiles(ca=pki["ca"], cert=cert, key=key, server_name="aggregator.test"))


def _mtls_server(engine, pki):
    key, cert = pki["server"]
    return start_grpc_server(engine, "127.0.0.1:0", tls=ServerTls(cert=cert, key=key, client_ca=pki["ca"]))


def test_mtls_cn_or_dns_san_matching_the_node_is_accepted(engine, pki):
    srv = _mtls_server(engine, pki)
    try:
        for stem, node in (("node1", "node-001"), ("san", "node-003")):
            c = _mtls_client(srv, pki, stem, node)
            c.start()
            try:
                c.offer(_snap(node, 1))
                assert wait_until(lambda n=node: engine.nodes[n].last_seq > 0), stem
            finally:
                c.stop()
        assert srv.stats()["identity_refused_total"] == 0
    finally:
        srv.stop(0.5)


def test_mtls_cn_of_another_node_is_refused(engine, pki):
    srv = _mtls_server(engine, pki)
    try:
        c = _mtls_client(srv, pki, "node2", "node-001")  # node-002's certificate speaking for node-001
        c.start()
        try:
            c.offer(_snap("node-001", 1))
            assert wait_until(lambda: srv.stats()["identity_refused_total"] >= 2)
            assert not c.connected and c.stats()["connects_total"] == 0
        finally:
            c.stop()
        assert not engine.nodes["node-001"].ever_seen and not engine.nodes["node-001"].connected
    finally:
        srv.stop(0.5)


def test_per_node_token_speaks_only_for_its_node(engine):
    tokens = {"node-001": "tok-one", "node-002": "tok-two"}
    srv = start_grpc_server(engine, "127.0.0.1:0", node_tokens=tokens)
    try:
        own = raw_stream(srv.address, [_hello_msg("node-001"), _batch_msg("node-001", 5, time.time())],
                          metadata=[("authorization", "Bearer tok-one")])
        assert own == ([pb.AggregatorMessage(ack=pb.Ack(seq=0)), pb.AggregatorMessage(ack=pb.Ack(seq=5))],
                       grpc.StatusCode.OK)
        other = raw_stream(srv.address, [_hello_msg("node-002"), _batch_msg("node-002", 5, time.time())],
                            metadata=[("authorization", "Bearer tok-one")])
        assert other == ([], grpc.StatusCode.PERMISSION_DENIED)
        unknown = raw_stream(srv.address, [_hello_msg("node-002")], metadata=[("authorization", "Bearer nope")])
        assert unknown == ([], grpc.StatusCode.UNAUTHENTICATED)
        assert not engine.nodes["node-002"].ever_seen
        st = srv.stats()
        assert st["identity_refused_total"] == 1 and st["unauthenticated_total"] == 1
        # the agent client with its own node's token works end to end
        c = _client(srv.address, "node-002", token="tok-two")
        c.start()
        try:
            c.offer(_snap("node-002", 1))
            assert wait_until(lambda: engine.nodes["node-002"].last_seq > 0)
        finally:
            c.stop()
    finally:
        srv.stop(0.5)


def test_shared_token_is_the_weaker_mode_any_holder_names_any_node(engine):
    srv = start_grpc_server(engine, "127.0.0.1:0", token="shared")
    try:
        for node in ("node-001", "node-002"):
            _, code = raw_stream(srv.address, [_hello_msg(node), _batch_msg(node, 7, time.time())],
                                  metadata=[("authorization", "Bearer shared")])
            assert code == grpc.StatusCode.OK
        assert engine.nodes["node-001"].last_seq == 7 and engine.nodes["node-002"].last_seq == 7
    finally:
        srv.stop(0.5)


# ---------------------------------------------------------------- self-metrics


def test_drops_and_refusals_are_exported_on_metrics():
    import urllib.request

    from fabricmon.aggregator.http_api import HttpApi

    engine = Engine(generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test"),
                    cluster_clock=ClusterClock("wall"))
    srv = start_grpc_server(engine, "127.0.0.1:0", node_tokens={"node-001": "tok-one"})
    http = HttpApi(engine, ("127.0.0.1", 0), grpc_stats=srv.stats)
    http.start()
    try:
        auth = [("authorization", "Bearer tok-one")]
        now = time.time()
        raw_stream(srv.address, [_hello_msg("node-001"), _batch_msg("node-001", 5, now),
                                  _batch_msg("node-001", 5, now),  # replayed
                                  _batch_msg("node-001", 2**64 - 1, now),  # seq ahead
                                  _batch_msg("node-001", 6, now + TEN_YEARS)],  # time ahead
                    metadata=auth)
        raw_stream(srv.address, [_hello_msg("node-002")], metadata=auth)  # another node's name
        raw_stream(srv.address, [_hello_msg("node-001")])  # no token
        with urllib.request.urlopen(f"http://127.0.0.1:{http.port}/metrics", timeout=5) as r:
            body = r.read().decode()
        for line in ('fabricmon_ingest_batches_dropped_total{reason="duplicate"} 1.0',
                     'fabricmon_ingest_batches_dropped_total{reason="seq_ahead"} 1.0',
                     'fabricmon_grpc_streams_refused_total{reason="identity"} 1.0',
                     'fabricmon_grpc_streams_refused_total{reason="unauthenticated"} 1.0',
                     'fabricmon_ingest_batches_dropped_total{reason="ts_ahead"} 1.0',
                     'fabricmon_ingest_rank_timings_dropped_total{reason="ts_ahead"} 0.0',
                     "fabricmon_ingest_batches_total 1.0",
                     'fabricmon_engine_errors_total{stage="intake"} 0.0',
                     'fabricmon_engine_errors_total{stage="tick"} 0.0'):
            assert line in body, line
        assert abs(engine.newest_ts - time.time()) < 60  # the wall clock, not the batch's
    finally:
        http.stop()
        srv.stop(0.5)


# ---------------------------------------------------------------- property: one node cannot move the clock


@settings(max_examples=200, deadline=None)
@given(honest=st.integers(min_value=2, max_value=6),
       rogue=st.lists(st.one_of(st.floats(min_value=-1e12, max_value=1e12), st.just(T0 + TEN_YEARS)),
                      min_size=1, max_size=40),
       jitter=st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=6, max_size=6))
def test_property_one_rogue_node_never_moves_the_sample_clock_or_blinds_the_others(honest, rogue, jitter):
    clock = ClusterClock("sample", max_skew_s=300.0, max_age_s=3600.0)
    names = [f"node-{i:03d}" for i in range(honest)]
    t = T0
    for step, claim in enumerate(rogue):
        t += 1.0
        clock.admit("rogue", claim)
        for i, n in enumerate(names):  # honest nodes a few seconds apart, never rejected
            assert clock.admit(n, t + jitter[i]) is None, (step, n)
        now = clock.now()
        assert t <= now <= t + 5.0, (step, now - t)
