"""A node whose batches the aggregator drops for its clock or seq is told in its ack and says so
(issue 26, "Blind spots": a node 5 minutes off saw normal acks and /readyz 200 while blind).
Real gRPC over loopback, the real engine in wall-clock mode, the real stream client."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.selfmetrics import self_exposition
from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.admission import ClusterClock
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NodeHello
from fabricmon.model import Sample, Snapshot
from fabricmon.topology import generate_topology
from support.waiting import wait_until

NODE = "node-000"
PORT = (("device", "mlx5_0"), ("port", "1"))


def _snap(i: int, ts: float) -> Snapshot:
    return Snapshot(NODE, ts, i, (Sample("fabricmon_ib_port_state", PORT, 4.0),), (), 1.0, ())


def _dropped(c: StreamClient) -> dict[str, float]:
    from fabricmon.agent.selfmetrics import AgentSelfCollector

    text = self_exposition(AgentSelfCollector(NODE, c.stats, None))().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "fabricmon_stream_batches_dropped_by_aggregator_total":
                out[s.labels["reason"]] = s.value
            elif s.name == "fabricmon_stream_aggregator_dropping":
                out["dropping"] = s.value
    return out


def test_clock_ahead_is_told_in_the_ack_and_counted_then_clears():
    topo = generate_topology(2, nodes_per_unit=2, layout="roce", cluster="test")
    eng = Engine(topo, DetectionSettings(), cluster_clock=ClusterClock("wall", max_skew_s=300.0))
    srv = start_grpc_server(eng, "127.0.0.1:0")
    hello = NodeHello(NODE, "test", 1.0, gpus=8, boot_id="b1")
    c = StreamClient(srv.address, NODE, lambda: hello, MemorySpool(), backoff_min=0.05, backoff_max=0.3).start()
    try:
        assert wait_until(lambda: c.connected)
        now = time.time()
        for i in range(1, 4):  # the node's clock 10 minutes ahead
            c.offer(_snap(i, now + 600.0 + i))
        assert wait_until(lambda: _dropped(c).get("ts_ahead") == 3.0), _dropped(c)
        assert _dropped(c)["dropping"] == 1.0 and c.state.aggregator_dropping == "ts_ahead"
        assert eng.admission.admission_snapshot() == {"ts_ahead": 3}
        # the clock is fixed: the next batch is believed, and the node says so
        c.offer(_snap(4, time.time()))
        assert wait_until(lambda: eng.admission.batches_total == 1)
        assert wait_until(lambda: _dropped(c)["dropping"] == 0.0)
        assert _dropped(c)["ts_ahead"] == 3.0  # a counter: never goes back
    finally:
        c.stop()
        srv.stop(0.5)


def test_readyz_says_so():
    from fabricmon.agent.runtime import build_agent
    from fabricmon.config import AgentConfig

    agent = build_agent(AgentConfig(node_name=NODE), sources=[])
    c = StreamClient("127.0.0.1:9", NODE, lambda: None, MemorySpool())
    agent.stream = c
    c.state.note_ack_drop("ts_behind")
    assert any("drops this node's batches (ts_behind)" in p for p in agent.not_ready()), agent.not_ready()
    c.state.note_ack_drop("")
    assert not any("drops this node's batches" in p for p in agent.not_ready())
    c.state.note_ack_drop("x" * 1000)  # an unknown reason from a newer aggregator: bounded label, bounded text
    assert c.stats()["aggregator_dropped"]["other"] == 1 and len(c.state.aggregator_dropping) <= 40
    agent.poller.close()
