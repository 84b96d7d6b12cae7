"""Rank-timing intake (Unix socket, loopback HTTP) and the stdlib client."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import time

import pytest
from structlog.testing import capture_logs

from fabricmon import client as fm_client
from fabricmon.agent.intake import RankIntake
from fabricmon.rank_timing import JobLayout, RankTiming
from support.paths import REPO
from support.waiting import wait_until

GOOD = {"job": "llm-7b", "rank": 17, "local_rank": 1, "step": 1200, "step_seconds": 1.82, "comm_seconds": 0.41,
        "ts": 1764000000.5}


@pytest.fixture
def intake(tmp_path):
    it = RankIntake("node-017", socket_path=str(tmp_path / "run" / "fabricmon" / "ranks.sock"),
                    listen="127.0.0.1:0").start()
    yield it
    it.stop()


def _post(port: int, body: bytes, path: str = "/v1/ranks"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", path, body=body)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def test_unix_socket_good_and_bad_lines(intake, tmp_path):
    path = intake.socket_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750
    lines = [json.dumps(GOOD), "not json", json.dumps({**GOOD, "rank": -1}),
             json.dumps({"job": "llm-7b", "layout": {"tp": 8}}),
             json.dumps({**GOOD, "rank": 18, "step_seconds": 2.5})]
    with capture_logs() as logs:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            payload = ("\n".join(lines) + "\n").encode()
            s.sendall(payload[:37])  # split mid-line: reassembled
            time.sleep(0.05)
            s.sendall(payload[37:])
        assert wait_until(lambda: intake.stats()["accepted_total"] == 3 and intake.stats()["rejected_total"] == 2)
    assert any(e["event"] == "rank_line_rejected" and e["reason"] == "not_json" for e in logs)
    ranks, layouts = intake.drain()
    assert [r.rank for r in ranks] == [17, 18] and all(r.node == "node-017" for r in ranks)
    assert layouts == [JobLayout("llm-7b", (("tp", 8),))]
    assert intake.drain() == ([], [])
    assert intake.layouts() == [JobLayout("llm-7b", (("tp", 8),))]
    got = {(r.family, r.labels): r.value for r in intake.readings()}
    assert got[("fabricmon_rank_step_seconds", (("hpc_job", "llm-7b"), ("job_id", ""), ("rank", "18")))] == 2.5
    assert got[("fabricmon_rank_comm_seconds", (("hpc_job", "llm-7b"), ("job_id", ""), ("rank", "17")))] == 0.41


def test_overlong_line_is_rejected_and_the_connection_recovers(intake):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(intake.socket_path)
        s.sendall(b"x" * 200_000 + b"\n" + json.dumps(GOOD).encode() + b"\n")
    assert wait_until(lambda: intake.stats()["accepted_total"] == 1)
    assert intake.stats()["rejected_total"] == 1


def test_http_counts_accepted_and_rejected(intake):
    body = (json.dumps(GOOD) + "\n{bad\n" + json.dumps({**GOOD, "job": ""}) + "\n").encode()
    status, reply = _post(intake.http_port, body)
    assert status == 200 and reply["accepted"] == 1 and reply["rejected"] == 2
    assert len(reply["errors"]) == 2
    status, reply = _post(intake.http_port, b"nope\n")
    assert status == 400 and reply["rejected"] == 1
    assert _post(intake.http_port, b"", path="/other")[0] == 404


def test_refuses_non_loopback_listen():
    with pytest.raises(ValueError, match="loopback"):
        RankIntake("n", listen="0.0.0.0:9723")
    with pytest.raises(ValueError, match="loopback"):
        RankIntake("n", listen="10.1.2.3:9723")
    RankIntake("n", listen="[::1]:0")  # loopback v6 is fine (not started)


def test_buffer_is_bounded_oldest_dropped():
    it = RankIntake("n", max_buffer=3)
    for step in range(10):
        it.submit_line(json.dumps({**GOOD, "step": step}))
    ranks, _ = it.drain()
    assert [r.step for r in ranks] == [7, 8, 9] and it.counts.dropped_total == 7


def test_two_jobs_of_one_name_stay_apart_by_job_id():
    """job_id is the job's identity (DESIGN "Jobs, decoys and cost"): two jobs named `train` on one node
    are two series each rank, labelled by job_id; a job that sends none has no job_id label value."""
    it = RankIntake("n")
    for job_id, step_s in (("slurm-1", 2.0), ("slurm-2", 3.0), (None, 4.0)):
        line = {**GOOD, "job": "train", "step_seconds": step_s}
        if job_id:
            line["job_id"] = job_id
        assert it.submit_line(json.dumps(line))[0]
    got = {(r.labels, r.value) for r in it.readings() if r.family == "fabricmon_rank_step_seconds"}
    assert got == {((("hpc_job", "train"), ("job_id", jid), ("rank", "17")), v)
                   for jid, v in (("slurm-1", 2.0), ("slurm-2", 3.0), ("", 4.0))}


def test_missing_ts_defaults_to_receive_time_and_source_poll():
    it = RankIntake("n", clock=lambda: 123.0)
    assert it.submit_line(json.dumps({k: v for k, v in GOOD.items() if k != "ts"}))[0]
    assert it.drain()[0][0].ts == 123.0
    assert {r.family for r in it.poll(None).readings if r.family.startswith("fabricmon_rank_")} == {
        "fabricmon_rank_step_seconds", "fabricmon_rank_comm_seconds"}


def test_client_report_step_over_socket(intake):
    ok = fm_client.report_step("llm-7b", 3, 10, 1.25, 0.5, local_rank=3, group={"tp": 3},
                               socket_path=intake.socket_path, http=None)
    assert ok
    assert fm_client.report_layout("llm-7b", {"tp": 8}, socket_path=intake.socket_path, http=None)
    assert wait_until(lambda: intake.stats()["accepted_total"] == 2)
    ranks, layouts = intake.drain()
    r = ranks[0]
    assert (r.job, r.rank, r.local_rank, r.step, r.step_seconds, r.comm_seconds, r.group) == \
        ("llm-7b", 3, 3, 10, 1.25, 0.5, (("tp", 3),))
    assert isinstance(r, RankTiming) and layouts[0].job == "llm-7b"


def test_client_falls_back_to_http(intake, tmp_path):
    ok = fm_client.report_step("llm-7b", 4, 11, 1.0, socket_path=str(tmp_path / "missing.sock"),
                               http=f"http://127.0.0.1:{intake.http_port}/v1/ranks")
    assert ok and intake.drain()[0][0].rank == 4


def test_client_without_agent_returns_false_fast(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens
    t0 = time.monotonic()
    assert fm_client.report_step("j", 0, 1, 1.0, socket_path=str(tmp_path / "none.sock"),
                                 http=f"http://127.0.0.1:{port}/v1/ranks") is False
    assert fm_client.report_step("j", 0, 1, float("nan"), socket_path=str(tmp_path / "none.sock"), http=None) is False
    assert fm_client.report_step("j", "not-a-rank", 1, 1.0, socket_path=str(tmp_path / "none.sock"), http=None) is False
    assert time.monotonic() - t0 < 1.0


def test_example_hook_imports_without_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("FABRICMON_RANKS_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setenv("FABRICMON_RANKS_HTTP", "")
    import importlib.util

    path = REPO / "examples" / "pytorch_hook.py"
    spec = importlib.util.spec_from_file_location("pytorch_hook_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    timer = mod.StepTimer("j", rank=0, local_rank=0)
    with timer.step(0):
        with timer.comm():
            pass
    timer.close()


@pytest.mark.parametrize(("env", "want"), [
    ({"FABRICMON_JOB_ID": "fm-1", "SLURM_JOB_ID": "81723", "TORCHELASTIC_RUN_ID": "te-9"}, "fm-1"),
    ({"SLURM_JOB_ID": "81723", "TORCHELASTIC_RUN_ID": "te-9"}, "81723"),
    ({"TORCHELASTIC_RUN_ID": "te-9"}, "te-9"),
    ({}, ""),
])
def test_report_step_tags_the_job_id_from_the_scheduler_environment(intake, monkeypatch, env, want):
    for k in fm_client.JOB_ID_ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert fm_client.report_step("llm-7b", 3, 10, 1.25, socket_path=intake.socket_path, http=None)
    assert fm_client.report_step("llm-7b", 3, 11, 1.25, socket_path=intake.socket_path, http=None, job_id="x-2")
    assert wait_until(lambda: intake.stats()["accepted_total"] == 2)
    assert [r.job_id for r in intake.drain()[0]] == [want, "x-2"]


def test_step_timer_defaults_to_the_slurm_job_and_beats_with_coll_sn(intake, monkeypatch):
    """StepTimer lives in fabricmon.client (the example imports it): job from $SLURM_JOB_NAME, job_id from
    $SLURM_JOB_ID, heartbeats on, coll_sn counting the collectives comm() wraps."""
    for k in fm_client.JOB_ID_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    timer = fm_client.StepTimer(rank=5, socket_path=intake.socket_path, http=None, heartbeat_interval=0.05)
    try:
        assert (timer.job, timer.job_id) == ("train", "4242")
        with timer.step(7):
            with timer.comm():
                assert timer.heartbeat.in_collective
            with timer.comm():
                pass
        assert timer.heartbeat.coll_sn == 2 and not timer.heartbeat.in_collective
        beats: list = []
        assert wait_until(lambda: any(h.coll_sn == 2 for h in beats.extend(intake.drain_heartbeats()) or beats))
        ranks, _ = intake.drain()
    finally:
        timer.close()
    assert [(r.job, r.job_id, r.rank, r.step) for r in ranks] == [("train", "4242", 5, 7)]
    assert {(h.job, h.job_id, h.rank) for h in beats} == {("train", "4242", 5)}
