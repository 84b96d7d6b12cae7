"""The agent's own gRPC client (agent/h2_grpc.py) against real grpcio servers on 127.0.0.1: a test echo
service and the aggregator's server."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from fabricmon.agent.grpc_status import StatusCode
from fabricmon.agent.h2_grpc import Channel, RpcError
from fabricmon.agent.stream_channel import TlsFiles, tls_context
from fabricmon.aggregator.server import start_grpc_server
from support.certs import make_pki
from support.streamrig import RecordingEngine, client
from support.waiting import wait_until

pytestmark = pytest.mark.integration

ECHO = "/test.Echo/Stream"
BIG = 300 * 1024  # past HTTP/2's 65,535-byte initial window, each way


def _echo(requests, context):
    """Each request back, unless it asks for something else: b"abort" (Trailers-Only: status before any
    message), b"huge" (a 2 MiB answer), b"silent" (no answer at all, until cancelled)."""
    for req in requests:
        if req == b"abort":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token: 100% refused")
        elif req == b"huge":
            yield b"x" * (2 * 1024 * 1024)
        elif req == b"silent":
            while context.is_active():
                time.sleep(0.05)
            return
        else:
            yield req


@pytest.fixture
def echo_server(request):
    """``request.param``: more server options (the ping policy)."""
    opts = [("grpc.max_send_message_length", 4 * 1024 * 1024), *getattr(request, "param", ())]
    srv = grpc.server(futures.ThreadPoolExecutor(4), options=opts)
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_echo)})])
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield srv, f"127.0.0.1:{port}"
    srv.stop(0)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


class Outbox:
    """The request iterator the agent uses: a queue ended by None."""

    def __init__(self) -> None:
        self.items: list[bytes | None] = []
        self.cv = threading.Condition()

    def put(self, item: bytes | None) -> None:
        with self.cv:
            self.items.append(item)
            self.cv.notify_all()

    def __iter__(self):
        while True:
            with self.cv:
                assert self.cv.wait_for(lambda: self.items, 30)
                item = self.items.pop(0)
            if item is None:
                return
            yield item


def _call(target: str, **kw):
    box = Outbox()
    ch = Channel(target, **kw)
    return ch, box, ch.stream_stream(ECHO)(box, metadata=(("authorization", "Bearer t"),))


def _read_all(call, into: list, errors: list) -> None:
    try:
        for m in call:
            into.append(m)
    except RpcError as exc:
        errors.append(exc)


def test_messages_past_the_flow_control_window_go_both_ways(echo_server):
    _, target = echo_server
    ch, box, call = _call(target)
    sent = [bytes([i]) * (BIG + i) for i in range(6)] + [b"small"]
    for m in sent:
        box.put(m)
    box.put(None)
    assert list(call) == sent  # ends OK after the half-close
    ch.close()


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_target_in_brackets():
    """[v6]:port, as the aggregator address config accepts (configload.check_hostport)."""
    srv = grpc.server(futures.ThreadPoolExecutor(2))
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_echo)})])
    port = srv.add_insecure_port("[::1]:0")
    srv.start()
    try:
        ch, box, call = _call(f"[::1]:{port}")
        box.put(b"v6")
        box.put(None)
        assert list(call) == [b"v6"]
    finally:
        srv.stop(0)


def test_a_message_over_the_receive_limit_is_resource_exhausted(echo_server):
    _, target = echo_server
    ch, box, call = _call(target)
    box.put(b"huge")
    with pytest.raises(RpcError) as exc:
        list(call)
    assert exc.value.code() is StatusCode.RESOURCE_EXHAUSTED
    ch.close()


def test_a_trailers_only_refusal_carries_its_code_and_decoded_message(echo_server):
    _, target = echo_server
    ch, box, call = _call(target)
    box.put(b"abort")
    with pytest.raises(RpcError) as exc:
        list(call)
    assert exc.value.code() is StatusCode.UNAUTHENTICATED
    assert exc.value.details() == "no token: 100% refused"
    ch.close()


def test_the_aggregators_token_refusal_reaches_the_agents_refusal_count():
    srv = start_grpc_server(RecordingEngine(), "127.0.0.1:0", token="s3cret")
    c = client(srv.address, token="wrong")
    try:
        c.start()
        assert wait_until(lambda: c.stats()["refused"]["unauthenticated"] >= 1)
    finally:
        c.stop()
        srv.stop(0)


def test_a_server_gone_mid_stream_is_unavailable(echo_server):
    srv, target = echo_server
    ch, box, call = _call(target)
    box.put(b"one")
    assert next(call) == b"one"
    srv.stop(0)
    with pytest.raises(RpcError) as exc:
        next(call)
    assert exc.value.code() is StatusCode.UNAVAILABLE
    ch.close()


def test_no_server_is_unavailable_from_the_iteration_not_the_call():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    target = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: refused
    try:
        ch, box, call = _call(target)  # does not raise
        with pytest.raises(RpcError) as exc:
            next(call)
        assert exc.value.code() is StatusCode.UNAVAILABLE
    finally:
        probe.close()


def test_cancel_unblocks_a_reader_waiting_for_an_answer(echo_server):
    _, target = echo_server
    ch, box, call = _call(target)
    got: list = []
    errors: list = []
    box.put(b"one")
    box.put(b"silent")
    reader = threading.Thread(target=_read_all, args=(call, got, errors), daemon=True)
    reader.start()
    assert wait_until(lambda: got == [b"one"])
    call.cancel()
    reader.join(3.0)
    assert not reader.is_alive()
    assert [e.code() for e in errors] == [StatusCode.CANCELLED]
    box.put(None)
    ch.close()


def test_keepalive_declares_a_silent_peer_dead():
    """A listener that accepts and never speaks (no SETTINGS, no PING ACK): the call ends UNAVAILABLE
    within keepalive + ping timeout, not never."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    try:
        ch, box, call = _call(f"127.0.0.1:{lst.getsockname()[1]}", keepalive_ms=200, ping_timeout=0.5)
        got: list = []
        errors: list = []
        reader = threading.Thread(target=_read_all, args=(call, got, errors), daemon=True)
        reader.start()
        reader.join(5.0)
        assert not reader.is_alive()
        assert [e.code() for e in errors] == [StatusCode.UNAVAILABLE] and "keepalive" in errors[0].details()
    finally:
        lst.close()


# grpcio's default policy answers a ping more often than every 5 min without data with GOAWAY (the
# aggregator allows one every 10 s; the agent pings after 20 s of silence): this server allows 50 ms.
@pytest.mark.parametrize("echo_server", [(("grpc.http2.min_recv_ping_interval_without_data_ms", 50),
                                          ("grpc.http2.max_ping_strikes", 0))], indirect=True)
def test_keepalive_pings_are_answered_and_the_stream_lives(echo_server):
    _, target = echo_server
    ch, box, call = _call(target, keepalive_ms=100, ping_timeout=2.0)
    got: list = []
    errors: list = []
    reader = threading.Thread(target=_read_all, args=(call, got, errors), daemon=True)
    reader.start()
    time.sleep(1.0)  # several keepalive periods without a frame: pings go out, their ACKs come back
    box.put(b"still here")
    assert wait_until(lambda: got == [b"still here"] or errors), errors
    box.put(None)
    reader.join(5.0)
    assert not reader.is_alive() and errors == []
    assert call.pings_acked >= 2
    ch.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pytest.importorskip("cryptography")
    return make_pki(tmp_path_factory.mktemp("pki"), {"client": ("node-001", ())})


def _server_tls(pki):
    key, cert = pki["server"]
    return grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())],
                                       root_certificates=open(pki["ca"], "rb").read(), require_client_auth=True)


def test_mtls_with_the_test_ca(pki):
    srv = grpc.server(futures.ThreadPoolExecutor(2))
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_echo)})])
    port = srv.add_secure_port("127.0.0.1:0", _server_tls(pki))
    srv.start()
    try:
        key, cert = pki["client"]
        ch, box, call = _call(f"127.0.0.1:{port}", ssl_context=tls_context(TlsFiles(ca=pki["ca"], cert=cert, key=key)),
                                server_name="aggregator.test")
        box.put(b"x" * BIG)
        box.put(None)
        assert list(call) == [b"x" * BIG]
        # without a client certificate the server refuses the handshake
        ch, box, call = _call(f"127.0.0.1:{port}", ssl_context=tls_context(TlsFiles(ca=pki["ca"])),
                                server_name="aggregator.test")
        box.put(b"hi")
        with pytest.raises(RpcError) as exc:
            list(call)
        assert exc.value.code() is StatusCode.UNAVAILABLE
        box.put(None)
    finally:
        srv.stop(0)
