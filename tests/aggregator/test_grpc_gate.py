"""Re-opened call-less HTTP/2 connections cannot keep an agent out of the gRPC port (issue 35, item 1).

The aggregator is the real ``fabricmon aggregator`` process with a bearer token and a small connection
limit (16).  The attacker has no credential: from another host address (127.0.0.2) it keeps 48
connections going that send the HTTP/2 preface and SETTINGS, answer the server's SETTINGS and PINGs
and never open a stream, and re-opens each one the aggregator closes at once.  Before the connection
gate, gRPC refused every new connection while the attacker's 16 were held, until they idled out
(``grpc_limits.idle_timeout_s``, 10 s), and then the agent had to win the race against the
attacker's re-opening at every expiry; the real ``StreamClient`` with the node's token now gets its
stream through within a few seconds, and keeps it while the attack goes on (its connection carries
an authenticated stream, so it is never the one evicted).
"""

from __future__ import annotations

import os
import selectors
import socket
import stat
import subprocess
import sys
import threading
import time

import grpc
import pytest
import yaml
from structlog.testing import capture_logs

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NodeHello
from fabricmon.model import Snapshot
from fabricmon.proto import codec
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.topology import generate_topology
from support.grpcraw import raw_stream
from support.procrig import REPO, free_port, http_get, wait_until

LIMIT = 16
ATTACK = 3 * LIMIT  # connections the attacker keeps going
ATTACK_RATE = 200.0  # connects a second at most: re-opens far faster than any slot frees, bounded CPU
AGENT_BOUND_S = 6.0  # under the 10 s idle timeout: before the gate, no slot freed within it
TOKEN = "gate-test-token-0123456789abcdef"

# HTTP/2 framing (RFC 9113 section 4.1): 3-byte length, type, flags, 4-byte stream id.
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS, _PING, _ACK = 4, 6, 1


def _frame(ftype: int, flags: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + b"\0\0\0\0" + payload


class Attacker(threading.Thread):
    """Keeps ``ATTACK`` call-less HTTP/2 connections to the port from ``source``, re-opening each one the
    server closes; counts what the server did to them."""

    def __init__(self, port: int, source: str) -> None:
        super().__init__(daemon=True)
        self.port, self.source = port, source
        self.stop = threading.Event()
        self.sel = selectors.DefaultSelector()
        self.opened = self.closed_by_server = self.settled = 0  # settled: the server's SETTINGS arrived

    def _open(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((self.source, 0))
        try:
            s.connect(("127.0.0.1", self.port))
            s.sendall(_PREFACE + _frame(_SETTINGS, 0))
        except OSError:
            s.close()
            self.closed_by_server += 1
            return
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, [bytearray(), False])
        self.opened += 1

    def _drop(self, s: socket.socket) -> None:
        self.sel.unregister(s)
        s.close()
        self.closed_by_server += 1

    def _answer(self, s: socket.socket, state: list) -> None:
        buf = state[0]
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                return
            ftype, flags, payload = buf[3], buf[4], bytes(buf[9:9 + n])
            del buf[:9 + n]
            if ftype == _SETTINGS and not flags & _ACK:
                s.sendall(_frame(_SETTINGS, _ACK))
                if not state[1]:
                    state[1] = True
                    self.settled += 1
            elif ftype == _PING and not flags & _ACK:
                s.sendall(_frame(_PING, _ACK, payload))

    def run(self) -> None:  # bounded: ends with the test (stop), every wait has a timeout
        next_open = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            while len(self.sel.get_map()) < ATTACK and now >= next_open and not self.stop.is_set():
                self._open()
                next_open += 1.0 / ATTACK_RATE
                now = time.monotonic()
            next_open = max(next_open, now - 1.0)  # no burst to catch up after a stall
            for key, _ in self.sel.select(timeout=0.005):
                s = key.fileobj
                try:
                    chunk = s.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self._drop(s)  # type: ignore[arg-type]
                    continue
                key.data[0] += chunk
                try:
                    self._answer(s, key.data)  # type: ignore[arg-type]
                except OSError:
                    self._drop(s)  # type: ignore[arg-type]

    def close(self) -> None:
        self.stop.set()
        if self.is_alive():
            self.join(5)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()


def _metric(port: int, name: str) -> float:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="127.0.0.2 is a loopback address on Linux")
def test_reopened_idle_connections_do_not_keep_an_agent_out(tmp_path):
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump({"cluster": "gate", "layout": "roce", "nodes_per_unit": 4,
                                    "generate": {"nodes": 4, "gpus_per_node": 2, "rails": 2}}))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    gport, hport = free_port(), free_port()
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({
        "topology": str(topo), "grpc_listen": f"127.0.0.1:{gport}", "http_listen": f"127.0.0.1:{hport}",
        "tick_seconds": 0.1, "auth": {"token_file": str(token)},
        "grpc_limits": {"max_connections": LIMIT, "handshake_timeout_s": 1.0}}))
    log = open(tmp_path / "agg.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "fabricmon", "aggregator", "--config", str(cfg), "--log-format",
                          "json"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    attacker = Attacker(gport, "127.0.0.2")
    client = None
    try:
        assert wait_until(lambda: http_get(f"http://127.0.0.1:{hport}/readyz", timeout=5)[0] == 200, 30), \
            (tmp_path / "agg.log").read_text()
        attacker.start()
        # the attacker holds the limit: as many of its connections got the server's SETTINGS, and the
        # server closes the ones beyond
        assert wait_until(lambda: attacker.settled >= LIMIT and attacker.closed_by_server >= LIMIT, 20), \
            (attacker.settled, attacker.closed_by_server)
        opened = attacker.opened
        hello = NodeHello("node-000", "test", 1.0)
        client = StreamClient(f"127.0.0.1:{gport}", "node-000", lambda: hello, MemorySpool(), token=TOKEN,
                              backoff_min=0.05, backoff_max=0.5).start()
        t0 = time.monotonic()
        client.offer(Snapshot(node="node-000", ts=time.time(), seq=1, samples=(), deltas=(),
                              interval_seconds=1.0, sources=()))
        got_in = wait_until(lambda: client.stats()["batches_acked_total"] >= 1, AGENT_BOUND_S)
        waited = time.monotonic() - t0
        assert got_in, (f"the agent's stream did not get through in {AGENT_BOUND_S} s while the attacker "
                        f"re-opened connections", client.last_error, client.stats()["connect_failures_total"])
        assert attacker.opened > opened  # the attack went on meanwhile
        # the attack goes on: its connections keep being evicted, the agent's authenticated one never
        churned = attacker.closed_by_server
        assert wait_until(lambda: attacker.closed_by_server >= churned + 2 * LIMIT, 20)
        for seq in (2, 3):
            client.offer(Snapshot(node="node-000", ts=time.time(), seq=seq, samples=(), deltas=(),
                                  interval_seconds=1.0, sources=()))
        assert wait_until(lambda: client.stats()["batches_acked_total"] >= 3, 10), client.stats()
        assert client.stats()["connects_total"] == 1
        assert _metric(hport, 'fabricmon_grpc_connections{state="authenticated"}') == 1
        assert _metric(hport, 'fabricmon_grpc_connections_evicted_total{reason="unauthenticated"}') >= 2 * LIMIT
        assert _metric(hport, 'fabricmon_grpc_connections_refused_total{reason="limit"}') == 0
        assert p.poll() is None
        print(f"agent stream through in {waited:.2f} s; attacker opened {attacker.opened}, "
              f"closed by the server {attacker.closed_by_server}")
    finally:
        attacker.close()
        if client is not None:
            client.stop(2.0)
        p.terminate()
        p.wait(20)
        log.close()


def test_streams_come_through_the_gate_and_are_logged_with_the_clients_address():
    """Behind the gate gRPC sees the relay's loopback connection: the servicer marks the gate's connection
    authenticated, logs the client's own address, and refuses a stream sent straight to the internal socket
    (the gate's limit and eviction would not hold it); that socket's directory is the aggregator user's
    alone, and removed at stop."""
    engine = Engine(generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test"))
    srv = start_grpc_server(engine, "127.0.0.1:0", token="tok")
    auth = [("authorization", "Bearer tok")]
    hello = pb.AgentMessage(hello=codec.hello_to_pb(NodeHello("node-001", "raw", 1.0)))
    try:
        assert srv.gate is not None and srv.port == srv.gate.port
        backend_dir = os.path.dirname(srv.gate.backend)
        assert stat.S_IMODE(os.stat(backend_dir).st_mode) == 0o700  # no other local user reaches gRPC past the gate
        with capture_logs() as logs:
            client = StreamClient(srv.address, "node-001", lambda: NodeHello("node-001", "test", 1.0), MemorySpool(),
                                  token="tok").start()
            try:
                assert wait_until(lambda: client.connected, 15), client.last_error
                (conn,) = srv.gate.conns.values()
                assert conn.authenticated and srv.stats()["connections_authenticated"] == 1
            finally:
                client.stop(2.0)
        connected = next(e for e in logs if e["event"] == "stream_connected" and "peer" in e)
        assert connected["peer"] == conn.peer  # the client's address, as the gate accepted it
        assert conn.peer.startswith("ipv4:127.0.0.1:") and conn.inner_key.startswith("unix-abstract:")
        direct = raw_stream(f"unix:{srv.gate.backend}", [hello], metadata=auth)
        assert direct == ([], grpc.StatusCode.UNAUTHENTICATED)
        st = srv.stats()
        assert st["unauthenticated_total"] == 1 and st["connections_limit"] == 1024
        assert st["connections_refused_limit_total"] == 0
    finally:
        srv.stop(0.5)
    assert not os.path.exists(backend_dir)


def test_without_the_gate_grpc_listens_itself():
    """``grpc_limits.connection_gate: false``: gRPC holds the port and its own limit (no relay, no eviction)."""
    engine = Engine(generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test"))
    srv = start_grpc_server(engine, "127.0.0.1:0", connection_gate=False)
    try:
        assert srv.gate is None and "connections_limit" not in srv.stats()
        client = StreamClient(srv.address, "node-001", lambda: NodeHello("node-001", "test", 1.0), MemorySpool())
        client.start()
        try:
            assert wait_until(lambda: client.connected, 15), client.last_error
        finally:
            client.stop(2.0)
    finally:
        srv.stop(0.5)
