"""No client without a credential locks the HTTP listeners (issue 26, "Lockouts without a credential").

Real listeners on 127.0.0.1 and real sockets: clients that pipeline GETs and never read the
responses, clients that announce a large body and stall it, floods of wrong passwords.  The
scrapes and posts of honest clients are served while they last, and each refusal is counted.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading

import pytest

from fabricmon.agent.intake import RankIntake
from fabricmon.httpserve import RoutedHTTPServer
from fabricmon.webconfig import WebConfig
from support.waiting import wait_until

BODY = b"# a /metrics body of a busy aggregator\n" + b"fabricmon_x{a=\"b\"} 1\n" * 3000  # ~66 KB


def _scrape(port: int, headers: dict | None = None, timeout: float = 5.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        r = conn.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def test_pipelined_gets_that_never_read_do_not_stop_the_scrapes():
    srv = RoutedHTTPServer("127.0.0.1", 0, {"/metrics": lambda q: (200, BODY, "text/plain")})
    srv.start()
    hostile: list[socket.socket] = []
    try:
        # more than max_connections (64), each with 200 requests in one write; 16 over the limit so the
        # backlog still holds a stalled writer when each of the 8 scrapes ends: with only 6 over, the eighth
        # scrape found the slot the seventh freed and cut nobody (a fresh-clone run: 7 cuts, 63 connections)
        for _ in range(80):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
            hostile.append(s)
        # every slot is taken by a connection blocked writing a response nobody reads
        assert wait_until(lambda: srv.stats()["connections"] >= srv.max_connections, 10), srv.stats()
        served = [_scrape(srv.port) for _ in range(8)]
        assert served == [200] * 8, (served, srv.stats())
        # each scrape made room by cutting a stalled writer: at the connection limit, or, on a machine slow
        # enough to reach it during the test, at the writer's 10 s write deadline (a run under load: 7 + 1)
        st = srv.stats()
        assert st.get("closed_limit", 0) + st.get("closed_timeout", 0) >= 8, st
        assert st.get("closed_limit", 0) >= 1, st
        body = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        body.request("GET", "/metrics")
        text = body.getresponse().read().decode()
        assert 'fabricmon_http_connections_closed_total{reason="limit"}' in text
    finally:
        for s in hostile:
            s.close()
        srv.stop()


def test_a_stalled_writer_is_cut_at_the_write_deadline():
    srv = RoutedHTTPServer("127.0.0.1", 0, {"/metrics": lambda q: (200, BODY, "text/plain")}, write_timeout=0.5)
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
            assert wait_until(lambda: srv.stats()["closed_timeout"] >= 1, 10), srv.stats()
    finally:
        srv.stop()


def test_stalled_bodies_do_not_stop_the_rank_intake(tmp_path):
    intake = RankIntake("node-017", listen="127.0.0.1:0").start()
    hostile: list[socket.socket] = []
    try:
        port = intake.http_port
        for _ in range(64):  # every connection slot: a large Content-Length, 10 bytes, then nothing
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/ranks HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n{\"job\": \"x")
            hostile.append(s)
        assert wait_until(lambda: intake._http.stats()["connections"] >= 64, 10)
        good = json.dumps({"job": "llm", "rank": 0, "step": 1, "step_seconds": 1.0, "comm_seconds": 0.1,
                           "ts": 1_764_000_000.0}).encode()
        codes = []
        for _ in range(6):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("POST", "/v1/ranks", body=good)
                codes.append(conn.getresponse().status)
            except (OSError, http.client.HTTPException):
                codes.append(0)
            finally:
                conn.close()
        assert codes == [200] * 6, (codes, intake._http.stats())
        assert intake._http.stats()["closed_limit"] >= 1  # a stalled body made room
        # the bodies cut off were never read as rank lines
        assert intake.stats()["rejected_total"] == 0 and intake.stats()["accepted_total"] == 6
    finally:
        for s in hostile:
            s.close()
        intake.stop()


# ---------------------------------------------------------------- basic auth

bcrypt = pytest.importorskip("bcrypt", reason="basic_auth_users needs the bcrypt package")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_an_unknown_user_costs_the_same_bcrypt_check_as_a_wrong_password(monkeypatch):
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=5))
    web = WebConfig("web.yml", users={"prometheus": hashed})
    checked: list[bytes] = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: checked.append(h) or real(pw, h))
    assert web.check(_basic("prometheus", "wrong")["Authorization"]) == "denied"
    assert web.check(_basic("nobody", "wrong")["Authorization"]) == "denied"
    assert web.check(_basic("nobody", "right")["Authorization"]) == "denied"  # the dummy never lets one in
    assert len(checked) == 3
    # the unknown user's check ran against a hash of the same cost ($2b$05$...), not the user's own
    assert checked[1] != hashed and checked[1].split(b"$")[2] == hashed.split(b"$")[2] == b"05"
    assert web.check(_basic("prometheus", "right")["Authorization"]) == "ok"


def test_more_concurrent_failed_checks_than_allowed_get_429_and_the_scraper_still_gets_in(monkeypatch):
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))
    web = WebConfig("web.yml", users={"prometheus": hashed}, max_concurrent_checks=2)
    release = threading.Event()
    entered = threading.Semaphore(0)
    real = bcrypt.checkpw

    def slow(pw: bytes, h: bytes) -> bool:  # a wrong password holds its check until released
        if pw != b"right":
            entered.release()
            release.wait(10)
        return real(pw, h)

    monkeypatch.setattr(bcrypt, "checkpw", slow)
    srv = RoutedHTTPServer("127.0.0.1", 0, {"/metrics": lambda q: (200, b"ok\n", "text/plain")}, web=web)
    srv.start()
    try:
        assert _scrape(srv.port, _basic("prometheus", "right")) == 200  # remembered from now on
        held = [threading.Thread(target=_scrape, args=(srv.port, _basic("prometheus", f"guess{i}")))
                for i in range(2)]
        for t in held:
            t.start()
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)  # both slots busy
        assert [_scrape(srv.port, _basic("x", f"guess{i}")) for i in range(5)] == [429] * 5
        assert _scrape(srv.port, _basic("prometheus", "right")) == 200
        release.set()
        for t in held:
            t.join(10)
        assert srv.stats()["auth_throttled"] == 5 and srv.stats()["auth_wrong"] == 2
    finally:
        release.set()
        srv.stop()
