"""/readyz answers 503 only for local faults, never because the aggregator is down or refuses.

A DaemonSet rollout waits for every new pod's readiness: an agent that turned unready whenever the
aggregator was away would stall the rollout of thousands of nodes on one central fault, which the
aggregator's own alerts and the agents' stream metrics already report.  So: the aggregator down
(nothing listens) or refusing the stream (a real gRPC server with another token) leaves /readyz at
200 while batches spool; a token the agent cannot read (the Kubernetes Secret defect: root:root
0440 for a non-root uid; here a missing or empty file, since the tests may run as root) is 503
naming the file, as are expected devices missing (tests/sources/test_input_bounds.py).  All real over
127.0.0.1: the agent as `fabricmon agent` wires it, on a simulated node tree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fabricmon.agent.wiring import build_live_agent
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.config import IntakeConfig, StreamConfig
from fabricmon.sim.agents import sim_agent_config
from support.agentrig import SimNode, free_port, http_get, metric, parse_metrics, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = SimNode(tmp_path_factory.mktemp("tree"))
    yield n
    n.stop()


def _agent(node: SimNode, tmp: Path, aggregator: str, token_file: Path):
    cfg = dataclasses.replace(
        sim_agent_config(node.tree, 0.5), aggregator=aggregator,
        stream=StreamConfig(spool_dir=str(tmp / "spool"), token_file=str(token_file)),
        intake=IntakeConfig(listen=f"127.0.0.1:{free_port()}", socket=None))
    agent = build_live_agent(cfg, stream_backoff=(0.05, 0.5))
    port = agent.start_http("127.0.0.1:0")
    agent.start_polling()
    agent.start_supervisor(every=0.1)
    return agent, f"http://127.0.0.1:{port}/readyz"


def _stays_ready(url: str, seconds: float) -> tuple[int, bytes]:
    """200 now and at every check for ``seconds`` (bounded), else the first other answer."""
    last = http_get(url)
    if last[0] != 200:
        return last
    wait_until(lambda: http_get(url)[0] != 200, seconds, interval=0.25)
    return http_get(url)


def test_ready_while_the_aggregator_is_down(node, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    agent, url = _agent(node, tmp_path, f"127.0.0.1:{free_port()}", token)  # nothing listens there
    try:
        assert wait_until(lambda: http_get(url)[0] == 200, 20), http_get(url)
        assert _stays_ready(url, 2.0) == (200, b"ready\n")
        # ... while batches spool for the aggregator's return.
        assert len(agent.stream.spool) > 0
    finally:
        agent.stop()


def test_ready_while_the_aggregator_refuses_the_stream(node, tmp_path) -> None:
    engine = Engine(node.topology, DetectionSettings())
    target = f"127.0.0.1:{free_port()}"
    server = start_grpc_server(engine, target, token="the-aggregator-wants-this")
    token = tmp_path / "token"
    token.write_text("but-the-agent-holds-this\n")
    agent, url = _agent(node, tmp_path, target, token)
    try:
        assert wait_until(lambda: http_get(url)[0] == 200, 20), http_get(url)
        # Refused for real: attempts fail, none connects.
        metrics_url = url.replace("/readyz", "/metrics")
        assert wait_until(lambda: (metric(parse_metrics(http_get(metrics_url)[1]),
                                          "fabricmon_stream_connect_failures_total") or 0) >= 2, 20)
        assert _stays_ready(url, 2.0) == (200, b"ready\n")
        assert engine.views.agents_connected() == 0
        assert metric(parse_metrics(http_get(metrics_url)[1]), "fabricmon_stream_connects_total") == 0
    finally:
        agent.stop()
        server.stop(0)


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_not_ready_when_the_token_cannot_be_read(node, tmp_path, problem: str) -> None:
    token = tmp_path / "token"
    if problem == "empty":
        token.write_text("\n")
    agent, url = _agent(node, tmp_path, f"127.0.0.1:{free_port()}", token)
    try:
        assert wait_until(lambda: b"stream.token_file" in http_get(url)[1], 20), http_get(url)
        code, body = http_get(url)
        assert code == 503 and str(token).encode() in body, body
        assert (b"not readable" if problem == "missing" else b"empty") in body, body
        # Fixed in place (a Secret updated, a mode corrected): ready again without a restart.
        token.write_text("s3cret\n")
        assert wait_until(lambda: http_get(url)[0] == 200, 20), http_get(url)
    finally:
        agent.stop()


def test_metrics_say_the_stream_is_down(node, tmp_path) -> None:
    """What replaces a 503 for a central fault: the agent's own stream metrics."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    agent, url = _agent(node, tmp_path, f"127.0.0.1:{free_port()}", token)
    try:
        metrics_url = url.replace("/readyz", "/metrics")
        assert wait_until(lambda: http_get(metrics_url)[0] == 200 and metric(
            parse_metrics(http_get(metrics_url)[1]), "fabricmon_stream_connected") == 0, 20)
    finally:
        agent.stop()
