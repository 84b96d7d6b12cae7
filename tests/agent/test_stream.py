"""Agent stream client <-> aggregator gRPC server over real gRPC on 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
import time

import grpc
import pytest
from structlog.testing import capture_logs

from fabricmon.agent.spool import MemorySpool, Spool
from fabricmon.agent.stream import StreamClient, TlsFiles
from fabricmon.aggregator.server import ServerTls, start_grpc_server
from fabricmon.batch import NodeBatch, NodeHello
from fabricmon.model import CounterDelta, Sample, Snapshot
from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.rank_timing import JobLayout, RankTiming
from support.grpcraw import raw_stream
from support.net import free_port
from support.streamrig import P, RecordingEngine, client, snap
from support.waiting import wait_until

pytestmark = pytest.mark.integration


class FakeIntake:
    def __init__(self) -> None:
        self.pending: list[RankTiming] = []
        self.known = [JobLayout("llm-7b", (("tp", 8), ("pp", 1), ("dp", 1)))]

    def drain(self):
        out, self.pending = self.pending, []
        return out, []

    def layouts(self):
        return list(self.known)


@pytest.fixture
def engine():
    return RecordingEngine()


@pytest.fixture
def server(engine):
    srv = start_grpc_server(engine, "127.0.0.1:0")
    yield srv
    srv.stop(0.5)


def test_round_trip_series_table_labels_gauges_and_ranks(engine, server):
    intake = FakeIntake()
    c = client(server.address, intake=intake).start()
    try:
        assert wait_until(lambda: c.connected)
        intake.pending = [RankTiming("llm-7b", 3, 3, 10, 1.5, 0.25, 1001.0, node="node-001", group=(("tp", 3),))]
        c.offer(snap(1))
        assert wait_until(lambda: len(engine.batches) == 1)
        for i in range(2, 6):
            c.offer(snap(i, state=4.0 if i < 5 else 1.0, errors=float(i)))
        assert wait_until(lambda: len(engine.batches) == 5)
        assert wait_until(lambda: c.stats()["batches_acked_total"] == 5)
    finally:
        c.stop()
    b = engine.batches
    assert engine.hellos[0].node == "node-001" and engine.hellos[0].gpus == 8
    seqs = [x.seq for x in b]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert all(x.node == "node-001" for x in b)
    assert [x.ts for x in b] == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0]
    for i, x in enumerate(b, start=1):
        assert x.deltas == snap(i, errors=1.0 if i == 1 else float(i)).deltas
    # gauges: all in the first batch of the connection, then only those that changed; counter totals never
    assert {g.family for g in b[0].gauges} == {"fabricmon_ib_port_state", "fabricmon_host_load1"}
    assert b[1].gauges == (Sample("fabricmon_host_load1", (), 2.0),)
    assert Sample("fabricmon_ib_port_state", P, 1.0) in b[4].gauges
    assert b[0].ranks == (RankTiming("llm-7b", 3, 3, 10, 1.5, 0.25, 1001.0, node="node-001", group=(("tp", 3),)),)
    assert b[0].layouts == tuple(intake.known)  # known layouts resent on connect
    assert b[1].layouts == ()


def test_aggregator_down_at_start_spools_then_replays_in_order(tmp_path, engine):
    port = free_port()
    c = client(f"127.0.0.1:{port}", spool=Spool(tmp_path / "spool", 1 << 20)).start()
    srv = None
    try:
        for i in range(1, 6):
            c.offer(snap(i))
        assert wait_until(lambda: len(c.spool) == 5)
        assert c.stats()["connect_failures_total"] >= 1 and not c.connected
        srv = start_grpc_server(engine, f"127.0.0.1:{port}")
        assert wait_until(lambda: len(engine.batches) == 5, 15)
        for i in range(6, 9):
            c.offer(snap(i))
        assert wait_until(lambda: len(engine.batches) == 8)
        assert wait_until(lambda: len(c.spool) == 0)
    finally:
        c.stop()
        if srv:
            srv.stop(0.5)
    seqs = engine.seqs()
    assert seqs == sorted(seqs) and len(set(seqs)) == 8
    assert [b.ts for b in engine.batches] == [1000.0 + i for i in range(1, 9)]
    # the replayed first batch is self-contained and carries every gauge; the first live one too
    assert len(engine.batches[0].gauges) == 2
    assert len(engine.batches[5].gauges) == 2
    assert c.stats()["batches_replayed_total"] >= 5


def test_server_killed_mid_stream_and_restarted(tmp_path, engine):
    port = free_port()
    srv = start_grpc_server(engine, f"127.0.0.1:{port}")
    c = client(f"127.0.0.1:{port}", spool=Spool(tmp_path / "spool", 1 << 20)).start()
    try:
        for i in range(1, 4):
            c.offer(snap(i))
        assert wait_until(lambda: c.stats()["batches_acked_total"] == 3)
        srv.stop(0)
        assert wait_until(lambda: engine.disconnects == ["node-001"])
        assert wait_until(lambda: not c.connected)
        for i in range(4, 8):
            c.offer(snap(i))
        assert wait_until(lambda: len(c.spool) == 4)
        srv = start_grpc_server(engine, f"127.0.0.1:{port}")
        assert wait_until(lambda: len(engine.batches) == 7, 15)
        c.offer(snap(8))
        assert wait_until(lambda: len(engine.batches) == 8)
        # the engine has the batch before its ack is on the wire: a stop before the ack arrives spools it again
        assert wait_until(lambda: c.stats()["batches_acked_total"] == 8), c.stats()
    finally:
        c.stop()
        srv.stop(0.5)
    seqs = engine.seqs()
    assert seqs == sorted(seqs) and len(set(seqs)) == 8, seqs
    assert [b.ts for b in engine.batches] == [1000.0 + i for i in range(1, 9)]
    assert len(c.spool) == 0


def test_agent_restart_replays_spool_and_seq_keeps_increasing(tmp_path, engine):
    port = free_port()
    c = client(f"127.0.0.1:{port}", spool=Spool(tmp_path / "spool", 1 << 20)).start()
    for i in range(1, 4):
        c.offer(snap(i))
    assert wait_until(lambda: len(c.spool) == 3)
    c.stop()
    old_max = Spool(tmp_path / "spool", 1 << 20).max_seq
    srv = start_grpc_server(engine, f"127.0.0.1:{port}")
    c2 = client(f"127.0.0.1:{port}", spool=Spool(tmp_path / "spool", 1 << 20)).start()
    try:
        c2.offer(snap(4))
        assert wait_until(lambda: len(engine.batches) == 4)
    finally:
        c2.stop()
        srv.stop(0.5)
    assert engine.seqs() == sorted(engine.seqs()) and engine.seqs()[-1] > old_max


def _hello(node="node-raw") -> pb.AgentMessage:
    return pb.AgentMessage(hello=codec.hello_to_pb(NodeHello(node, "raw", 1.0)))


def _batch_msg(seq: int, node="node-raw", self_contained=True) -> pb.AgentMessage:
    b = NodeBatch(node, seq, float(seq), 1.0, deltas=(CounterDelta("fabricmon_ib_port_errors_total", P, 1.0),))
    return pb.AgentMessage(batch=codec.SeriesEncoder().encode(b, self_contained=self_contained))


def test_duplicate_seqs_are_dropped_within_and_across_connections(engine, server):
    resp, code = raw_stream(server.address, [_hello(), _batch_msg(5), _batch_msg(5), _batch_msg(4), _batch_msg(6)])
    assert code == grpc.StatusCode.OK
    assert [m.ack.seq for m in resp] == [0, 5, 5, 5, 6]
    resp, code = raw_stream(server.address, [_hello(), _batch_msg(6), _batch_msg(7)])  # replay after a lost ack
    assert [m.ack.seq for m in resp] == [6, 6, 7]
    assert engine.seqs() == [5, 6, 7]
    assert server.stats()["batches_duplicate_total"] == 3


def test_malformed_batch_rejected_and_server_keeps_serving(engine, server):
    good = client(server.address).start()
    try:
        assert wait_until(lambda: good.connected)
        bad = _batch_msg(9, self_contained=False)
        bad.batch.ClearField("new_series")  # refers to ids never defined
        with capture_logs() as logs:
            resp, code = raw_stream(server.address, [_hello(), bad])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert resp[-1].WhichOneof("msg") == "reject" and "unknown series id" in resp[-1].reject.reason
        assert resp[-1].reject.seq == 9
        assert any(e["event"] == "stream_rejected" and "unknown series id" in e["reason"] for e in logs)
        resp, code = raw_stream(server.address, [_batch_msg(1)])  # no hello first
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "hello" in resp[0].reject.reason
        good.offer(snap(1))
        assert wait_until(lambda: any(b.node == "node-001" for b in engine.batches))
        assert good.connected
    finally:
        good.stop()
    assert not any(b.node == "node-raw" for b in engine.batches)


def test_client_drops_a_batch_the_server_rejects(engine, server, monkeypatch):
    c = client(server.address).start()
    try:
        assert wait_until(lambda: c.connected)
        real = codec.SeriesEncoder.encode

        def broken(self, b, *, self_contained=False):
            m = real(self, b, self_contained=self_contained)
            if b.ts == 1002.0:
                m.delta_values[0] = -1.0
            return m

        monkeypatch.setattr(codec.SeriesEncoder, "encode", broken)
        for i in (1, 2, 3):
            c.offer(snap(i))
        assert wait_until(lambda: [b.ts for b in engine.batches] == [1001.0, 1003.0], 15)
        assert c.stats()["batches_rejected_total"] == 1
    finally:
        c.stop()


def test_wrong_token_is_unauthenticated_and_logged(engine):
    srv = start_grpc_server(engine, "127.0.0.1:0", token="s3cret")
    try:
        with capture_logs() as logs:
            _, code = raw_stream(srv.address, [_hello()], metadata=[("authorization", "Bearer nope")])
            _, code2 = raw_stream(srv.address, [_hello()])
        assert code == grpc.StatusCode.UNAUTHENTICATED and code2 == grpc.StatusCode.UNAUTHENTICATED
        warn = [e for e in logs if e["event"] == "stream_unauthenticated"]
        assert {e["reason"] for e in warn} == {"wrong bearer token", "missing bearer token"}
        assert all(e["peer"].startswith("ipv4:127.0.0.1") for e in warn)
        bad = client(srv.address, token="nope")
        with capture_logs() as logs:
            bad.start()
            assert wait_until(lambda: bad.stats()["connect_failures_total"] >= 1)
            bad.stop()
        assert any(e["event"] == "stream_connect_failed" and "UNAUTHENTICATED" in e["reason"] for e in logs)
        ok = client(srv.address, token="s3cret").start()
        try:
            ok.offer(snap(1))
            assert wait_until(lambda: len(engine.batches) == 1)
        finally:
            ok.stop()
        assert engine.hellos == [engine.hellos[0]] and engine.hellos[0].node == "node-001"
    finally:
        srv.stop(0.5)


# ---------------------------------------------------------------- mTLS


def _pki(tmp_path):
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem, k, cert):
        kp, cp = tmp_path / f"{stem}.key", tmp_path / f"{stem}.crt"
        kp.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
        cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(kp), str(cp)

    def ca(cn):
        k = key()
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn)).public_key(k.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(k, hashes.SHA256()))
        return k, cert

    def leaf(cn, ca_key, ca_cert, server: bool):
        k = key()
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_cert.subject).public_key(k.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("aggregator.test"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return k, b.sign(ca_key, hashes.SHA256())

    ca_k, ca_c = ca("fabricmon test CA")
    rogue_k, rogue_c = ca("rogue CA")
    out = {"ca": write("ca", ca_k, ca_c)[1], "rogue_ca": write("rogue_ca", rogue_k, rogue_c)[1]}
    out["server"] = write("server", *leaf("aggregator.test", ca_k, ca_c, True))
    out["client"] = write("client", *leaf("node-001", ca_k, ca_c, False))
    out["rogue"] = write("rogue", *leaf("node-001", rogue_k, rogue_c, False))
    return out


def test_mtls_accepts_our_ca_and_refuses_another(tmp_path, engine):
    pki = _pki(tmp_path)
    skey, scert = pki["server"]
    srv = start_grpc_server(engine, "127.0.0.1:0", tls=ServerTls(cert=scert, key=skey, client_ca=pki["ca"]))
    try:
        ckey, ccert = pki["client"]
        good = client(srv.address, tls=TlsFiles(ca=pki["ca"], cert=ccert, key=ckey, server_name="aggregator.test"))
        good.start()
        try:
            good.offer(snap(1))
            assert wait_until(lambda: len(engine.batches) == 1)
        finally:
            good.stop()
        for cert_pair in (pki["rogue"], None):
            tls = TlsFiles(ca=pki["ca"], cert=cert_pair[1] if cert_pair else None,
                           key=cert_pair[0] if cert_pair else None, server_name="aggregator.test")
            bad = client(srv.address, tls=tls)
            with capture_logs() as logs:
                bad.start()
                bad.offer(snap(2))
                assert wait_until(lambda bad=bad: bad.stats()["connect_failures_total"] >= 2)
                bad.stop()
            assert not bad.connected and bad.stats()["connects_total"] == 0
            assert any(e["event"] == "stream_connect_failed" for e in logs)
            assert len(bad.spool) == 1  # kept for later, not lost
        assert len(engine.batches) == 1 and len(engine.hellos) == 1
    finally:
        srv.stop(0.5)


def test_health_service_serving(engine, server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for svc in ("", "fabricmon.v1.FabricStream"):
            r = stub.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_offer_never_blocks_and_queue_is_bounded():
    c = client("127.0.0.1:1", queue_max=5)  # not started: nothing drains
    t0 = time.monotonic()
    for i in range(1, 21):
        c.offer(snap(i))
    assert time.monotonic() - t0 < 0.5
    assert c.stats()["snapshots_dropped_total"] == 15 and c.stats()["queue_length"] == 5
    c.stop()  # flushes the queue to the spool
    assert len(c.spool) == 5


def test_backoff_is_bounded_with_full_jitter():
    import random

    c = StreamClient("127.0.0.1:1", "n", spool=MemorySpool(), rng=random.Random(1))
    delays = [c.reconnect.backoff(a) for a in range(40)]
    assert all(0.5 <= d <= 30.0 for d in delays)
    assert max(delays[10:]) > 10.0  # grows
    assert len({round(d, 3) for d in delays[10:]}) > 20  # jittered


def test_against_the_real_engine():
    engine_mod = pytest.importorskip("fabricmon.aggregator.engine")
    from fabricmon.aggregator.config import DetectionSettings
    from fabricmon.topology import generate_topology

    topo = generate_topology(2, nodes_per_unit=2, layout="roce", cluster="test")
    eng = engine_mod.Engine(topo, DetectionSettings())
    node = sorted(topo.nodes)[0]
    srv = start_grpc_server(eng, "127.0.0.1:0")
    hello = NodeHello(node, "test", 1.0, gpus=8, boot_id="b1")
    c = StreamClient(srv.address, node, lambda: hello, MemorySpool(), backoff_min=0.05, backoff_max=0.3).start()
    try:
        assert wait_until(lambda: c.connected)
        for i in range(1, 4):
            c.offer(Snapshot(node, 1000.0 + i, i,
                             (Sample("fabricmon_ib_port_state", (("device", "mlx5_0"), ("port", "1")), 4.0),),
                             (CounterDelta("fabricmon_ib_port_errors_total",
                                           (("device", "mlx5_0"), ("port", "1"), ("counter", "symbol_error")), 1.0),),
                             1.0, ()))
        assert wait_until(lambda: eng.admission.batches_total == 3)
        assert eng.nodes[node].connected
        eng.tick(1004.0)
    finally:
        c.stop()
        srv.stop(0.5)
    assert wait_until(lambda: not eng.nodes[node].connected)
