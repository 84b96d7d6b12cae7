"""The agent's plain-HTTP listener answers a scrape from one selector loop (issue 39's p99).

No hand-off to a handler thread and no http.server parsing: the loop that accepts reads the request
and sends the pre-rendered parts.  Its bounds are the threaded listener's: a header deadline for the
whole request (a byte-a-time client is cut off), a write deadline, header size limits, a connection
limit; pipelined and keep-alive requests are answered in order.  Each server test runs with both
ways the loop calls the kernel (libc through ctypes, keeping the GIL; the socket module)."""

from __future__ import annotations

import gzip
import http.client
import socket
import sys
import threading
import time

import pytest

from fabricmon.agent.exporter import AgentHTTPServer, RenderedSnapshot, render_snapshot
from fabricmon.agent.runtime import build_agent
from fabricmon.config import load_agent_config
from fabricmon.heldio import LibcIO, SocketIO
from fabricmon.httploop import _ACCEPT_PAUSE, LoopHTTPServer, stored_gzip
from fabricmon.httpserve import TEXT, Chunk
from support.waiting import wait_until

BIG = b"".join(b"big_metric{i=\"%d\"} %d\n" % (i, i) for i in range(400_000))  # ~10 MB: more than socket buffers


@pytest.fixture(params=[LibcIO, SocketIO], ids=["libc", "socket"])
def serve(request):
    """Start a LoopHTTPServer over ``routes`` (its kernel calls: libc or the socket module)."""
    started: list[LoopHTTPServer] = []

    def start(routes, **kw) -> LoopHTTPServer:
        srv = LoopHTTPServer("127.0.0.1", 0, routes, name="test-loop", make_io=request.param, **kw)
        srv.start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


ROUTES = {
    "/metrics": lambda q: (200, [Chunk(b"a_total 1\n"), b"b 2\n"], "text/plain; version=0.0.4; charset=utf-8"),
    "/x": lambda q: (200, b"x\n", TEXT),
    "/q": lambda q: (200, repr(sorted(q.items())).encode(), TEXT),
    "/big": lambda q: (200, BIG, TEXT),
    "/boom": lambda q: 1 / 0,
}


def talk(port: int, data: bytes, *, chunk: int | None = None) -> bytes:
    """Send ``data`` (``chunk`` bytes a write) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if chunk is None:
            s.sendall(data)
        else:
            for i in range(0, len(data), chunk):
                s.sendall(data[i:i + chunk])
        out = b""
        while True:
            got = s.recv(65536)
            if not got:
                return out
            out += got


def responses(data: bytes, heads: tuple[bool, ...] = ()) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a byte stream into (status, headers, body) by Content-Length; ``heads[i]``: the i-th
    answered a HEAD (no body)."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = 0 if len(out) < len(heads) and heads[len(out)] else int(headers["content-length"])
        out.append((int(lines[0].split()[1]), headers, data[:n]))
        data = data[n:]
    return out


def test_a_complete_request_is_answered(serve):
    srv = serve(ROUTES)
    (code, headers, body), = responses(talk(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert code == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert body.startswith(b"a_total 1\nb 2\n")
    assert b'fabricmon_http_connections_closed_total{reason="timeout"} 0' in body  # the listener's own
    assert int(headers["content-length"]) == len(body) and headers["connection"] == "close" and "date" in headers


def test_a_request_split_across_many_small_writes(serve):
    srv = serve(ROUTES)
    req = b"GET /q?a=1&b=two HTTP/1.1\r\nHost: x\r\nUser-Agent: drip\r\nConnection: close\r\n\r\n"
    (code, _, body), = responses(talk(srv.port, req, chunk=1))
    assert code == 200 and body == b"[('a', ['1']), ('b', ['two'])]"


def test_a_slow_client_is_cut_off_at_the_header_deadline(serve):
    """A byte at a time keeps no connection open past the deadline for the whole request (slowloris)."""
    srv = serve(ROUTES, header_timeout=0.3)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /x HTTP/1.1\r\n")

        def cut() -> bool:
            try:
                s.sendall(b"a")  # one more header byte each time the condition is asked
                s.settimeout(0.01)
                return s.recv(1) == b""
            except TimeoutError:
                return False
            except OSError:
                return True

        assert wait_until(cut, 20)
    assert wait_until(lambda: srv.stats()["closed_timeout"] == 1, 10)


def test_oversized_or_too_many_headers_get_431_and_close(serve):
    srv = serve(ROUTES, max_header_bytes=4096, max_headers=10)
    big = b"GET /x HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n"
    (code, headers, _), = responses(talk(srv.port, big))
    assert code == 431 and headers["connection"] == "close"
    endless = b"GET /x HTTP/1.1\r\nX-Big: " + b"a" * 100_000  # never ends its headers: refused all the same
    assert responses(talk(srv.port, endless))[0][0] == 431
    many = b"GET /x HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(11)) + b"\r\n"
    assert responses(talk(srv.port, many))[0][0] == 431
    assert responses(talk(srv.port, b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][2] == b"x\n"


def test_pipelined_requests_are_answered_in_order(serve):
    srv = serve(ROUTES)
    reqs = (b"GET /x HTTP/1.1\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n"
            b"GET /q?k=v HTTP/1.1\r\nConnection: close\r\n\r\n")
    got = responses(talk(srv.port, reqs), heads=(False, True))
    assert [(code, body) for code, _, body in got] == [(200, b"x\n"), (200, b""), (404, b"not found\n"),
                                                       (200, b"[('k', ['v'])]")]
    assert int(got[1][1]["content-length"]) > 0  # HEAD: the GET's length, no body


def test_keepalive_client_is_served_on_one_connection(serve):
    srv = serve(ROUTES)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        for _ in range(5):
            conn.request("GET", "/x")
            r = conn.getresponse()
            assert r.read() == b"x\n" and r.getheader("Connection") is None
        sock = conn.sock
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        r = conn.getresponse()
        assert gzip.decompress(r.read()).startswith(b"a_total 1\nb 2\n") and conn.sock is sock
        assert srv.stats()["connections"] == 1
    finally:
        conn.close()


def test_http10_closes_unless_asked_to_keep_alive(serve):
    srv = serve(ROUTES)
    (_, headers, body), = responses(talk(srv.port, b"GET /x HTTP/1.0\r\n\r\n"))
    assert body == b"x\n" and headers["connection"] == "close"
    got = responses(talk(srv.port, b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /x HTTP/1.0\r\n\r\n"))
    assert [h["connection"] for _, h, _ in got] == ["keep-alive", "close"]


def test_a_response_the_peer_never_takes_is_cut_at_the_write_deadline(serve):
    srv = serve(ROUTES, write_timeout=0.3)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /big HTTP/1.1\r\n\r\n" * 4)  # never read
        assert wait_until(lambda: srv.stats()["closed_timeout"] == 1, 20)
    assert responses(talk(srv.port, b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][2] == b"x\n"


def test_a_big_body_goes_out_whole_across_partial_writes(serve):
    srv = serve(ROUTES)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /big HTTP/1.1\r\nConnection: close\r\n\r\n")  # 10 MB: more than the socket buffers take
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    (code, _, body), = responses(b"".join(chunks))
    assert code == 200 and body == BIG


def test_the_connection_limit_makes_room_for_a_scrape(serve):
    srv = serve(ROUTES, max_connections=4)
    idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(10)]
    try:
        for s in idle:
            s.sendall(b"G")  # a request begun, never finished
        assert responses(talk(srv.port, b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][2] == b"x\n"
        assert wait_until(lambda: srv.stats()["closed_limit"] >= 7, 10)
        assert srv.stats()["connections"] <= 4
    finally:
        for s in idle:
            s.close()


def test_a_new_connection_is_read_in_the_pass_that_accepts_it(serve):
    """The listener wakes once a connection's request has arrived (TCP_DEFER_ACCEPT): one recv a scrape."""
    srv = serve(ROUTES)
    if not hasattr(socket, "TCP_DEFER_ACCEPT"):
        pytest.skip("no TCP_DEFER_ACCEPT on this platform")
    assert srv._listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) > 0
    recvs = []
    real = srv._io.recv
    srv._io.recv = lambda handle: recvs.append(1) or real(handle)
    for _ in range(20):
        assert responses(talk(srv.port, b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][2] == b"x\n"
    assert len(recvs) == 20


def test_bad_requests_get_an_answer_and_the_listener_goes_on(serve):
    srv = serve(ROUTES)
    for req, code in ((b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 501),
                      (b"GET /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400),
                      (b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
                      (b"GET /x\r\n\r\n", 400),
                      (b"GET /x HTTP/2.0\r\n\r\n", 505),
                      (b"GET /x HTTP/1.1\r\n folded\r\n\r\n", 400),
                      (b"GET /boom HTTP/1.1\r\n\r\n", 500)):
        (got, headers, _), *_ = responses(talk(srv.port, req))
        assert (got, headers["connection"]) == (code, "close"), req
    assert responses(talk(srv.port, b"GET http://h/x HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][2] == b"x\n"
    assert srv.alive()


def test_out_of_descriptors_rests_the_listener_instead_of_spinning(serve):
    """EMFILE leaves the listener readable: retried at once, the loop would spin on it."""
    srv = serve(ROUTES)
    real = srv._io.accept
    failures: list[float] = []

    def accept():
        if len(failures) < 3:
            failures.append(time.monotonic())
            raise OSError(24, "Too many open files")
        return real()

    srv._io.accept = accept
    assert responses(talk(srv.port, b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"))[0][2] == b"x\n"
    gaps = [failures[i + 1] - failures[i] for i in range(len(failures) - 1)]
    assert len(failures) == 3 and min(gaps) >= _ACCEPT_PAUSE * 0.9, gaps  # a rest between tries


def test_stored_gzip_members_decompress_to_their_bytes():
    for n in (0, 1, 150, 65535, 65536, 200_001):
        data = bytes(range(256)) * (n // 256) + b"z" * (n % 256)
        assert gzip.decompress(stored_gzip(data)) == data
        assert gzip.decompress(stored_gzip(data) + gzip.compress(b"next")) == data + b"next"


# -- the agent's listener


def _agent(make_fixture):
    root = make_fixture(layout="ib")
    cfg = load_agent_config(None, {"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                                   "nvml": f"fake:{root / 'nvml.json'}", "listen": "127.0.0.1:0"})
    return build_agent(cfg, inline_sources=True)


def _scrape(port: int, gz: bool = False) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gz else {})
        r = conn.getresponse()
        assert r.status == 200
        body = r.read()
        return gzip.decompress(body) if gz else body
    finally:
        conn.close()


def test_the_agents_scrape_is_answered_by_the_listener_thread_itself():
    """No hand-off: the thread that accepted the connection runs the /metrics route (the threaded
    listener ran it in a handler thread, one more wake-up behind the GIL)."""
    ran_in: list[str] = []

    def metrics() -> list:
        ran_in.append(threading.current_thread().name)
        return [b"x 1\n"]

    srv = AgentHTTPServer("127.0.0.1", 0, metrics=metrics, not_ready=lambda: [])
    srv.start()
    try:
        for _ in range(3):
            assert _scrape(srv.port).startswith(b"x 1\n")
    finally:
        srv.stop()
    assert ran_in == ["agent-http"] * 3
    if sys.platform.startswith("linux"):
        assert isinstance(srv._server._io, LibcIO)


def test_the_body_is_the_snapshots_rendered_text_and_changes_only_with_a_new_snapshot(make_fixture):
    agent = _agent(make_fixture)
    port = agent.start_http()
    try:
        first = agent.poller.poll_once()
        want = render_snapshot(first)
        bodies = [_scrape(port), _scrape(port, gz=True), _scrape(port)]
        for body in bodies:
            assert body.startswith(want)  # the snapshot's text, then the per-scrape lines
            assert b"fabricmon_snapshot_age_seconds{" in body[len(want):]
            assert b"fabricmon_agent_thread_up" in body
            assert b'fabricmon_http_connections_closed_total{reason="limit"}' in body
        rendered = agent._rendered
        assert isinstance(rendered, RenderedSnapshot)
        cached = rendered._body
        _scrape(port)
        assert rendered._body is cached  # scrapes do not render
        second = agent.poller.poll_once()
        assert second.seq != first.seq
        after = _scrape(port)
        assert after.startswith(render_snapshot(second)) and not after.startswith(want)
        assert rendered._body is not cached
    finally:
        agent.stop()


def test_a_web_config_given_at_a_reload_moves_the_port_to_the_threaded_listener_and_back():
    """TLS and basic auth run in the threaded listener (a handshake or a bcrypt check would stall the
    loop): a reload that adds a web config swaps the listener, on the same port."""
    from fabricmon.httpserve import RoutedHTTPServer
    from fabricmon.webconfig import WebConfig

    srv = AgentHTTPServer("127.0.0.1", 0, metrics=lambda: [b"x 1\n"], not_ready=lambda: [])
    srv.start()
    try:
        port = srv.port
        srv.set_web(WebConfig(source="web.yml"))
        assert isinstance(srv._server, RoutedHTTPServer) and srv.port == port
        assert _scrape(port).startswith(b"x 1\n")
        srv.set_web(None)
        assert isinstance(srv._server, LoopHTTPServer) and srv.port == port
        assert _scrape(port).startswith(b"x 1\n")
    finally:
        srv.stop()
