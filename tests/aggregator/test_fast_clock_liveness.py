"""A node whose clock runs fast (inside clock.max_skew_s) is named down when it goes silent, not minutes
late (issue 35 item 13): the silence is measured from when the aggregator heard it (ClusterClock.receipt,
the wall clock here), not from the node's own sample times.  A real ``fabricmon aggregator`` process in
wall mode and a real stream client whose batches are stamped 250 s ahead."""

from __future__ import annotations

import json
import sys
import time
import types
import urllib.request

import pytest
import yaml

from fabricmon.model import Snapshot
from support.aggrig import Agent
from support.procrig import Proc, free_port, topology_yaml, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")]
pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

AHEAD_S = 250.0  # inside the default max_skew_s (300): admitted


def _open(http: int) -> list[dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/incidents?state=open", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return []


def test_a_fast_clock_node_that_goes_silent_is_named_down_on_time(tmp_path):
    g, h = free_port(), free_port()
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({
        "topology": str(topology_yaml(tmp_path / "topology.yaml")), "grpc_listen": f"127.0.0.1:{g}",
        "http_listen": f"127.0.0.1:{h}", "tick_seconds": 0.1, "auth": {"insecure": True},
        "clock": {"mode": "wall"}, "detection": {"agent_down_s": 2.0, "restart_grace_s": 1.0}}))
    agg = Proc(["aggregator", "--config", str(cfg), "--log-format", "json"], tmp_path / "agg.log")
    agent = None
    try:
        assert agg.wait_log("aggregator_started"), agg.text()
        agent = Agent(tmp_path, types.SimpleNamespace(grpc=g), "node-000", interval=0.2)
        assert agg.wait_log("stream_connected"), agg.text()
        for seq in range(1, 11):  # 2 s of batches, each stamped 250 s ahead of the wall clock
            agent.client.offer(Snapshot(node="node-000", ts=time.time() + AHEAD_S, seq=seq, samples=(), deltas=(),
                                        interval_seconds=0.2, sources=()))
            time.sleep(0.2)
        assert wait_until(lambda: agent.client.stats()["batches_acked_total"] >= 10, 10), agent.client.stats()
        assert "batch_rejected" not in agg.text()  # admitted: 250 s is inside max_skew_s
        assert not [i for i in _open(h) if i["alertname"] == "FabricmonAgentDown"]
        agent.stop()
        agent = None
        silent_at = time.monotonic()
        # silent for agent_down_s (2 s) plus a tick: at 64bf867 it stayed up until its clock's 250 s passed
        assert wait_until(lambda: any(i["alertname"] == "FabricmonAgentDown" and i["component"] == "node-000"
                                      for i in _open(h)), 20), agg.text()[-2000:]
        assert time.monotonic() - silent_at < 20
    finally:
        if agent is not None:
            agent.stop()
        agg.stop()
