"""Remediation across shards (issue 42): the breaker counts the other shards' actions, read back from a real
Alertmanager where each shard's alerts carry what it did (``remediation_acted``), and only the shard that owns
a node decides about it; and the service wires the stage (state file section, /metrics, the executor)."""

from __future__ import annotations

import pytest
import yaml
from prometheus_client import generate_latest

from fabricmon.aggregator import incident_store
from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.remediation.config import RemediationSettings, WebhookSettings
from fabricmon.aggregator.remediation.wiring import build_remediator
from fabricmon.aggregator.remote_evidence import AlertmanagerEvidence
from support.amrig import Webhook
from support.enginerig import Cluster, _port, _set_state


def down(node, dev="mlx5_0"):
    def inject(cl):
        _set_state(cl, node, dev, 1, 2)
        cl.feeds[node].add("fabricmon_ib_port_errors_total", _port(dev) + (("counter", "link_downed"),), 1)
    return inject


def shard(units: tuple[int, ...], settings: RemediationSettings, tmp_path, remote=None):
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.engine = Engine(c.topo, c.engine.settings, shard_units=units)  # batches of other units are dropped
    for f in c.feeds.values():
        c.engine.hello(f.hello())
    r = build_remediator(settings, c.engine, str(tmp_path / f"state-{units[0]}.json"),
                         shard=f"units {units[0]}", remote=remote)
    return c, r


@pytest.mark.integration
def test_the_breaker_counts_the_other_shards_actions_and_only_the_owner_acts(tmp_path):
    from support.promtools import running_alertmanager

    hook = Webhook()
    cfg = {"route": {"receiver": "null", "group_by": ["alertname", "component"]}, "receivers": [{"name": "null"}]}
    try:
        with running_alertmanager(cfg, tmp_path / "am") as am:
            s = RemediationSettings(mode="act", actions=("webhook",), max_nodes=2, max_nodes_percent=0.0,
                                    webhook=WebhookSettings(url=hook.url))
            a, ra = shard((0,), s, tmp_path)
            src = AlertmanagerEvidence([am.url], cluster="test", topo=a.topo, own_units=frozenset({1}),
                                       poll_s=1.0, timeout=2.0, shard="units 1")
            b, rb = shard((1,), s, tmp_path, remote=src.remote_actions)
            a_sender = AlertmanagerClient([am.url], cluster="test", shard="units 0")

            def second(n: int, inject=None) -> None:
                for _ in range(n):
                    for c, r in ((a, ra), (b, rb)):
                        c.step(inject)
                        assert r.executor.wait_idle(30.0)
                    a_sender.submit([i for i in a.engine.incidents() if i.open], a.t)
                    a_sender._once()
                    src.poll_once()  # the poller's body on the test's clock

            second(10)
            # shard A: two nodes of its unit fail and are acted on (its limit, alone, would allow one more)
            second(1, lambda cl: (down("node-001")(cl), down("node-002", "mlx5_1")(cl)))
            second(4)
            assert sorted(b["node"] for b in hook.received if b.get("event") == "remediate") == ["node-001",
                                                                                               "node-002"]
            assert sorted(n for _, n in src.remote_actions()) == ["node-001", "node-002"]
            # shard B: one node of its unit fails: two actions cluster-wide already, the third trips B's breaker
            second(1, down("node-009", "mlx5_2"))
            second(3)
            (inc,) = [i for i in b.engine.incidents() if i.alertname == "FabricLinkDown"]
            assert inc.component == "node-009/mlx5_2/1" and inc.remediation[-1]["decision"] == "breaker"
            assert rb.state.breaker.tripped and [b["node"] for b in hook.received].count("node-009") == 0
            # A never saw node-009's batches (not its unit): no incident there, no decision
            assert not [i for i in a.engine.incidents() if i.component.startswith("node-009/")]
            assert not ra.state.breaker.tripped
    finally:
        hook.close()


def test_the_service_wires_remediation_into_the_state_file_and_metrics(tmp_path):
    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.aggregator.service import build_runtime
    from support.net import free_port

    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"cluster": "c", "generate": {"nodes": 4}}))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({
        "topology": "t.yaml", "auth": {"insecure": True}, "state_file": str(tmp_path / "state.json"),
        "grpc_listen": f"127.0.0.1:{free_port()}", "http_listen": f"127.0.0.1:{free_port()}",
        "remediation": {"max_nodes": 3}}))
    rt = build_runtime(load_aggregator_config(tmp_path / "a.yaml"))
    r = rt.engine.detection.remediation
    assert r is not None and r.executor in rt.background and r.s.mode == "dry_run"
    rt.on_changed([], 0.0)
    section = incident_store.read_section(tmp_path / "state.json", "remediation")
    assert section["breaker"]["tripped_at"] is None and section["nodes"] == []
    text = generate_latest(rt.http.registry).decode()
    assert 'fabricmon_remediation_enabled{mode="dry_run"} 1.0' in text
    assert "fabricmon_remediation_breaker_limit 3.0" in text
