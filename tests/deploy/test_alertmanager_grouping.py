"""One leaf, one page: the shipped Alertmanager config groups a leaf's link alerts together.

16 links of one leaf going down (a leaf reboot, a cut bundle) are 16 ``FabricLinkDown`` alerts; the
on-call must get one notification listing them, not 16.  Checked on a real Alertmanager 0.25 with
deploy/alertmanager/alertmanager.yml as shipped, only its receivers' URLs pointed at a local webhook.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
import yaml

from fabricmon.demo.local_alertmanager import WebhookReceiver
from support.promtools import REPO, running_alertmanager, wait_until

pytestmark = pytest.mark.integration

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
# Units 1 and 2 of a 16-nodes-per-unit cluster: the rail-3 links under leaf-u1-r3 and leaf-u2-r3.
LEAVES = {"leaf-u1-r3": [f"node-{i:03d}" for i in range(16, 32)],
          "leaf-u2-r3": [f"node-{i:03d}" for i in range(32, 48)]}


def _seconds(d: str) -> float:
    return float(d[:-1]) * {"s": 1, "m": 60, "h": 3600}[d[-1]]


def _route_timing(cfg: dict, receiver: str) -> tuple[float, float]:
    """(group_wait, group_interval) of the first top-level route to ``receiver``, inherited from the root."""
    root = cfg["route"]
    route = next(r for r in root["routes"] if r.get("receiver") == receiver)
    return (_seconds(route.get("group_wait", root.get("group_wait", "30s"))),
            _seconds(route.get("group_interval", root.get("group_interval", "5m"))))


def _pointed_at(cfg: dict, url: str) -> dict:
    for rcv in cfg["receivers"]:
        for hook in rcv.get("webhook_configs", []):
            hook["url"] = f"{url}/{rcv['name']}"
    return cfg


def _link_alerts(alertname: str, severity: str, leaf: str) -> list[dict[str, Any]]:
    now = dt.datetime.now(dt.UTC)
    return [{"labels": {"cluster": "test", "alertname": alertname, "severity": severity, "component_type": "link",
                        "component": f"{node}/mlx5_3/1", "node": node, "rail": "3", "leaf": leaf},
             "annotations": {"summary": f"{alertname} on {node}/mlx5_3/1"},
             "startsAt": now.isoformat(), "endsAt": (now + dt.timedelta(minutes=10)).isoformat()}
            for node in LEAVES[leaf]]


def test_sixteen_links_of_one_leaf_are_one_notification_per_receiver(tmp_path) -> None:
    cfg = yaml.safe_load(CONFIG.read_text())
    pager_wait, pager_interval = _route_timing(cfg, "fabric-pager")
    ticket_wait, _ = _route_timing(cfg, "fabric-ticket")
    hook = WebhookReceiver()
    hook.start()
    try:
        with running_alertmanager(yaml.safe_dump(_pointed_at(cfg, hook.url.rsplit("/", 1)[0])), tmp_path / "am") as am:
            posted = time.time()
            # Link down pages the fabric on-call; link errors are the fabric ticket queue's (on another
            # leaf: FabricLinkDown inhibits errors on its own links).
            am.post_alerts(_link_alerts("FabricLinkDown", "critical", "leaf-u1-r3")
                           + _link_alerts("FabricLinkErrors", "warning", "leaf-u2-r3"))

            def by_receiver() -> dict[str, list[tuple[float, dict]]]:
                out: dict[str, list[tuple[float, dict]]] = {}
                with hook._lock:
                    for at, payload in hook.notifications:
                        out.setdefault(payload.get("receiver", "?"), []).append((at, payload))
                return out

            # Each receiver's first notification within its group_wait + 5 s.
            wait_until(lambda: "fabric-pager" in by_receiver(), pager_wait + 5, "the fabric pager's notification")
            wait_until(lambda: "fabric-ticket" in by_receiver(), ticket_wait + 5 - (time.time() - posted),
                       "the fabric ticket's notification")
            # Any other group would have flushed at its own group_wait; watch up to the pager's
            # group_interval (less than the ticket route's), when a changed group could notify again.
            time.sleep(max(0.0, posted + pager_interval - 1.0 - time.time()))
            got = by_receiver()
    finally:
        hook.stop()

    assert sorted(got) == ["fabric-pager", "fabric-ticket"], {k: len(v) for k, v in got.items()}
    for receiver, alertname, leaf, wait in (("fabric-pager", "FabricLinkDown", "leaf-u1-r3", pager_wait),
                                            ("fabric-ticket", "FabricLinkErrors", "leaf-u2-r3", ticket_wait)):
        notes = got[receiver]
        assert len(notes) == 1, f"{receiver}: {len(notes)} notifications, first group {notes[0][1]['groupLabels']}"
        at, note = notes[0]
        assert at - posted <= wait + 5.0, f"{receiver}: first notification {at - posted:.1f} s after the post"
        assert note["groupLabels"] == {"cluster": "test", "alertname": alertname, "leaf": leaf}
        assert sorted(a["labels"]["node"] for a in note["alerts"]) == LEAVES[leaf]
        assert {a["status"] for a in note["alerts"]} == {"firing"}
