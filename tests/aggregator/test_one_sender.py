"""One sender per fault (issue 25): one link fault is one firing and one resolved notification,
with the aggregator up (it sends, the Prometheus rules stay silent) and again with it down (the
rules, its fallback, send).

Real parts on 127.0.0.1: a simulated 8-node cluster in tree mode polled by real agents, a real
Prometheus scraping them and the aggregator's HTTP API and evaluating the shipped rules (a test
copy rendered by deploy/prometheus/mixin.py with every ``for:`` at 1 s: same expressions), the
aggregator engine fed the same batches and sending through its AlertmanagerClient, and a real
Alertmanager (group_wait 0 s, group_interval 1 s: any second firing or resolved shows) posting to
a local webhook.  Before the fallback, both senders fired and resolved at different times and
Alertmanager notified firing, resolved, firing, resolved for one fault.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.demo.local_alertmanager import WebhookReceiver
from support.mixin import _mixin
from support.promtools import live_fabric, running_alertmanager, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

# Sample (= wall) seconds after the simulation starts.
UP_FAULT = (4.0, 10.0)      # node-002 rail 3 link down, aggregator up
AGGREGATOR_STOPS = 24.0     # its incident resolved (10 s state hold) before it goes
DOWN_FAULT = (28.0, 34.0)   # node-005 rail 1 link down, aggregator down


def _rules(tmp: Path) -> list[Path]:
    mixin = _mixin()
    cfg = dataclasses.replace(mixin.CONFIG, for_windows={k: "1s" for k in mixin.CONFIG.for_windows})
    tmp.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in mixin.render(cfg).items():
        (tmp / name).write_text(text)
        out.append(tmp / name)
    return out


def _am_config(url: str) -> dict:
    return {"route": {"receiver": "hook", "group_by": ["cluster", "alertname", "component"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": url, "send_resolved": True}]}]}


def test_one_fault_is_one_firing_and_one_resolved_with_the_aggregator_up_and_down(tmp_path) -> None:
    from fabricmon.sim.scenario import ClusterSpec, Scenario

    scn = Scenario(ClusterSpec(8, "roce", 4, seed=5), DOWN_FAULT[1] + 12.0)
    scn = scn.with_fault("link_down", node="node-002", rail=3, start=UP_FAULT[0], end=UP_FAULT[1])
    scn = scn.with_fault("link_down", node="node-005", rail=1, start=DOWN_FAULT[0], end=DOWN_FAULT[1])
    up_comp, down_comp = (g.component for g in scn.ground_truth())
    hook = WebhookReceiver()
    hook.start()
    aggregator_up = threading.Event()
    aggregator_up.set()
    try:
        with running_alertmanager(_am_config(hook.url), tmp_path / "am") as am:
            sender = AlertmanagerClient([am.url], cluster="", resend_seconds=30.0)
            sender.start()

            def on_incidents(changed: list, now: float) -> None:
                if aggregator_up.is_set() and changed:
                    sender.submit(changed, now)

            try:
                with live_fabric(scn, tmp_path / "fabric", rule_files=_rules(tmp_path / "rules"), probe=False,
                                 alertmanagers=[am.address], on_incidents=on_incidents) as lf:
                    sender.cluster = lf.sim.topology.cluster

                    def notes(comp: str) -> list[str]:
                        return [status for _, status, a in hook.alerts() if a["labels"].get("component") == comp
                                and a["labels"].get("alertname") == "FabricLinkDown"]

                    # Aggregator up: it sends, and resolves once the link is back.
                    wait_until(lambda: "resolved" in notes(up_comp), AGGREGATOR_STOPS + 5, "the aggregator's resolve")
                    # The aggregator goes: no more sends, and Prometheus sees its target down.
                    wait_until(lambda: time.time() - lf.epoch >= AGGREGATOR_STOPS, AGGREGATOR_STOPS + 5, "phase 2")
                    aggregator_up.clear()
                    sender.flush(timeout=3.0)
                    lf.http_api.stop()
                    lf.prom.wait_for_query('up{job="fabricmon-aggregator"} == 0', deadline=10)
                    assert time.time() - lf.epoch < DOWN_FAULT[0], "aggregator seen down only after the second fault"
                    # Aggregator down: the rules send, and resolve.
                    wait_until(lambda: "resolved" in notes(down_comp), DOWN_FAULT[1] + 20 - (time.time() - lf.epoch),
                               "the fallback rule's resolve")
                    time.sleep(3.0)  # a second firing or resolved would come within group_interval (1 s)
                    up_notes, down_notes = notes(up_comp), notes(down_comp)
                    sources = {(a["labels"].get("component"), a.get("generatorURL", "")) for _, _, a in hook.alerts()
                               if a["labels"].get("alertname") == "FabricLinkDown"}
                    assert lf.errors == [], lf.errors
            finally:
                sender.stop()
    finally:
        hook.stop()
    assert up_notes == ["firing", "resolved"], f"aggregator up: {up_notes} for {up_comp}"
    assert down_notes == ["firing", "resolved"], f"aggregator down: {down_notes} for {down_comp}"
    # Who sent which: Prometheus names its rule in generatorURL (/graph?g0.expr=...).
    by = {comp: {"prometheus" if "/graph" in url else "aggregator" for c, url in sources if c == comp}
          for comp in (up_comp, down_comp)}
    assert by == {up_comp: {"aggregator"}, down_comp: {"prometheus"}}, by
