"""A hung job's NCCL RAS, end to end over real sockets: heartbeats announcing RAS cross real agents'
gRPC streams into the aggregator; when the job turns suspect the aggregator asks one agent (a node
that is not the hung rank's) on its stream; that agent queries a loopback server speaking RAS's
protocol with NCCL's documented JSON (a missing rank); the answer comes back on the stream and the
JobHung incident's evidence (/api/incidents) names the missing rank.  Without RAS JobHung fires at
the same tick."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NodeHello
from fabricmon.model import Snapshot
from fabricmon.rank_timing import Heartbeat
from fabricmon.sim.ras_server import FakeRasServer
from fabricmon.topology import generate_topology
from support.paths import FIXTURES
from support.waiting import wait_until

DOC = (FIXTURES / "nccl" / "ras" / "doc-2.29.1-status-missing-rank.json").read_bytes()
NODES = ("node-000", "node-001")


class Beats:
    """The agent's intake as the stream reads it: heartbeats handed over per batch."""

    def __init__(self) -> None:
        self.pending: list[Heartbeat] = []

    def drain(self):
        return [], []

    def drain_heartbeats(self) -> list[Heartbeat]:
        out, self.pending = self.pending, []
        return out


def _run(ras_addr: str, rounds: int = 8) -> tuple[Engine, list[float], dict]:
    """Job "llm" (id j1): rank 0 on node-000 enters its collective at round 1 and waits, rank 1 on
    node-001 never does; heartbeats every 5 s of sample time.  The engine ticks after each round."""
    topo = generate_topology(2, nodes_per_unit=2, gpus_per_node=8)
    engine = Engine(topo, cluster="t")
    srv = start_grpc_server(engine, "127.0.0.1:0", lock=engine.lock)
    t0 = float(int(time.time()) - 120)
    beats = {n: Beats() for n in NODES}
    clients = {n: StreamClient(srv.address, n, (lambda n=n: NodeHello(n, "test", 5.0, gpus=8, boot_id="b")),
                               MemorySpool(), intake=beats[n], backoff_min=0.05, backoff_max=0.3,
                               hello_timeout=3.0).start() for n in NODES}
    fired: list[float] = []
    try:
        assert wait_until(lambda: all(c.connected for c in clients.values()))
        for i in range(rounds):
            ts = t0 + 5 * i
            for r, node in enumerate(NODES):
                inside = r == 0 and i >= 1
                beats[node].pending.append(Heartbeat("llm", r, 3, 7 + int(inside), inside, ts, "", "j1", ras_addr))
            for n, c in clients.items():
                c.offer(Snapshot(node=n, ts=ts, seq=i + 1, samples=(), deltas=(), interval_seconds=5.0, sources=()))
            assert wait_until(lambda i=i: engine.admission.batches_total >= 2 * (i + 1))
            # a query planned at the last tick went down after this round's ack: its answer, before the tick
            assert wait_until(lambda: not any(j.pending for j in engine.ras.jobs.values()), 15)
            engine.tick(ts)
            if any(x.alertname == "JobHung" for x in engine.open_incidents()) and not fired:
                fired.append(ts - t0)
        agents = {n: c.stats()["nccl_ras"]["outcomes"] for n, c in clients.items()}
    finally:
        for c in clients.values():
            c.stop(2.0)
        srv.stop(0.5)
    return engine, fired, agents


def test_rank_hang_job_hung_evidence_names_the_missing_rank_ras_reports():
    with FakeRasServer(document=DOC) as ras:
        engine, fired, agents = _run(ras.addr)
        assert ras.commands[:4] == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]
        assert ras.queries == 1  # once per suspicion: the back-off (60 s) outlasts the run
    (inc,) = [i for i in engine.open_incidents() if i.alertname == "JobHung"]
    assert inc.labels["rank"] == "1" and inc.labels["node"] == "node-001"
    ras_ev = [e for e in inc.evidence if e.startswith("NCCL RAS")]
    assert len(ras_ev) == 1, inc.evidence
    assert "asked on node-000" in ras_ev[0]  # a node of the job that is not the hung rank's
    assert "missing: rank 1 (the rank the heartbeats name) (process 1524345 on 172.16.64.245" in ras_ev[0]
    assert "unresponsive" in ras_ev[0] and "NCCL 2.29.1" in ras_ev[0]
    assert agents["node-000"]["ok"] == 1 and sum(agents["node-001"].values()) == 0
    assert engine.ras.outcomes["ok"] == 1 and engine.ras.sent_total == 1
    # what an operator reads from /api/incidents carries it too
    from fabricmon.aggregator.runtime import AggregatorRuntime

    rt = AggregatorRuntime(engine, http_listen=("127.0.0.1", 0)).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{rt.http.port}/api/incidents", timeout=5) as resp:
            body = json.loads(resp.read())
        with urllib.request.urlopen(f"http://127.0.0.1:{rt.http.port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
    finally:
        rt.stop()
    incs = body if isinstance(body, list) else body.get("incidents", [])
    hung = [i for i in incs if i["alertname"] == "JobHung"]
    assert any("missing: rank 1" in e for e in hung[0]["evidence"])
    assert 'fabricmon_nccl_ras_queries_total{outcome="ok"} 1.0' in metrics
    assert "fabricmon_nccl_ras_queries_sent_total 1.0" in metrics


def test_without_ras_job_hung_fires_at_the_same_tick_and_unreachable_ras_says_so():
    with FakeRasServer(document=DOC) as ras:
        _, with_ras, _ = _run(ras.addr)
    engine, without, agents = _run("127.0.0.1:1")  # nothing listens there: RAS refused
    assert with_ras and with_ras == without
    (inc,) = [i for i in engine.open_incidents() if i.alertname == "JobHung"]
    assert any(e.startswith("NCCL RAS could not be asked on node-000: refused") for e in inc.evidence)
    assert agents["node-000"]["refused"] == 1


def test_the_simulator_s_rank_hang_is_asked_of_its_loopback_ras_and_named_behind():
    """The demo/bench path: the simulator's jobs announce a loopback RAS speaking NCCL's protocol; the
    engine's queries reach it through the agent's querier; the hung rank is named behind its peers."""
    from fabricmon.demo.wire import CodecWire
    from fabricmon.sim.runner import SimulatedCluster
    from fabricmon.sim.scenario import scenario_from_dict

    scn = scenario_from_dict({
        "cluster": {"nodes": 4, "layout": "ib", "nodes_per_unit": 4, "seed": 3}, "duration": 45,
        "jobs": [{"name": "vlm-13b", "nodes": [2, 3]}],
        "faults": [{"kind": "rank_hang", "node": "node-003", "gpu": 5, "start": 12, "end": 44}]}, "hang.yaml")
    sim = SimulatedCluster(scn, mode="memory", epoch=1_764_000_000.0, nccl_ras=True)
    engine = Engine(sim.topology, cluster="t")
    wire = CodecWire(engine.hello, engine.ingest, engine.read_delta_families)
    sim.start()
    for h in sim.hellos():
        wire.connect(h)
    sim.on_batch = wire.deliver
    sim.ras.attach(engine.ras_waiting, engine.take_ras_queries, engine.ras_report)
    evidence: list[str] = []
    try:
        while sim.t + 1 <= scn.duration:
            sim.step()
            if engine.ras.jobs and any(j.pending for j in engine.ras.jobs.values()):
                wait_until(lambda: not any(j.pending for j in engine.ras.jobs.values()), 15)
            engine.tick(sim.now())
            for i in engine.open_incidents():
                if i.alertname == "JobHung":
                    evidence = list(i.evidence)
    finally:
        sim.close()
    rank = 1 * 8 + 5  # node-003 is the job's second node
    ras = [e for e in evidence if e.startswith("NCCL RAS")]
    assert ras and f"behind: rank {rank} (the rank the heartbeats name) (process " in ras[0], evidence
    assert "on 10.0.0.3," in ras[0] and "AllReduce" in ras[0]
    assert "asked on node-002" in ras[0]  # the job's first node that is not the hung rank's
    assert sum(s.queries for s in sim.ras.servers) == engine.ras.sent_total >= 1


def test_a_malformed_or_unasked_ras_report_is_counted_and_the_stream_goes_on():
    """A RasReport the aggregator cannot believe (an unknown outcome; a report for no query) never cuts
    the node's telemetry stream: the batch after it is still acked."""
    from fabricmon.proto import codec
    from fabricmon.proto import fabricmon_pb2 as pb
    from support.grpcraw import raw_stream

    engine = Engine(generate_topology(2, nodes_per_unit=2, gpus_per_node=8), cluster="t")
    srv = start_grpc_server(engine, "127.0.0.1:0", lock=engine.lock)
    ts = float(int(time.time()))
    try:
        msgs = [pb.AgentMessage(hello=codec.hello_to_pb(NodeHello("node-000", "t", 5.0))),
                pb.AgentMessage(ras_report=pb.RasReport(id=1, job="llm", outcome="pwned")),
                pb.AgentMessage(ras_report=pb.RasReport(id=9, job="llm", outcome="ok", nccl_version="2.29.1")),
                pb.AgentMessage(batch=pb.Batch(seq=5, ts=ts, interval_seconds=5.0))]
        resp, code = raw_stream(srv.address, msgs, timeout=5.0)
        stats = srv.stats()
    finally:
        srv.stop(0.5)
    assert code == grpc.StatusCode.OK and [m.ack.seq for m in resp if m.WhichOneof("msg") == "ack"] == [0, 5]
    assert stats["ras_reports_refused_total"] == 1
    assert engine.ras.outcomes["ok"] == 0  # the unasked one is ignored, not believed
