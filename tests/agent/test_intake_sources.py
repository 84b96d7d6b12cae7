"""Local users at the rank intake (issue 35 items 2, 16; docs/security.md): through the real Unix socket
and loopback HTTP listeners, a user posting another job's heartbeats neither raises nor hides JobHung,
the heartbeats are judged on the agent's receipt time, and made-up job names cannot fill the job slots.

The real ranks speak over the socket (source: the test's uid, by SO_PEERCRED); the hostile user posts over
loopback HTTP, which every local user can reach: two sources for one (job, rank)."""

from __future__ import annotations

import http.client
import json
import os

import pytest

from fabricmon.agent.intake import RankIntake
from fabricmon.aggregator.hangs import HeartbeatTracker
from fabricmon.client import send_line

RANKS = 16
STUCK = 9  # the rank the others wait for


def _post(port: int, lines: list[str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/ranks", body="\n".join(lines).encode())
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _beat(rank: int, coll_sn: int, in_coll: bool, ts: float | None = None) -> str:
    obj: dict = {"job": "llm-70b", "job_id": "slurm-7", "rank": rank,
                 "heartbeat": {"step": 3, "coll_sn": coll_sn, "in_collective": in_coll}}
    if ts is not None:
        obj["ts"] = ts
    return json.dumps(obj)


@pytest.fixture
def intake(tmp_path):
    now = [1_764_000_000.0]
    it = RankIntake("node-1", socket_path=str(tmp_path / "ranks.sock"), listen="127.0.0.1:0",
                    clock=lambda: now[0]).start()
    try:
        yield it, now
    finally:
        it.stop()


def _run(intake, now, *, real_hung: bool) -> HeartbeatTracker:
    """12 heartbeat rounds 5 s apart: the real ranks over the socket, then the hostile user's copies over
    HTTP stamped 3 s ahead (frozen when the job is healthy, moving when it is hung)."""
    it, sock = intake, it_sock(intake)
    tracker = HeartbeatTracker(stall_s=20.0)
    for k in range(12):
        now[0] += 5.0
        real = [_beat(r, 100 if real_hung else 100 + k, not (real_hung and r == STUCK)) for r in range(RANKS)]
        assert send_line("\n".join(real), socket_path=sock, http="")
        fake = [_beat(r, 500 + k if real_hung else 7, r != STUCK, ts=now[0] + 3.0) for r in range(RANKS)]
        _, body = _post(it.http_port, fake)
        assert body["rejected"] == RANKS, body  # a counted conflict, not a takeover
        for hb in it.drain_heartbeats():
            assert hb.ts == now[0]  # the agent's receipt time, never the client's
            tracker.add(hb, "node-1")
    return tracker


def it_sock(it: RankIntake) -> str:
    assert it.socket_path
    return it.socket_path


def test_another_user_s_heartbeats_neither_raise_nor_hide_job_hung(intake):
    it, now = intake
    assert _run(it, now, real_hung=False).hangs(now[0]) == []  # healthy: no JobHung from a frozen copy
    hung = _run(it, now, real_hung=True).hangs(now[0])
    assert [(h.job, h.ranks) for h in hung] == [("llm-70b", (STUCK,))]  # hung: not hidden by a moving copy
    counts = {dict(r.labels)["reason"]: r.value for r in it.self_readings()
              if r.family == "fabricmon_intake_lines_total" and dict(r.labels)["result"] == "rejected"}
    assert counts["conflict"] == 2 * 12 * RANKS


def test_made_up_job_names_cannot_fill_the_job_slots_and_the_socket_client_is_told(intake):
    it, now = intake
    sock = it_sock(it)
    # one local user (this test's uid over the socket) fills every slot with made-up names
    flood = [json.dumps({"job": f"fake-{i}", "rank": 0, "step": 1, "step_seconds": 1.0}) for i in range(64)]
    assert send_line("\n".join(flood), socket_path=sock, http="")
    # one more name from the same user is refused, and the client over the socket is told so
    assert send_line(json.dumps({"job": "fake-64", "rank": 0, "step": 1, "step_seconds": 1.0}),
                     socket_path=sock, http="") is False
    # another source (loopback HTTP) with a real job gets in: the flooder's least recently used job makes room
    status, body = _post(it.http_port, [json.dumps({"job": "real", "rank": 0, "step": 1, "step_seconds": 1.0})])
    assert status == 200 and body["accepted"] == 1, body
    counts = {dict(r.labels)["reason"]: r.value for r in it.self_readings()
              if r.family == "fabricmon_intake_lines_total" and dict(r.labels)["result"] == "rejected"}
    assert counts["job_limit"] == 1
    assert os.path.exists(sock)


def test_another_user_s_line_naming_another_gpu_never_reaches_the_rank_s_history(intake):
    """Issue 35 item 3 at the intake: rank 11's real lines over the socket, a line for it naming GPU 6 over
    HTTP once per step: refused as a conflict, so the aggregator's straggler tracker never sees it."""
    from fabricmon.aggregator.config import DetectionSettings
    from fabricmon.aggregator.stragglers import StragglerTracker

    it, now = intake
    tr = StragglerTracker(DetectionSettings())
    for step in range(1, 30):
        now[0] += 2.0
        real = [json.dumps({"job": "llm-7b", "rank": r, "local_rank": r % 8, "step": step,
                            "step_seconds": 2.2 if r == 11 else 2.0, "comm_seconds": 0.3 if r == 11 else 0.5,
                            "ts": now[0]}) for r in range(16)]
        assert send_line("\n".join(real), socket_path=it_sock(it), http="")
        _, body = _post(it.http_port, [json.dumps({"job": "llm-7b", "rank": 11, "local_rank": 3, "gpu": 6,
                                                   "step": step, "step_seconds": 2.0, "ts": now[0] + 1.0})])
        assert body["rejected"] == 1, body
        ranks, _ = it.drain()
        for rt in ranks:
            tr.add(rt, "node-1")
        tr.evaluate(now[0])
    assert [(s.rank, s.node, s.gpu) for s in tr.evaluate(now[0]).stragglers] == [(11, "node-1", 3)]
    assert tr.moves_total == 0
