"""Heartbeats and hung jobs (DESIGN "Jobs, decoys and cost"): client -> intake -> wire -> JobHung."""

from __future__ import annotations

import json
import math
import os
import tempfile

import pytest

from fabricmon.agent.intake import RankIntake
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.hangs import HeartbeatTracker
from fabricmon.batch import NodeBatch
from fabricmon.client import start_heartbeat
from fabricmon.proto import fabricmon_pb2 as pb
from fabricmon.proto.codec import MalformedBatch, SeriesDecoder, SeriesEncoder
from fabricmon.rank_timing import Heartbeat, RankTimingError, heartbeat_json, parse_line
from fabricmon.sim.drive import Drive
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import scenario_from_dict
from support.waiting import wait_until

pytest.importorskip("numpy")


def test_heartbeat_lines_parse_and_bad_ones_are_refused():
    h = parse_line('{"job":"llm-70b","job_id":"slurm-81723","rank":17,"heartbeat":{"step":1200,"coll_sn":48211,'
                   '"in_collective":true},"ts":1764000000.5}', node="gpu-a17-03")
    assert h == Heartbeat("llm-70b", 17, 1200, 48211, True, 1764000000.5, "gpu-a17-03", "slurm-81723")
    assert parse_line(heartbeat_json(h)) == h
    for bad, reason in (('{"job":"j","rank":1,"heartbeat":[1]}', "bad_type"),
                        ('{"job":"j","rank":1,"heartbeat":{"step":1,"in_collective":"yes"}}', "bad_type"),
                        ('{"job":"j","rank":1,"heartbeat":{"step":-1}}', "out_of_range")):
        with pytest.raises(RankTimingError) as exc:
            parse_line(bad, now=1.0)
        assert exc.value.reason == reason


def test_heartbeats_cross_the_wire_and_bad_values_are_refused_at_decode():
    hb = Heartbeat("j", 3, 10, 21, False, 1764000000.0, "", "id-1")
    enc = SeriesEncoder().encode(NodeBatch("n", 1, 1764000000.0, 1.0, heartbeats=(hb,)))
    got = SeriesDecoder().decode(pb.Batch.FromString(enc.SerializeToString()), "n")
    assert got.heartbeats == (Heartbeat("j", 3, 10, 21, False, 1764000000.0, "n", "id-1"),)
    enc.heartbeats[0].ts = math.nan
    with pytest.raises(MalformedBatch, match="heartbeats"):
        SeriesDecoder().decode(enc, "n")


def test_client_heartbeat_thread_reaches_the_intake_over_one_connection():
    d = tempfile.mkdtemp(prefix="fm-hb-")
    sock = os.path.join(d, "ranks.sock")
    intake = RankIntake("node-1", socket_path=sock).start()
    hb = start_heartbeat("llm-70b", 17, job_id="slurm-1", interval=0.05, socket_path=sock, http="")
    try:
        hb.update(step=5, coll_sn=11, in_collective=True)
        got: list = []
        assert wait_until(lambda: got.extend(intake.drain_heartbeats()) or len(got) >= 1, 5)
        assert wait_until(lambda: hb.sent_total >= 5, 5)
        h = got[-1]
        assert (h.job, h.job_id, h.rank, h.step, h.coll_sn, h.in_collective, h.node) == \
            ("llm-70b", "slurm-1", 17, 5, 11, True, "node-1")
        st = intake.stats()
        assert st["connections"] == 1 and st["connections_closed"] == 0  # one connection for every beat
        assert hb.failed_total == 0
    finally:
        hb.stop()
        intake.stop()


def test_tracker_names_the_rank_its_peers_wait_for_and_not_a_checkpoint():
    t = HeartbeatTracker(stall_s=30)
    for k in range(0, 60, 5):  # 12 beats: every rank frozen from t=0
        for r in range(16):
            stuck = r == 9
            t.add(Heartbeat("j", r, 7, 14 if stuck else 15, not stuck, 1000.0 + k, f"n{r // 8}"), "")
    hangs = t.hangs(1055.0)
    assert [(h.job, h.ranks, h.nodes) for h in hangs] == [("j", (9,), ("n1",))]
    ck = HeartbeatTracker(stall_s=30)
    for k in range(0, 60, 5):  # a checkpoint: everyone outside collectives, frozen together
        for r in range(16):
            ck.add(Heartbeat("j", r, 7, 14, False, 1000.0 + k, "n"), "")
    assert ck.hangs(1055.0) == []
    gone = HeartbeatTracker(stall_s=30)
    for r in range(16):  # a restart: heartbeats stop
        gone.add(Heartbeat("j", r, 7, 14 if r == 9 else 15, r != 9, 1000.0, "n"), "")
    assert gone.hangs(1060.0) == []


SCN = {"cluster": {"nodes": 16, "layout": "ib", "nodes_per_unit": 8, "seed": 3}, "duration": 300,
       "jobs": [{"name": "llm-70b", "nodes": [0, 7], "pp": 2}, {"name": "vlm-13b", "nodes": [8, 13]}],
       "decoys": [{"kind": "checkpoint", "job": "llm-70b", "every": 100, "pause": 25, "start": 40},
                  {"kind": "job_restart", "job": "vlm-13b", "start": 200, "down": 60}],
       "faults": [{"kind": "rank_hang", "node": "node-010", "gpu": 5, "start": 100, "end": 170}]}


def test_rank_hang_is_job_hung_on_that_rank_within_60_s_and_checkpoints_and_restarts_never_are():
    """The simulator's heartbeats through the stream codec into the real engine: the hung rank named at
    its GPU within 60 s, cleared after; a 25 s checkpoint and a 60 s restart raise nothing.  The first
    version of JobHung (the one Alertmanager's firing notification carries) already costs the hung job
    all its GPUs: it was `stopped: false, 0 GPU-hours/hour` until a later update."""
    from fabricmon.aggregator.alertmanager import AlertmanagerClient

    scn = scenario_from_dict(SCN, "hang.yaml")
    sim = SimulatedCluster(scn, mode="memory", epoch=1_764_000_000.0)
    engine = Engine(sim.topology, cluster="t")
    drive = Drive(sim, engine=engine, wire=True)
    drive.connect()
    fired: list[dict] = []

    def on_step(_stats, changed) -> None:
        for inc in changed:
            if inc.alertname == "JobHung" and inc.version == 1:
                fired.append(AlertmanagerClient(["http://127.0.0.1:1"], cluster="t")._snapshot(inc))

    drive.run(on_step=on_step)
    (snap,) = fired
    impact = json.loads(snap["annotations"]["impact_json"])
    assert [(i["job"], i["stopped"], i["gpu_hours_per_hour"]) for i in impact] == [("vlm-13b", True, 48)]
    assert snap["annotations"]["impact"] == "vlm-13b stopped (48 GPU-hours/hour)"
    incs = engine.incidents()
    assert [(i.alertname, i.component, i.severity) for i in incs] == [("JobHung", "node-010/gpu5", "critical")]
    i = incs[0]
    assert i.labels["hpc_job"] == "vlm-13b" and i.labels["rank"] == str(2 * 8 + 5) and i.labels["node"] == "node-010"
    assert 0 < i.first_seen - (1_764_000_000.0 + 100) <= 60
    assert i.resolved_at is not None and i.resolved_at < 1_764_000_000.0 + 200


def test_a_ras_answer_after_job_hung_fired_is_handed_to_alertmanager_again():
    """RAS is asked at suspicion (10 s of no progress) and may answer after JobHung fired (20 s): the
    answer goes into the description, so the incident changes and is sent again (Alertmanager's
    re-sends carry the last transition's snapshot: new evidence lines alone never reach it)."""
    from fabricmon.aggregator.alertmanager import AlertmanagerClient
    from fabricmon.aggregator.hangs import STALL_S, hung_job_findings
    from fabricmon.aggregator.incidents import IncidentManager
    from fabricmon.aggregator.ras_queries import SUSPECT_S, RasQueries
    from fabricmon.nccl_ras.client import QueryResult
    from fabricmon.nccl_ras.status import parse_status, summarize
    from fabricmon.proto.ras import RasReport
    from fabricmon.topology import generate_topology
    from support.paths import FIXTURES

    doc = (FIXTURES / "nccl" / "ras" / "doc-2.29.1-status-missing-rank.json").read_bytes()  # rank 1 missing
    topo = generate_topology(2, nodes_per_unit=2, gpus_per_node=8)
    tracker, ras, mgr = HeartbeatTracker(), RasQueries(), IncidentManager()

    def tick(now: float):
        while tracker_t[0] <= now:  # rank 1 on node-001 stopped outside its collective at t=0
            for r in range(9):
                tracker.add(Heartbeat("llm", r, 3, 7 if r == 1 else 8, r != 1, tracker_t[0],
                                      "node-001" if r == 1 else "node-000", "", "localhost:28028"), "")
            tracker_t[0] += 5.0
        hung = [h for h in ras.plan(tracker, now) if now - h.since >= STALL_S]
        found = hung_job_findings(hung, lambda *_: None, topo, "t", ras.evidence, ras.verdict)
        return mgr.update(found, now)

    tracker_t = [-5.0]
    assert tick(SUSPECT_S) == []
    (q,) = ras.take("node-000")  # asked at suspicion, from a node that is not the hung rank's
    (opened,) = tick(STALL_S)
    assert opened.alertname == "JobHung" and "NCCL RAS" not in opened.description
    assert any("no answer yet" in e for e in opened.evidence)
    version = opened.version
    assert tick(STALL_S + 1) == []  # nothing an alert shows changed
    summary = summarize(parse_status(doc))
    assert ras.report("node-000", RasReport(q.id, "llm", "", QueryResult("ok", "", 4.8, summary)), STALL_S + 2)
    (updated,) = tick(STALL_S + 3)  # the answer, after JobHung fired: a transition for Alertmanager
    assert updated is opened and updated.version == version + 1
    assert updated.description.endswith("; NCCL RAS names rank 1 missing")
    snap = AlertmanagerClient(["http://127.0.0.1:1"], cluster="t")._snapshot(updated)
    assert "NCCL RAS names rank 1 missing" in snap["annotations"]["description"]
    assert "missing: rank 1 (the rank the heartbeats name)" in snap["annotations"]["description"]
    assert tick(STALL_S + 4) == []  # the same answer again: no second update
