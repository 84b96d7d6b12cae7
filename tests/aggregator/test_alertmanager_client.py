"""The Alertmanager client against a real Alertmanager on 127.0.0.1 routing to a local webhook."""

from __future__ import annotations

import json
import time

import pytest

from fabricmon import components
from fabricmon.aggregator.alertmanager import AlertmanagerClient, rfc3339
from fabricmon.aggregator.incidents import Finding, IncidentManager
from support.amrig import Webhook, _incident, _start_am
from support.promtools import free_port, wait_until

pytestmark = pytest.mark.integration


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
        assert a["annotations"]["summary"].startswith("Fabric link node-003/mlx5_3/1")
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
