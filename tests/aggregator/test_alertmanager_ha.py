"""Alertmanager HA as users run it: two real Alertmanagers clustered on loopback, the aggregator
sending every alert to both.  One is stopped mid-fault; the webhook still gets the firing and the
resolved notification exactly once each (Alertmanager's gossip dedups, the client's per-URL
threads keep the live one fed while the dead one's queue retries)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import yaml

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.incidents import IncidentManager
from support.amrig import Webhook, _am_config, _incident
from support.promtools import ALERTMANAGER, Alertmanager, _start, free_port, require_binary, wait_until

pytestmark = pytest.mark.integration

# How long the second peer waits for the first's notification log before it sends too.  At 1 s a busy
# 2-core CI run once delivered the gossip late and both peers sent the firing notification: that is
# Alertmanager's own at-least-once under load (its default is 15 s), not the client's doing.
PEER_TIMEOUT_S = 5.0


def _start_peer(workdir, hook_url: str, listen: int, peer: int) -> Alertmanager:
    binary = require_binary(ALERTMANAGER)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(_am_config(hook_url)))
    (workdir / "data").mkdir(exist_ok=True)
    port = free_port()
    argv = [binary, f"--config.file={cfg}", f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{listen}",
            f"--cluster.advertise-address=127.0.0.1:{listen}", f"--cluster.peer=127.0.0.1:{peer}",
            f"--cluster.peer-timeout={PEER_TIMEOUT_S}s", "--cluster.gossip-interval=50ms",
            "--cluster.pushpull-interval=1s", "--log.level=warn"]
    svc = _start("alertmanager", argv, port, workdir, "/-/ready", 20.0)
    return Alertmanager(svc.name, svc.proc, svc.port, svc.workdir, svc.log_path)


def _gossip_updates(am: Alertmanager) -> float:
    """Gossip updates the peer received (notification-log entries and silences; no silences here)."""
    from support.promtools import http

    status, body = http("GET", f"{am.url}/metrics")
    if status != 200 or not isinstance(body, str):
        return 0.0
    for line in body.splitlines():
        if line.startswith('alertmanager_cluster_messages_received_total{msg_type="update"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _peers(am: Alertmanager) -> int:
    from support.promtools import http

    status, body = http("GET", f"{am.url}/api/v2/status")
    return len(body["cluster"]["peers"]) if status == 200 else 0


def test_two_clustered_alertmanagers_one_stopped_mid_fault_each_alert_once(tmp_path):
    hook = Webhook()
    p1, p2 = free_port(), free_port()
    am1 = _start_peer(tmp_path / "am1", hook.url, p1, p2)
    am2 = _start_peer(tmp_path / "am2", hook.url, p2, p1)
    client = AlertmanagerClient([am1.url, am2.url], cluster="test", resend_seconds=3600, timeout=2.0)
    try:
        wait_until(lambda: _peers(am1) == 2 and _peers(am2) == 2, 20.0, "the two Alertmanagers to form a cluster")
        client.start()
        mgr = IncidentManager()
        before = _gossip_updates(am1) + _gossip_updates(am2)
        t0 = time.time()
        client.submit(_incident(mgr, t0), t0)
        # every alert goes to every Alertmanager
        wait_until(lambda: (am1.get_alerts(alertname="FabricLinkErrors")
                            and am2.get_alerts(alertname="FabricLinkErrors")),
                   10.0, "the alert at both Alertmanagers")
        wait_until(lambda: hook.alerts("firing"), 15.0, "the firing notification")
        # The peer that notified gossips its log entry; stopped before the other has it, the other sends
        # the firing notification again when its peer timeout ends (Alertmanager's at-least-once: a CI
        # run stopped it that early).  An operator's peer going down is not timed to that either, but the
        # test is about the client's share: each peer fed, each notification once when gossip works.
        wait_until(lambda: _gossip_updates(am1) + _gossip_updates(am2) > before, 10.0,
                   "the notification log entry at the other peer")

        am1.stop()  # mid-fault: the one that was first in the cluster is gone
        client.submit(_incident(mgr, t0 + 20, fire=False), t0 + 20)
        wait_until(lambda: hook.alerts("resolved"), 20.0, "the resolved notification from the surviving peer")
        # the dead one's queue keeps retrying on its own thread; the live one's is empty
        assert not client.urls[1].queue
        assert client.urls[0].queue, "the stopped Alertmanager's resolve should still be queued"
        # no duplicate from either peer: wait past the peer timeout and one group interval
        time.sleep(2 * PEER_TIMEOUT_S + 2.0)
        firing = [a for a in hook.alerts("firing") if a["labels"]["component"] == "node-003/mlx5_3/1"]
        resolved = [a for a in hook.alerts("resolved") if a["labels"]["component"] == "node-003/mlx5_3/1"]
        assert (len(firing), len(resolved)) == (1, 1), hook.received
    finally:
        client.stop(flush_timeout=0)
        am1.stop()
        am2.stop()
        hook.close()


def test_a_hung_alertmanager_does_not_delay_the_other(tmp_path):
    """A peer that accepts connections and never answers holds a POST for the whole timeout
    (30 s here); the other peer still gets the alert at once, and the webhook hears it once."""
    hook = Webhook()
    p1, p2 = free_port(), free_port()
    am1 = _start_peer(tmp_path / "am1", hook.url, p1, p2)
    am2 = _start_peer(tmp_path / "am2", hook.url, p2, p1)
    client = AlertmanagerClient([am1.url, am2.url], cluster="test", resend_seconds=3600, timeout=30.0)
    try:
        wait_until(lambda: _peers(am1) == 2 and _peers(am2) == 2, 20.0, "the two Alertmanagers to form a cluster")
        os.kill(am1.proc.pid, signal.SIGSTOP)  # hung: the kernel still accepts its connections
        client.start()
        t0 = time.time()
        client.submit(_incident(IncidentManager(), t0), t0)
        wait_until(lambda: am2.get_alerts(alertname="FabricLinkErrors"), 10.0,
                   "the alert at the live Alertmanager while the other hangs")
        wait_until(lambda: hook.alerts("firing"), 15.0, "the firing notification")
        assert client.urls[0].queue, "the hung Alertmanager cannot have answered"
    finally:
        os.kill(am1.proc.pid, signal.SIGCONT)
        client.stop(flush_timeout=0)
        am1.stop()
        am2.stop()
        hook.close()
