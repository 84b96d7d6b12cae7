"""A flood of bare TCP connections to the gRPC port neither exhausts the aggregator's descriptors
nor is held for gRPC's default 120 s (issue 26, "Lockouts without a credential").

The aggregator is the real ``fabricmon aggregator`` process with a low ``RLIMIT_NOFILE`` (256), so
descriptor exhaustion is reached with a few hundred connections; the flood never sends the HTTP/2
preface.  While it lasts, the agent stream opened before it keeps being acknowledged and the
aggregator's own /metrics and /readyz answer.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

import pytest
import yaml

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.batch import NodeHello
from fabricmon.model import Snapshot
from support.procrig import REPO, free_port, http_get, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_NOFILE and Linux sockets")

NOFILE = 256
FLOOD = 400  # more than the process may open


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _answers(port: int, path: str) -> bool:
    return http_get(f"http://127.0.0.1:{port}{path}", timeout=5)[0] == 200


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(64) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_bare_tcp_flood_neither_exhausts_descriptors_nor_stops_the_stream(tmp_path):
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump({"cluster": "flood", "layout": "roce", "nodes_per_unit": 4,
                                    "generate": {"nodes": 4, "gpus_per_node": 2, "rails": 2}}))
    gport, hport = free_port(), free_port()
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({
        "topology": str(topo), "grpc_listen": f"127.0.0.1:{gport}", "http_listen": f"127.0.0.1:{hport}",
        "tick_seconds": 0.1, "auth": {"insecure": True},
        "grpc_limits": {"max_connections": 64, "handshake_timeout_s": 1.0}}))
    log = open(tmp_path / "agg.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "fabricmon", "aggregator", "--config", str(cfg), "--log-format",
                          "json"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_limit_fds)
    flood: list[socket.socket] = []
    client = None
    try:
        assert wait_until(lambda: _answers(hport, "/readyz"), 30), (tmp_path / "agg.log").read_text()
        hello = NodeHello("node-000", "test", 1.0)
        client = StreamClient(f"127.0.0.1:{gport}", "node-000", lambda: hello, MemorySpool(),
                              backoff_min=0.05, backoff_max=0.3).start()
        assert wait_until(lambda: client.connected, 15), client.last_error
        for _ in range(FLOOD):
            s = socket.create_connection(("127.0.0.1", gport), timeout=5)
            s.setblocking(False)
            flood.append(s)
        # the flood is held at the limit: the aggregator still has descriptors for its own work
        assert wait_until(lambda: sum(_closed_by_peer(s) for s in flood) >= FLOOD - 64, 10)
        assert _answers(hport, "/readyz") and _answers(hport, "/metrics")
        acked = client.stats()["batches_acked_total"]
        for i in range(5):
            client.offer(Snapshot(node="node-000", ts=time.time(), seq=i + 1, samples=(), deltas=(),
                                  interval_seconds=1.0, sources=()))
        assert wait_until(lambda: client.stats()["batches_acked_total"] >= acked + 5, 10), client.stats()
        assert client.stats()["connects_total"] == 1  # the stream was never dropped
        # the connections that never sent the HTTP/2 preface are closed at the handshake timeout
        assert wait_until(lambda: all(_closed_by_peer(s) for s in flood), 15)
        assert p.poll() is None
    finally:
        for s in flood:
            s.close()
        if client is not None:
            client.stop(2.0)
        p.terminate()
        p.wait(20)
        log.close()
    assert "Too many open files" not in (tmp_path / "agg.log").read_text()


def test_the_connection_limit_fits_the_descriptor_limit():
    from fabricmon.aggregator.service import FD_RESERVE, plan_fd_limit

    # the soft limit is raised toward the hard one for the connections and the reserve
    assert plan_fd_limit(8256, 1024, 524288) == (8256 + FD_RESERVE, 8256)
    # a hard limit too low: the connection limit shrinks, so it is what runs out, not the descriptors
    assert plan_fd_limit(8256, 1024, 4096) == (4096, 4096 - FD_RESERVE)
    assert plan_fd_limit(64, 256, 256) == (256, 64)
    assert plan_fd_limit(300, 256, 256) == (256, 256 - FD_RESERVE)
    assert plan_fd_limit(300, 1024, resource.RLIM_INFINITY) == (1024, 300)


# HTTP/2 framing (RFC 9113 section 4.1): 3-byte length, type, flags, 4-byte stream id.
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS, _PING, _ACK = 4, 6, 1
IDLE_FLOOD = 300  # more than the default connection limit (256 for a small cluster)


def _frame(ftype: int, flags: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + b"\0\0\0\0" + payload


def _answer_frames(s: socket.socket, buf: bytearray) -> None:
    """Acknowledge the server's SETTINGS and PINGs, as a live HTTP/2 client does; never open a stream."""
    while len(buf) >= 9:
        n = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + n:
            return
        ftype, flags, payload = buf[3], buf[4], bytes(buf[9:9 + n])
        del buf[:9 + n]
        if ftype == _SETTINGS and not flags & _ACK:
            s.sendall(_frame(_SETTINGS, _ACK))
        elif ftype == _PING and not flags & _ACK:
            s.sendall(_frame(_PING, _ACK, payload))


@pytest.mark.integration
def test_idle_http2_connections_do_not_lock_agents_out(tmp_path):
    """Issue 35 item 1: 300 connections that send the preface and SETTINGS, answer PINGs and never open a
    stream hold the connection limit; a real agent's stream still gets through (they are closed after
    grpc_limits.idle_timeout_s, default 10 s), and the aggregator stays up."""
    import selectors
    import threading

    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump({"cluster": "idle", "layout": "roce", "nodes_per_unit": 4,
                                    "generate": {"nodes": 4, "gpus_per_node": 2, "rails": 2}}))
    gport, hport = free_port(), free_port()
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({
        "topology": str(topo), "grpc_listen": f"127.0.0.1:{gport}", "http_listen": f"127.0.0.1:{hport}",
        "tick_seconds": 0.1, "auth": {"insecure": True}}))
    log = open(tmp_path / "agg.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "fabricmon", "aggregator", "--config", str(cfg), "--log-format",
                          "json"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    held: list[socket.socket] = []
    stop = threading.Event()
    sel = selectors.DefaultSelector()
    client = None

    def serve_frames() -> None:  # bounded: ends with the test
        while not stop.is_set():
            for key, _ in sel.select(timeout=0.1):
                s, buf = key.fileobj, key.data
                try:
                    chunk = s.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(s)
                    continue
                buf += chunk
                try:
                    _answer_frames(s, buf)  # type: ignore[arg-type]
                except OSError:
                    sel.unregister(s)

    pump = threading.Thread(target=serve_frames, daemon=True)
    try:
        assert wait_until(lambda: _answers(hport, "/readyz"), 30), (tmp_path / "agg.log").read_text()
        for _ in range(IDLE_FLOOD):
            s = socket.create_connection(("127.0.0.1", gport), timeout=5)
            s.sendall(_PREFACE + _frame(_SETTINGS, 0))
            s.setblocking(False)
            held.append(s)
            sel.register(s, selectors.EVENT_READ, bytearray())
        pump.start()
        hello = NodeHello("node-000", "test", 1.0)
        client = StreamClient(f"127.0.0.1:{gport}", "node-000", lambda: hello, MemorySpool(),
                              backoff_min=0.05, backoff_max=0.5).start()
        assert wait_until(lambda: client.connected, 30), client.last_error
        client.offer(Snapshot(node="node-000", ts=time.time(), seq=1, samples=(), deltas=(),
                              interval_seconds=1.0, sources=()))
        assert wait_until(lambda: client.stats()["batches_acked_total"] >= 1, 10), client.stats()
        assert p.poll() is None
    finally:
        stop.set()
        if pump.is_alive():
            pump.join(5)
        for s in held:
            s.close()
        sel.close()
        if client is not None:
            client.stop(2.0)
        p.terminate()
        p.wait(20)
        log.close()
