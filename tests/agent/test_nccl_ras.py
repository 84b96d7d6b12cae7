"""NCCL RAS: the JSON status parser on NCCL's documented outputs and hostile inputs, the client over
real loopback sockets against a server speaking RAS's protocol, and the evidence lines.
Fixtures: tests/fixtures/nccl/ras/README.md (each cited to NVIDIA/nccl's file and commit)."""

from __future__ import annotations

import json
import socket

import pytest

from fabricmon.aggregator.ras_queries import ras_lines, ras_verdict
from fabricmon.nccl_ras import protocol as p
from fabricmon.nccl_ras.client import query_status
from fabricmon.nccl_ras.status import RasFormatError, parse_status, summarize
from fabricmon.proto.ras import RasReport, report_from_pb, report_to_pb
from fabricmon.sim.ras_server import (
    FakeComm,
    FakeMissing,
    FakeRank,
    FakeRasServer,
    FakeStatus,
    hung_job_status,
    render_json,
)
from support.paths import FIXTURES

FIX = FIXTURES / "nccl" / "ras"
DOC = (FIX / "doc-2.29.1-status-missing-rank.json").read_bytes()
# the documented sample's values, to render it again (ras.rst "JSON Output")
DOC_STATUS = FakeStatus(comms=(FakeComm(0xae94423cfbb2ef4a, 0xb7e7187447156001, 0xb8242ed28a71381e, 2,
                                        (FakeRank(0, "172.16.64.245", 1524344, 0, 0),),
                                        (FakeMissing(1, "172.16.64.245", 1524345, 1, 1, True, False),)),))


# ------------------------------------------------------------------ the parser on documented outputs


def test_documented_json_status_parses_into_typed_values():
    st = parse_status(DOC)
    assert (st.nccl_version, st.timestamp, st.timeouts, st.repaired) == ("2.29.1", "2025-12-19 13:06:53", 0, "")
    (c,) = st.communicators
    assert (c.hash, c.secondary_hash, c.size) == ("0xae94423cfbb2ef4a", "0xb7e7187447156001:0xb8242ed28a71381e", 2)
    (r,) = c.ranks
    assert (r.rank, r.host, r.pid, r.cuda_dev, r.init_state, r.in_error) == (0, "172.16.64.245", 1524344, 0, 0, False)
    assert dict(r.collective_counts) == {"Broadcast": 0, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0,
                                         "AllReduce": 0}
    (m,) = c.missing
    assert (m.rank, m.pid, m.cuda_dev, m.unresponsive, m.considered_dead) == (1, 1524345, 1, True, False)
    s = summarize(st)
    assert [(n.rank, n.dead, n.unresponsive) for n in s.missing] == [(1, False, True)]
    assert (s.world_size, s.behind, s.errors) == (2, (), ())


def test_the_writer_port_renders_the_documented_sample_byte_for_byte():
    assert render_json(DOC_STATUS).encode() == DOC


def test_the_2_28_writer_defect_is_repaired_and_said():
    raw = (FIX / "writer-2.28.9-status-missing-rank.json").read_bytes()
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # what 2.28.7 and 2.28.9 really send when a rank is missing
    st = parse_status(raw)
    assert st.repaired == "missing_rank_nvml_dev_comma"
    assert st.communicators == parse_status(DOC).communicators


def test_the_documented_mismatch_names_the_ranks_behind():
    s = summarize(parse_status((FIX / "derived-2.29-status-mismatch-behind.json").read_bytes()))
    assert [n.rank for n in s.behind] == [0, 2, 3, 4, 5, 7]
    assert {(n.op, n.count, n.peers, n.host) for n in s.behind} == {("AllReduce", 6649, 6650, "172.16.64.210")}
    assert [n.pid for n in s.behind] == [483072, 483074, 483075, 483076, 483077, 483079]
    assert s.missing == () and s.errors == ()


@pytest.mark.parametrize("name", ["doc-text-dead-process.txt", "doc-text-incomplete.txt"])
def test_documented_text_excerpts_are_refused(name):
    with pytest.raises(RasFormatError) as exc:
        parse_status((FIX / name).read_bytes())
    assert exc.value.outcome == "bad_json"


def test_a_text_status_as_old_nccl_sends_it_is_old_protocol():
    from fabricmon.sim.ras_server import render_text_header

    text = render_text_header("2.27.7") + (FIX / "doc-text-dead-process.txt").read_text()
    with pytest.raises(RasFormatError) as exc:
        parse_status(text.encode())
    assert exc.value.outcome == "old_protocol"


def test_a_monitor_event_is_not_a_status():
    with pytest.raises(RasFormatError, match="communicators: expected an array"):
        parse_status((FIX / "doc-2.29-monitor-peer-dead.json").read_bytes())


# ------------------------------------------------------------------ hostile documents


def _doc() -> dict:
    return json.loads(DOC)


def _mut(f) -> bytes:
    d = _doc()
    f(d)
    return json.dumps(d).encode()


@pytest.mark.parametrize("data, where", [
    (DOC[: len(DOC) // 2], "not JSON"),
    (b"", "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON|document"),
    (b'{"communicators": [], "ras": {"collection_time_sec": NaN, "timeouts_count": 0}}', "not JSON"),
    (b"[1, 2]", "document: expected an object"),
    (_mut(lambda d: d["communicators"][0]["ranks"][0].__setitem__("rank", "0")), r"ranks\[0\]\.rank"),
    (_mut(lambda d: d["communicators"][0]["ranks"][0].__setitem__("rank", True)), r"ranks\[0\]\.rank"),
    (_mut(lambda d: d["communicators"][0]["ranks"][0].__setitem__("rank", -1)), "out of"),
    (_mut(lambda d: d["communicators"][0]["missing_ranks"][0]["status"].__setitem__("considered_dead", "no")),
     "considered_dead"),
    (_mut(lambda d: d["communicators"][0].__setitem__("ranks", {})), "ranks: expected an array"),
    (_mut(lambda d: d["communicators"][0].__setitem__("size", 1)), "exceed its size"),
    (_mut(lambda d: d["communicators"][0]["ranks"][0]["collective_counts"].__setitem__("AllReduce", 2**64)),
     "out of"),
    (_mut(lambda d: d["communicators"][0]["ranks"][0].__setitem__("host", "x\n" * 10)), "printable"),
    (_mut(lambda d: d.__delitem__("ras")), "ras: expected an object"),
    (_mut(lambda d: d["ras"].__setitem__("collection_time_sec", -1)), "collection_time_sec"),
    (b'{"communicators": [' + b"{}," * 70_000 + b'{}], "ras": {}}', "at most 65536"),
])
def test_hostile_documents_are_refused_naming_the_field(data, where):
    with pytest.raises(RasFormatError, match=where) as exc:
        parse_status(data)
    assert exc.value.outcome == "bad_json"


def test_a_document_over_the_size_bound_is_too_large():
    with pytest.raises(RasFormatError) as exc:
        parse_status(b" " * (32 * 1024 * 1024 + 1))
    assert exc.value.outcome == "too_large"


# ------------------------------------------------------------------ the protocol


def test_addresses_as_nccl_ras_addr_takes_them():
    assert p.parse_addr("localhost:28028") == ("localhost", 28028)
    assert p.parse_addr("[::1]:12345") == ("::1", 12345)
    for bad in ("localhost", "localhost:0", "host:99999", ":1", "a b:1", "x" * 200 + ":1", "::1:5"):
        with pytest.raises(p.BadAddress):
            p.parse_addr(bad)
    assert p.client_deadline_s(5) == 11  # client.cc: 1 s + TIMEOUT + RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC


# ------------------------------------------------------------------ the client over loopback


def test_query_speaks_the_protocol_and_returns_the_documented_missing_rank():
    with FakeRasServer(document=DOC) as srv:
        res = query_status(srv.addr, ras_timeout_s=3)
        assert res.outcome == "ok", res.detail
        assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 3", "SET FORMAT json", "STATUS"]
    assert res.server_protocol == 2
    assert [(n.rank, n.unresponsive, n.dead) for n in res.summary.missing] == [(1, True, False)]


def test_query_of_a_2_28_server_repairs_its_missing_rank():
    with FakeRasServer(state=lambda: DOC_STATUS, version="2.28.9") as srv:
        res = query_status(srv.addr)
    assert res.outcome == "ok" and res.summary.repaired == "missing_rank_nvml_dev_comma"
    assert [n.rank for n in res.summary.missing] == [1]


def test_an_nccl_without_json_is_old_protocol():
    with FakeRasServer(state=lambda: DOC_STATUS, version="2.27.7") as srv:
        res = query_status(srv.addr)
        assert srv.queries == 0  # refused at SET FORMAT: no status was gathered for nothing
    assert res.outcome == "old_protocol" and "Unknown command" in res.detail


def test_a_closed_port_is_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    res = query_status(f"127.0.0.1:{port}")
    assert res.outcome == "refused"


def test_a_silent_server_times_out_within_the_deadline():
    with FakeRasServer(behaviour="silent") as srv:
        res = query_status(srv.addr, deadline_s=0.5)
    assert res.outcome == "timeout" and res.seconds < 2.0


def test_a_huge_answer_is_cut_at_the_bound():
    with FakeRasServer(behaviour="huge", huge_bytes=4 * 1024 * 1024) as srv:
        res = query_status(srv.addr, max_bytes=1024 * 1024)
    assert res.outcome == "too_large"


def test_garbage_is_bad_json_and_a_remote_address_is_not_queried():
    with FakeRasServer(behaviour="garbage") as srv:
        assert query_status(srv.addr).outcome == "bad_json"
    assert query_status("10.1.2.3:28028").outcome == "not_local"
    assert query_status("nonsense").outcome == "bad_address"


# ------------------------------------------------------------------ report on the wire, evidence


def test_report_round_trips_and_the_evidence_names_the_dead_rank():
    st = hung_job_status(["10.0.0.1", "10.0.0.2"], 8, 13, hang_view="missing", hung_for_s=61)
    with FakeRasServer(state=lambda: st) as srv:
        res = query_status(srv.addr)
    rep = report_from_pb(report_to_pb(RasReport(7, "llm", "j1", res)).ras_report)
    assert rep.result.summary == res.summary and rep.id == 7
    lines = ras_lines(rep.result, "node-000", 1000.0, {13})
    assert len(lines) == 1
    assert "missing: rank 13 (the rank the heartbeats name)" in lines[0] and "considered dead" in lines[0]
    assert "on 10.0.0.2" in lines[0]
    assert ras_verdict(rep.result) == "NCCL RAS names rank 13 missing"


def test_evidence_for_a_rank_behind_for_all_fine_and_for_no_answer():
    st = hung_job_status(["10.0.0.1", "10.0.0.2"], 8, 5)
    with FakeRasServer(state=lambda: st) as srv:
        res = query_status(srv.addr)
    (line,) = ras_lines(res, "node-001", 5.0, {5})
    assert "behind: rank 5 (the rank the heartbeats name)" in line and "launched 6649 AllReduce" in line
    assert ras_verdict(res) == "NCCL RAS names rank 5 behind"
    fine = FakeStatus(comms=(FakeComm(1, 2, 3, 1, (FakeRank(0, "10.0.0.1", 9, 0, 0, (1, 1, 1, 1, 1)),)),))
    with FakeRasServer(state=lambda: fine) as srv:
        res = query_status(srv.addr)
    (line,) = ras_lines(res, "node-001", 5.0, set())
    assert "hang is in the application" in line
    assert ras_verdict(res) == "NCCL RAS sees every rank present: the hang is in the application, outside NCCL"
    res = query_status("127.0.0.1:1")
    (line,) = ras_lines(res, "node-001", 5.0, set())
    assert line.startswith("NCCL RAS could not be asked on node-001: refused")
    assert ras_verdict(res) == "NCCL RAS could not be asked (refused)"


# ------------------------------------------------------------------ the aggregator's planner (pure)


def _tracker_with_hang(t_end: float, ras: str = "localhost:28028", since: float = 0.0):
    """Ranks 0-7 on node-a wait inside the collective from ``since``; rank 8 on node-b never enters."""
    from fabricmon.aggregator.hangs import HeartbeatTracker
    from fabricmon.rank_timing import Heartbeat

    tr = HeartbeatTracker()
    t = since - 5.0
    while t <= t_end:
        for r in range(9):
            node = "node-a" if r < 8 else "node-b"
            inside = r < 8 and t >= since
            tr.add(Heartbeat("llm", r, 1, 10 + int(inside), inside, t, node, "", ras), node)
        t += 5.0
    return tr


def test_planner_asks_once_per_suspicion_from_a_node_not_the_suspects_and_backs_off():
    from fabricmon.aggregator.ras_queries import ANSWER_S, BACKOFF_S, SUSPECT_S, RasQueries
    from fabricmon.nccl_ras.client import QueryResult

    rq = RasQueries()
    rq.plan(_tracker_with_hang(5.0), 5.0)
    assert rq.sent_total == 0  # progress stopped 5 s ago: not yet suspect
    now = SUSPECT_S
    tr = _tracker_with_hang(now)
    rq.plan(tr, now)
    assert rq.take("node-b") == []  # the hung rank's node: its stopped process may hold the socket
    (q,) = rq.take("node-a")
    assert (q.job, q.addr, q.timeout_s) == ("llm", "localhost:28028", 5)
    assert rq.take("node-a") == []
    rq.plan(tr, now + 1)
    assert rq.sent_total == 1  # one per suspicion
    forged = RasReport(q.id, "llm", "", QueryResult("ok", "", 0.1, None))
    assert not rq.report("node-b", forged, now + 2)  # not the node asked
    assert rq.report("node-a", RasReport(q.id, "llm", "", QueryResult("timeout", "slow", 11.0)), now + 2)
    assert rq.outcomes["timeout"] == 1
    later = now + BACKOFF_S[0]
    rq.plan(_tracker_with_hang(later), later)
    (q2,) = rq.take("node-a")  # the hang lasts: asked again after the back-off
    assert q2.id != q.id
    rq.plan(_tracker_with_hang(later + ANSWER_S + 1), later + ANSWER_S + 1)
    assert rq.outcomes["unanswered"] == 1
    from fabricmon.aggregator.hangs import Hang

    (line,) = rq.evidence(Hang("llm", "", (8,), ("node-b",), 0.0, 8))
    assert "could not be asked on node-a: unanswered" in line


def test_planner_never_asks_a_job_without_ras_and_forgets_a_suspicion_that_ended():
    from fabricmon.aggregator.ras_queries import RasQueries

    rq = RasQueries()
    rq.plan(_tracker_with_hang(30.0, ras=""), 30.0)
    assert rq.sent_total == 0 and rq.outbox == {}
    rq.plan(_tracker_with_hang(30.0), 30.0)
    assert rq.sent_total == 1
    from fabricmon.aggregator.hangs import HeartbeatTracker

    rq.plan(HeartbeatTracker(), 31.0)  # no hang any more
    assert rq.jobs == {}
    rq.plan(_tracker_with_hang(80.0, since=50.0), 80.0)  # a new suspicion: asked at once
    assert rq.sent_total == 2


def test_a_job_s_heartbeats_announce_its_ras_address(monkeypatch):
    from fabricmon.client import HeartbeatSender, nccl_ras_addr
    from fabricmon.rank_timing import RankTimingError, parse_line

    monkeypatch.delenv("FABRICMON_NCCL_RAS", raising=False)
    monkeypatch.delenv("NCCL_RAS_ENABLE", raising=False)
    monkeypatch.setenv("NCCL_RAS_ADDR", "localhost:12345")
    assert nccl_ras_addr() == ""  # opt-in
    assert nccl_ras_addr(True) == "localhost:12345"
    monkeypatch.setenv("FABRICMON_NCCL_RAS", "1")
    h = parse_line(HeartbeatSender("llm", 3, job_id="j", socket_path="", http="").line(), node="n")
    assert h.nccl_ras == "localhost:12345"
    monkeypatch.setenv("NCCL_RAS_ENABLE", "0")  # NCCL runs no RAS: nothing to ask
    assert nccl_ras_addr(True) == ""
    with pytest.raises(RankTimingError, match="nccl_ras"):
        parse_line('{"job":"j","rank":1,"heartbeat":{"step":1},"nccl_ras":"no-port"}', now=1.0)
