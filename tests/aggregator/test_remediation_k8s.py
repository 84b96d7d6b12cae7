"""k8s_taint and webhook (issue 42) against an in-process HTTPS Kubernetes API that records each request
(tests/support/kubenodes.py) and a loopback webhook receiver; the engine runs in process on sample time."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fabricmon.aggregator.remediation.actions import CONDITION, TAINT_KEY
from fabricmon.aggregator.remediation.config import KubernetesSettings, RemediationSettings, WebhookSettings
from fabricmon.aggregator.remediation.wiring import build_remediator
from support.enginerig import Cluster, _port, _set_state
from support.kubenodes import FakeNodeApi

FOREIGN = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}  # another tool's taint


@pytest.fixture
def api(tmp_path):
    a = FakeNodeApi(tmp_path / "k8s")
    try:
        yield a
    finally:
        a.close()


class Hook:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        hook = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/fabricmon"
        self.t = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.t.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def rig(tmp_path, api: FakeNodeApi, actions=("k8s_taint",), api_url: str | None = None, **kw):
    c = Cluster(nodes=8, nodes_per_unit=8)
    s = RemediationSettings(mode="act", actions=actions, undo_after=20.0, retry_backoff_s=0.05,
                            kubernetes=KubernetesSettings(api_url=api.url if api_url is None else api_url,
                                                          token_file=str(api.token_file), ca_file=api.ca), **kw)
    r = build_remediator(s, c.engine, str(tmp_path / "state.json"))
    c.run(10)
    return c, r


def settle(c, r, seconds=1, inject=None):
    for _ in range(seconds):
        c.step(inject)
        assert r.executor.wait_idle(30.0)
    c.step(inject)


def down(node, dev="mlx5_0"):
    def inject(cl):
        _set_state(cl, node, dev, 1, 2)
        cl.feeds[node].add("fabricmon_ib_port_errors_total", _port(dev) + (("counter", "link_downed"),), 1)
    return inject


def test_taint_and_condition_through_in_cluster_credentials_then_only_fabricmons_taint_is_removed(
        tmp_path, api, monkeypatch):
    host, port = api.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)  # in-cluster: no api_url, the Service's env
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    api.add_node("node-000", taints=[FOREIGN])
    hook = Hook()
    try:
        c, r = rig(tmp_path, api, actions=("k8s_taint", "webhook"), api_url="",
                   webhook=WebhookSettings(url=hook.url))
        settle(c, r, 1, down("node-000"))
        settle(c, r, 3)
        inc = c.incidents(alertname="FabricLinkDown")[0]
        reason = f"fabricmon: FabricLinkDown node-000/mlx5_0/1 {inc.id}"
        taint, status = api.patches()
        assert (taint.path, taint.content_type) == ("/api/v1/nodes/node-000", "application/merge-patch+json")
        assert taint.body == {"metadata": {"resourceVersion": "100",
                                           "annotations": {"fabricmon.io/remediation-reason": reason}},
                              "spec": {"taints": [FOREIGN, {"key": TAINT_KEY, "value": "FabricLinkDown",
                                                            "effect": "NoSchedule"}]}}
        assert (status.path, status.content_type) == ("/api/v1/nodes/node-000/status",
                                                      "application/strategic-merge-patch+json")
        (cond,) = status.body["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["message"]) == (CONDITION, "False", reason)
        node = api.node("node-000")
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]} == {"Ready": "True", CONDITION: "False"}
        assert [b["event"] for b in hook.bodies] == ["remediate"]
        assert hook.bodies[0]["node"] == "node-000" and hook.bodies[0]["incident"]["id"] == inc.id
        # resolved and clean for undo_after: fabricmon's taint goes, the other tool's stays
        settle(c, r, 1, lambda cl: _set_state(cl, "node-000", "mlx5_0", 4, 5))
        settle(c, r, 40)
        assert inc.resolved_at is not None
        node = api.node("node-000")
        assert node["spec"]["taints"] == [FOREIGN]
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]} == {"Ready": "True", CONDITION: "True"}
        assert [b["event"] for b in hook.bodies] == ["remediate", "undo"]
        assert [e["decision"] for e in inc.remediation] == ["act", "done", "done", "undo_done", "undo_done"]
    finally:
        hook.close()


def test_a_cordoned_node_is_left_alone(tmp_path, api):
    api.add_node("node-001", unschedulable=True)  # an operator's `kubectl cordon`
    c, r = rig(tmp_path, api)
    settle(c, r, 1, down("node-001"))
    settle(c, r, 3)
    assert api.patches() == []
    assert "foreign_drain" in [e["decision"] for e in c.incidents(alertname="FabricLinkDown")[0].remediation]
    assert r.state.nodes.get("node-001") is None  # nothing of fabricmon's to undo there, ever


def test_a_conflict_is_retried_with_backoff_and_a_missing_node_fails_counted(tmp_path, api):
    api.add_node("node-002")
    api.conflicts = 1  # someone else patched the node between our GET and PATCH
    c, r = rig(tmp_path, api, retries=2)
    settle(c, r, 1, down("node-002"))
    settle(c, r, 3)
    taints = [p for p in api.patches() if p.path == "/api/v1/nodes/node-002"]
    assert len(taints) == 2 and r.executor.retries_total == 1
    assert [t["key"] for t in api.node("node-002")["spec"]["taints"]] == [TAINT_KEY]
    # node-003 is not in the API at all: three attempts (retries: 2), then failed, counted
    settle(c, r, 1, down("node-003", "mlx5_1"))
    settle(c, r, 3)
    assert r.actions_total[("k8s_taint", "failed")] == 1 and r.executor.retries_total == 3
    entry = c.incidents(alertname="FabricLinkDown", component="node-003/mlx5_1/1")[0].remediation[-1]
    assert entry["decision"] == "failed" and "HTTP 404" in entry["detail"]
