"""Names that would break component ids are refused where they enter (issue 35 item 18).

Component ids join node, device, port, GPU and NVLink names with "/" (DESIGN "Component ids"): a
device named ``mlx5/0`` from a node holding its own valid token became the link id
``node-000/mlx5/0/1``, which the state file could not parse back, and every persisted incident was
lost at the next restart.  Now the name rule refuses "/" in node names (with the control and
bidi characters it refused already), and the decoder refuses series and hello NICs whose device,
port, GPU, NVLink or interface name holds one: the stream is refused as malformed and counted."""

from __future__ import annotations

import sys
import types

import pytest
import yaml

from fabricmon.batch import NicHello, NodeBatch, NodeHello
from fabricmon.model import CounterDelta
from fabricmon.proto import codec
from fabricmon.rank_timing import RankTimingError, parse_line
from fabricmon.textcheck import node_name_problem
from support.aggrig import Agent, link_errors
from support.procrig import Proc, free_port, metrics, topology_yaml, wait_until


@pytest.mark.parametrize("name", ["a/b", "node-000/mlx5_0", "node-\u202e000", "node\x00", "node-\u200b0"])
def test_the_node_name_rule_refuses_what_breaks_ids(name):
    assert node_name_problem(name) is not None
    with pytest.raises(codec.MalformedBatch, match="hello.node"):
        codec.hello_from_pb(codec.hello_to_pb(NodeHello(name, "t", 1.0)))
    with pytest.raises(RankTimingError):
        parse_line(f'{{"job": "j", "rank": 0, "step": 1, "step_seconds": 1.0, "node": "{name}"}}')


@pytest.mark.parametrize("label,value", [("device", "mlx5/0"), ("port", "1/2"), ("gpu", "0/nvlink1"),
                                         ("interface", "eth\u202e0"), ("link", "1\x07")])
def test_series_names_that_break_ids_are_refused_at_decode(label, value):
    labels = {"device": "mlx5_0", "port": "1", "counter": "symbol_error", label: value}
    b = NodeBatch(node="node-000", seq=1, ts=1764000000.0, interval_seconds=1.0,
                  deltas=(CounterDelta("fabricmon_ib_port_errors_total", tuple(sorted(labels.items())), 1.0),))
    with pytest.raises(codec.MalformedBatch, match=f"label {label}"):
        codec.SeriesDecoder().decode(codec.SeriesEncoder().encode(b), "node-000")
    nic = NicHello("mlx5/0", "1", "0", "InfiniBand", "", 400.0, 4, 0)
    with pytest.raises(codec.MalformedBatch, match=r"hello.nics\[0\].device"):
        codec.hello_from_pb(codec.hello_to_pb(NodeHello("node-000", "t", 1.0, nics=(nic,))))


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")
def test_a_node_with_its_own_token_cannot_open_an_incident_under_a_broken_id(tmp_path):
    pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")
    (tmp_path / "tokens.yaml").write_text("node-000: t0\nnode-001: t1\n")
    g, h = free_port(), free_port()
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({
        "topology": str(topology_yaml(tmp_path / "topology.yaml")), "grpc_listen": f"127.0.0.1:{g}",
        "http_listen": f"127.0.0.1:{h}", "tick_seconds": 0.1, "state_file": str(tmp_path / "incidents.json"),
        "auth": {"node_tokens_file": str(tmp_path / "tokens.yaml")}}))
    agg = Proc(["aggregator", "--config", str(cfg), "--log-format", "json"], tmp_path / "agg.log")
    agent = None
    refused = 'fabricmon_grpc_streams_refused_total{reason="malformed"}'
    try:
        assert agg.wait_log("aggregator_started"), agg.text()
        agent = Agent(tmp_path, types.SimpleNamespace(grpc=g), "node-000", token="t0", interval=0.2)
        for _ in range(60):
            agent.send(link_errors("mlx5/0"))
            if wait_until(lambda: refused + " 1" in metrics(h) or "mlx5/0" in metrics(h), 0.2):
                break
        body = metrics(h)
        assert "mlx5/0" not in body, body  # no incident, suspicion or series under the broken id
        assert any(line.startswith(refused) and float(line.split()[-1]) >= 1 for line in body.splitlines()), body
        assert agg.wait_log("label device: holds '/'", timeout=10), agg.text()[-2000:]
    finally:
        if agent is not None:
            agent.stop()
        agg.stop()
