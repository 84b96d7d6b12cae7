"""The Alertmanager client against a real Alertmanager on 127.0.0.1 routing to a local webhook."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from promtools import ALERTMANAGER, Alertmanager, _start, free_port, require_binary, wait_until

from fabricmon import components
from fabricmon.aggregator.alertmanager import AlertmanagerClient, rfc3339
from fabricmon.aggregator.incidents import Finding, IncidentManager

pytestmark = pytest.mark.integration


class Webhook:
    def __init__(self) -> None:
        self.received: list[dict] = []
        self.lock = threading.Lock()
        hook = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hook.lock:
                    hook.received.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def alerts(self, status: str | None = None) -> list[dict]:
        with self.lock:
            out = [a for n in self.received for a in n["alerts"]]
        return [a for a in out if status is None or a["status"] == status]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _am_config(hook_url: str) -> dict:
    return {
        "route": {"receiver": "hook", "group_by": ["alertname", "component"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook_url, "send_resolved": True}]}],
    }


def _start_am(tmp_path, hook_url: str, port: int | None = None) -> Alertmanager:
    binary = require_binary(ALERTMANAGER)
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(_am_config(hook_url)))
    (tmp_path / "data").mkdir(exist_ok=True)
    port = port or free_port()
    argv = [binary, f"--config.file={cfg}", f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]
    svc = _start("alertmanager", argv, port, tmp_path, "/-/ready", 20.0)
    return Alertmanager(svc.name, svc.proc, svc.port, svc.workdir, svc.log_path)


def _incident(mgr: IncidentManager, now: float, *, fire=True):
    f = Finding("FabricLinkErrors", components.link("node-003", "mlx5_3", 1),
                {"node": "node-003", "rail": "3", "leaf": "leaf-u0-r3", "cluster": "test"},
                ["PMA symbol/rcv errors +1234 in 3s"], fire=fire, keep=fire, ranks=(27,), jobs=("llm",))
    return mgr.update([f], now)


@pytest.fixture
def hook():
    h = Webhook()
    yield h
    h.close()


def test_open_then_resolve_reaches_the_webhook(tmp_path, hook):
    am = _start_am(tmp_path / "am", hook.url)
    client = AlertmanagerClient([am.url], cluster="test", resend_seconds=30, timeout=2,
                                generator_url="http://127.0.0.1:9722", runbook_base="https://example/runbooks#")
    client.start()
    try:
        mgr = IncidentManager(default_hold_s=2.0)
        now = time.time()
        client.submit(_incident(mgr, now), now)
        firing = wait_until(lambda: hook.alerts("firing"), 10.0, "firing alert at the webhook")
        a = firing[0]
        assert a["labels"] == {"alertname": "FabricLinkErrors", "severity": "warning", "component_type": "link",
                               "component": "node-003/mlx5_3/1", "node": "node-003", "rail": "3",
                               "leaf": "leaf-u0-r3", "cluster": "test"}
        assert "symbol" in a["annotations"]["description"] and "27" in a["annotations"]["description"]
        assert a["annotations"]["runbook_url"] == "https://example/runbooks#fabriclinkerrors"
        assert a["annotations"]["summary"].startswith("RDMA link node-003/mlx5_3/1")
        assert a["generatorURL"].startswith("http://127.0.0.1:9722/api/incidents?id=")
        # resolve: clean evidence for the hold time
        changed = mgr.update([], now + 3.0)
        assert changed and not changed[0].open
        client.submit(changed, now + 3.0)
        resolved = wait_until(lambda: hook.alerts("resolved"), 10.0, "resolved notification")
        assert resolved[0]["labels"]["component"] == "node-003/mlx5_3/1"
        assert client.sent_total["success"] >= 2 and client.sent_total["dropped"] == 0
    finally:
        client.stop(1.0)
        am.stop()


def test_alertmanager_down_first_then_up_delivers_once(tmp_path, hook):
    port = free_port()
    client = AlertmanagerClient([f"http://127.0.0.1:{port}"], cluster="test", resend_seconds=30, timeout=1)
    client.start()
    am = None
    try:
        mgr = IncidentManager()
        now = time.time()
        client.submit(_incident(mgr, now), now)
        wait_until(lambda: client.sent_total["error"] >= 1, 10.0, "a failed POST while Alertmanager is down")
        assert client.pending() == 1  # queued, not dropped
        am = _start_am(tmp_path / "am", hook.url, port=port)
        wait_until(lambda: hook.alerts("firing"), 40.0, "queued alert delivered once Alertmanager is up")
        # the webhook can see the alert before the client has processed Alertmanager's 200
        wait_until(lambda: client.pending() == 0, 10.0, "the delivered alert leaves the client's queue")
        time.sleep(2.5)  # group_interval 1s: a duplicate would have been notified by now
        firing = hook.alerts("firing")
        assert len({json.dumps(a["labels"], sort_keys=True) for a in firing}) == 1
        assert len(hook.received) == 1, hook.received
        stored = am.get_alerts()
        assert len(stored) == 1 and stored[0]["labels"]["component"] == "node-003/mlx5_3/1"
    finally:
        client.stop(1.0)
        if am is not None:
            am.stop()


def test_two_alertmanagers_one_down_the_other_still_gets_it(tmp_path, hook):
    am = _start_am(tmp_path / "am", hook.url)
    dead = f"http://127.0.0.1:{free_port()}"
    client = AlertmanagerClient([dead, am.url], cluster="test", timeout=1)
    client.start()
    try:
        mgr = IncidentManager()
        client.submit(_incident(mgr, time.time()), time.time())
        wait_until(lambda: hook.alerts("firing"), 10.0, "alert via the live Alertmanager")
        assert client.pending() == 1  # still queued for the dead one, never dropped
    finally:
        client.stop(0.5)
        am.stop()


def test_payload_times_and_queue_bound():
    wall = [1_764_000_100.0]
    client = AlertmanagerClient(["http://127.0.0.1:9"], resend_seconds=30, queue_max=3, wall=lambda: wall[0])
    mgr = IncidentManager(default_hold_s=1.0)
    inc = _incident(mgr, 1_764_000_000.0)[0]
    snap = client._snapshot(inc)
    p = client.payload(snap)
    assert p["startsAt"] == rfc3339(1_764_000_000.0) == "2025-11-24T16:00:00.000Z"
    assert p["endsAt"] == rfc3339(1_764_000_100.0 + 120)  # wall clock ahead of the sample clock
    resolved = mgr.update([], 1_764_000_002.0)[0]
    assert client.payload(client._snapshot(resolved))["endsAt"] == rfc3339(1_764_000_002.0)
    for k in range(5):
        f = Finding("FabricLinkDown", components.link("n", f"mlx5_{k}"), {}, ["x"])
        client.submit(mgr.update([f], 1_764_000_010.0 + k), 0)
    assert client.pending() == 3 and client.sent_total["dropped"] >= 3
