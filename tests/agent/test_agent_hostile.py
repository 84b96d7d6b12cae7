"""Must-show: the agent fed hostile inputs while its aggregator is down keeps serving a
parseable /metrics, spools, then connects when the aggregator comes up and delivers the
spooled batches in order, none missing.

Real parts over 127.0.0.1: the live agent as ``fabricmon agent`` wires it (simulated
node tree), its rank intake over HTTP, a disk spool, the aggregator's gRPC server,
Engine and HTTP /metrics.  Every loop is bounded in count and time.
"""

from __future__ import annotations

import pytest

from support.agentrig import Aggregator, LiveAgent, SimNode, SlowClients, hostile_lines, http_get, metric, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path):
    n = SimNode(tmp_path / "tree")
    yield n
    n.stop()


def test_hostile_inputs_while_aggregator_down_then_delivers_spool_in_order(tmp_path, node):
    agg = Aggregator(node.topology)
    agent = LiveAgent(node, tmp_path, agg.target)
    slow_intake = slow_metrics = None
    try:
        assert wait_until(lambda: http_get(agent.url("/readyz"))[0] == 200, 20), http_get(agent.url("/readyz"))
        # Hostile clients: connections that never finish a request, on the intake and on /metrics.
        slow_intake = SlowClients(agent.intake_port, 32)
        slow_metrics = SlowClients(agent.port, 32)
        for i in range(40):
            agent.post_ranks(hostile_lines(i))
            m = agent.metrics()  # parseable every time (parse_metrics raises otherwise)
            assert metric(m, "fabricmon_stream_connected") == 0.0
        assert wait_until(lambda: len(agent.spooled) >= 5, 20), agent.stream.stats()
        m = agent.metrics()
        assert metric(m, "fabricmon_stream_batches_spooled_total") >= 5
        assert metric(m, "fabricmon_stream_spool_bytes") > 0
        assert metric(m, "fabricmon_stream_spool_max_bytes") == 64 * 1024 * 1024
        assert metric(m, "fabricmon_agent_thread_up", thread="stream") == 1.0
        assert agent.stream.alive()
        code, why = http_get(agent.url("/readyz"))
        assert code == 200, why  # polling fresh and spooling: still doing its job
        assert http_get(agent.url("/healthz"))[0] == 200

        spooled_before = list(agent.spooled)
        agg.start()
        assert wait_until(lambda: agg.agents_connected() == 1.0, 20), agent.stream.stats()
        assert wait_until(lambda: set(spooled_before) <= set(agg.recorder.seqs()), 20), \
            (sorted(set(spooled_before) - set(agg.recorder.seqs()))[:5], agent.stream.stats())
        live_from = max(agg.recorder.seqs())
        assert wait_until(lambda: max(agg.recorder.seqs()) > live_from, 20)  # and keeps streaming live
        for i in range(40, 60):  # hostile lines while connected cost items, not the session
            agent.post_ranks(hostile_lines(i))
        connects = agent.stream.stats()["connects_total"]
        n_before = len(agg.recorder.seqs())
        assert wait_until(lambda: len(agg.recorder.seqs()) >= n_before + 3, 20)
        m = agent.metrics()
        assert metric(m, "fabricmon_stream_connected") == 1.0
        assert agent.stream.stats()["connects_total"] == connects
        assert metric(m, "fabricmon_stream_batches_replayed_total") >= len(spooled_before)
        assert metric(m, "fabricmon_stream_batches_dropped_total", reason="spool_write_failed") == 0
    finally:
        for s in (slow_intake, slow_metrics):
            if s is not None:
                s.close()
        agent.stop()
        agg.stop()
    seqs = agg.recorder.seqs()
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "seqs not strictly increasing"
    assert set(spooled_before) <= set(seqs)
