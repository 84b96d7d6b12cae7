"""Rank intake under hostile input: wire ranges, bad strings, series bounds, slow clients, self-metrics."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import AgentHTTPServer, RenderedSnapshot
from fabricmon.agent.intake import RankIntake
from fabricmon.agent.poller import Poller
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.sources.inventory import Inventory
from support.waiting import wait_until

GOOD = {"job": "llm-7b", "rank": 17, "local_rank": 1, "step": 1200, "step_seconds": 1.82, "comm_seconds": 0.41,
        "ts": 1764000000.5}


@pytest.fixture
def intake(tmp_path):
    it = RankIntake("node-017", socket_path=str(tmp_path / "ranks.sock"), listen="127.0.0.1:0").start()
    yield it
    it.stop()


def post(port: int, body: bytes):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/ranks", body=body)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def to_wire(t) -> bytes:
    """What the stream does with a drained timing; raises where the wire cannot carry it."""
    return pb.RankTiming(job=t.job, rank=t.rank, local_rank=t.local_rank, step=t.step, step_seconds=t.step_seconds,
                         comm_seconds=t.comm_seconds, ts=t.ts, gpu=t.gpu,
                         group=[pb.IntPair(key=k, value=v) for k, v in t.group]).SerializeToString()


def lines_total(intake: RankIntake) -> dict[tuple[str, str], float]:
    return {(dict(r.labels)["result"], dict(r.labels)["reason"]): r.value for r in intake.poll(None).readings
            if r.family == "fabricmon_intake_lines_total"}


def scrape_agent(sources) -> str:
    """Poll the sources once and scrape /metrics of a real agent HTTP server."""
    poller = Poller("node-017", sources, discover=lambda: Inventory(sysfs_root=""))
    rendered = RenderedSnapshot(lambda: poller.latest)
    poller.poll_once()
    srv = AgentHTTPServer("127.0.0.1", 0, metrics=rendered.body, not_ready=lambda: [])
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200
        return r.read().decode("utf-8")
    finally:
        srv.stop()


@pytest.mark.parametrize("field,value", [
    ("rank", 4294967296), ("local_rank", 2**32), ("step", 2**64), ("gpu", 2**31), ("rank", -1),
    ("step_seconds", -0.5), ("comm_seconds", 1e300), ("ts", -1.0), ("rank", 1.5), ("rank", True), ("step", "7"),
])
def test_out_of_wire_range_rank_line_is_rejected_over_http(intake, field, value):
    status, body = post(intake.http_port, json.dumps({**GOOD, field: value}).encode())
    assert status == 400 and body["rejected"] == 1
    assert post(intake.http_port, json.dumps(GOOD).encode())[0] == 200
    ranks, _ = intake.drain()
    assert [t.rank for t in ranks] == [17]
    for t in ranks:
        to_wire(t)  # everything that reaches a RankTiming fits the wire


def test_case1_line_from_issue_never_reaches_the_stream(intake):
    status, body = post(intake.http_port, b'{"job":"j","rank":4294967296,"step":1,"step_seconds":1}')
    assert status == 400 and body["rejected"] == 1 and "rank" in body["errors"][0]
    assert intake.drain() == ([], [])
    assert lines_total(intake)[("rejected", "out_of_range")] == 1


@pytest.mark.parametrize("raw", [
    b'{"job":"\\ud800","rank":0,"step":1,"step_seconds":1}',       # lone surrogate escape
    b'{"job":"a\\u0000b","rank":0,"step":1,"step_seconds":1}',      # control character
    b'{"job":"\xed\xa0\x80","rank":0,"step":1,"step_seconds":1}',    # surrogate encoded as UTF-8 bytes
    b'{"job":"\xff","rank":0,"step":1,"step_seconds":1}',            # not UTF-8
    b'{"job":"j","rank":0,"step":1,"step_seconds":NaN}',             # JSON extension constants
    b'{"job":"j","rank":0,"step":1,"step_seconds":1,"group":{"\\udfff":1}}',
    b'{"job":"\\udfff","layout":{"tp":2}}',
    b"[" * 60000,                                                    # nesting deep enough to recurse
])
def test_invalid_strings_are_rejected_and_scrape_survives(intake, raw):
    status, body = post(intake.http_port, raw)
    assert status == 400 and body["rejected"] == 1
    post(intake.http_port, json.dumps(GOOD).encode())
    text = scrape_agent([intake])
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["fabricmon_rank_step_seconds"].samples[0].labels["hpc_job"] == "llm-7b"


def test_series_are_bounded_and_drops_counted(tmp_path):
    it = RankIntake("n", max_jobs=16, max_series=64)
    body = "\n".join(json.dumps({**GOOD, "job": f"job-{i}", "rank": 0}) for i in range(5000))
    acc, rej, _ = it.submit_lines(body)
    assert acc == 16 and rej == 4984
    body = "\n".join(json.dumps({**GOOD, "job": "job-0", "rank": r}) for r in range(1000))
    it.submit_lines(body)
    readings = it.poll(None).readings
    steps = [r for r in readings if r.family == "fabricmon_rank_step_seconds"]
    assert len(steps) == 64
    counts = lines_total(it)
    assert counts[("rejected", "job_limit")] == 4984
    assert counts[("rejected", "series_limit")] == 1000 - (64 - 15)
    text = scrape_agent([it])
    assert len(text) < 64 * 1024
    list(text_string_to_metric_families(text))


def test_idle_series_and_jobs_expire():
    now = [1000.0]
    it = RankIntake("n", max_jobs=2, latest_ttl=60.0, clock=lambda: now[0])
    assert it.submit_line(json.dumps({**GOOD, "job": "a"}))[0]
    assert it.submit_line(json.dumps({**GOOD, "job": "b"}))[0]
    assert not it.submit_line(json.dumps({**GOOD, "job": "c"}))[0]
    now[0] += 61
    assert [r for r in it.poll(None).readings if r.family == "fabricmon_rank_step_seconds"] == []
    assert it.submit_line(json.dumps({**GOOD, "job": "c"}))[0]  # the expired jobs freed their slots


def test_self_metrics_have_fixed_label_sets(intake):
    before = lines_total(intake)
    assert before and all(v == 0 for v in before.values())
    post(intake.http_port,
         b"not json\n" + json.dumps(GOOD).encode() + b"\n" + json.dumps({**GOOD, "rank": -3}).encode())
    after = lines_total(intake)
    assert set(after) == set(before)  # reasons are an enum: no new series from input
    assert after[("accepted", "ok")] == 1 and after[("rejected", "not_json")] == 1
    assert after[("rejected", "out_of_range")] == 1
    text = scrape_agent([intake])
    fams = {f.name for f in text_string_to_metric_families(text)}
    assert "fabricmon_intake_lines" in fams and "fabricmon_intake_connections_closed" in fams


def test_slow_unix_clients_are_bounded_and_a_legit_rank_is_served(tmp_path):
    it = RankIntake("n", socket_path=str(tmp_path / "r.sock"), max_connections=32, idle_timeout=30.0).start()
    slow: list[socket.socket] = []
    try:
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(it.socket_path)  # blocking: waits for backlog room instead of EAGAIN
            s.settimeout(5)
            s.sendall(b'{"job":')  # never finishes its line
            slow.append(s)
        assert wait_until(lambda: it.stats()["connections"] <= 32 and it.stats()["connections_closed"] >= 268)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(it.socket_path)
            s.sendall(json.dumps(GOOD).encode() + b"\n")
            assert wait_until(lambda: it.stats()["accepted_total"] == 1)
    finally:
        for s in slow:
            s.close()
        it.stop()


def test_idle_unix_client_is_closed_after_the_timeout(tmp_path):
    it = RankIntake("n", socket_path=str(tmp_path / "r.sock"), idle_timeout=0.3).start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(it.socket_path)
            s.sendall(b'{"job"')
            assert s.recv(1) == b""  # the intake hung up on the idle client
        assert wait_until(lambda: it.stats()["connections_closed"] >= 1)
    finally:
        it.stop()


def test_slow_http_clients_are_bounded_and_a_legit_post_is_served():
    it = RankIntake("n", listen="127.0.0.1:0", max_connections=16).start()
    slow: list[socket.socket] = []
    try:
        base = threading.active_count()
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", it.http_port), timeout=5)
            s.sendall(b"POST /v1/ranks HTTP/1.1\r\nHost: x\r\n")  # headers never end
            slow.append(s)
        status, body = post(it.http_port, json.dumps(GOOD).encode())
        assert status == 200 and body["accepted"] == 1
        assert threading.active_count() <= base + 16 + 8
    finally:
        for s in slow:
            s.close()
        it.stop()
