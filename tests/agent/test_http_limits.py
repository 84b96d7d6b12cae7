"""HTTP listeners under slow clients, and an exposition that survives any label value."""

from __future__ import annotations

import http.client
import socket
import threading
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import AgentHTTPServer, RenderedSnapshot, exposition, make_registry
from fabricmon.httpserve import RoutedHTTPServer
from fabricmon.model import Sample, Snapshot, SourceStatus
from support.waiting import wait_until


def snapshot(*jobs: str) -> Snapshot:
    return Snapshot(node="n1", ts=5.0, seq=1, samples=tuple(
        Sample("fabricmon_rank_step_seconds", (("hpc_job", j), ("job_id", ""), ("rank", "0")), 1.0) for j in jobs
    ) + (Sample("fabricmon_host_load1", (), 0.5),), deltas=(), interval_seconds=0.0,
        sources=(SourceStatus("host", True, True, 0.001, 0),))


def test_a_bad_label_value_costs_its_series_not_the_scrape():
    snap = snapshot("good", "\ud800", "x\udfffy", "ok\u00e9")
    for body in (exposition(snap, now=5.0), RenderedSnapshot(lambda: snap).body(),
                 generate_latest(make_registry(lambda: snap, clock=lambda: 5.0))):
        fams = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
        assert sorted(s.labels["hpc_job"] for s in fams["fabricmon_rank_step_seconds"].samples) == ["good", "ok\u00e9"]
        assert fams["fabricmon_host_load1"].samples[0].value == 0.5


def test_a_label_value_that_is_not_a_string_costs_its_series():
    snap = snapshot("good")
    snap = Snapshot(node="n1", ts=5.0, seq=1, samples=(*snap.samples,
                    Sample("fabricmon_rank_step_seconds", (("hpc_job", None), ("job_id", ""), ("rank", 3)), 1.0)),
                    deltas=(), interval_seconds=0.0, sources=())
    for body in (exposition(snap, now=5.0), generate_latest(make_registry(lambda: snap, clock=lambda: 5.0))):
        fams = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
        assert [s.labels["hpc_job"] for s in fams["fabricmon_rank_step_seconds"].samples] == ["good"]


def test_a_bad_node_name_does_not_break_the_scrape():
    snap = Snapshot(node="n\ud800", ts=5.0, seq=1, samples=(Sample("fabricmon_host_load1", (), 0.5),), deltas=(),
                    interval_seconds=0.0, sources=())
    list(text_string_to_metric_families(exposition(snap, now=5.0).decode("utf-8")))


def scrape(port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_slowloris_on_metrics_is_bounded_and_a_scrape_still_succeeds():
    snap = snapshot("good")
    srv = AgentHTTPServer("127.0.0.1", 0, metrics=lambda: exposition(snap), not_ready=lambda: [])
    srv.start()
    slow: list[socket.socket] = []
    try:
        base = threading.active_count()
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-a: " if i % 2 else b"G")  # never completes its headers
            slow.append(s)
        status, body = scrape(srv.port)
        assert status == 200
        list(text_string_to_metric_families(body.decode()))
        assert threading.active_count() <= base + srv.max_connections + 8
        assert wait_until(lambda: srv.stats()["closed_total"] >= 300 - srv.max_connections)
    finally:
        for s in slow:
            s.close()
        srv.stop()


def test_header_timeout_closes_a_silent_client():
    srv = RoutedHTTPServer("127.0.0.1", 0, {"/x": lambda q: (200, b"x", "text/plain")}, header_timeout=0.3)
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /x HTTP/1.1\r\n")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # drip one header byte at a time, as slowloris does
                try:
                    s.sendall(b"a")
                except OSError:
                    break
                s.settimeout(0.05)
                try:
                    if s.recv(1024) == b"":
                        break
                except TimeoutError:
                    pass
            assert time.monotonic() < deadline
        assert wait_until(lambda: srv.stats()["closed_total"] >= 1)
    finally:
        srv.stop()


def test_keepalive_client_is_served_repeatedly():
    srv = RoutedHTTPServer("127.0.0.1", 0, {"/x": lambda q: (200, b"x", "text/plain")}, header_timeout=2.0)
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        for _ in range(5):
            conn.request("GET", "/x")
            assert conn.getresponse().read() == b"x"
        conn.close()
    finally:
        srv.stop()
