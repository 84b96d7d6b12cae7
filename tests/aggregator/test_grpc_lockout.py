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
