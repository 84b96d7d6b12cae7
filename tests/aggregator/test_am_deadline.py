"""Every Alertmanager call ends within its total deadline (issue 35 item 15): an Alertmanager that
answers 200 and then drips a byte at a time held the cross-shard evidence poll (the next URL never
tried, no result counted) and the sender's queue for that URL, since urllib's timeout bounds each
read, not the exchange.  Real HTTP on 127.0.0.1 against support.badam's dripping server."""

from __future__ import annotations

import time

import pytest

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.incidents import Incident
from fabricmon.aggregator.remote_evidence import AlertmanagerEvidence
from fabricmon.topology import generate_topology
from support.badam import FakeAlertmanager
from support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def ams():
    made: list[FakeAlertmanager] = []

    def make(mode: str, **kw) -> FakeAlertmanager:
        made.append(FakeAlertmanager(mode, **kw))
        return made[-1]

    yield make
    for am in made:
        am.close()


def test_a_dripping_alertmanager_costs_the_evidence_poll_its_timeout_then_the_next_url_answers(ams):
    drip, good = ams("drip"), ams("empty")
    topo = generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test")
    src = AlertmanagerEvidence([drip.url, good.url], cluster="test", topo=topo, own_units=frozenset({1}),
                               poll_s=2.0, timeout=1.0)
    t0 = time.monotonic()
    assert src.poll_once() is True  # at 64bf867: ~60 s, as long as the drip lasts
    took = time.monotonic() - t0
    assert (src.stats.polls, drip.gets, good.gets) == ({"ok": 1, "error": 0}, 1, 1)
    assert took < 5.0, f"the poll took {took:.1f} s with a 1 s timeout"


def test_a_dripping_alertmanager_fails_the_post_within_the_timeout(ams):
    drip = ams("empty", drip_posts=True)
    sender = AlertmanagerClient([drip.url], cluster="test", timeout=1.0)
    inc = Incident(id="FabricLinkDown-1", alertname="FabricLinkDown", severity="critical", component_type="link",
                   component="node-000/mlx5_0/1", labels={"node": "node-000"}, evidence=["down"],
                   first_seen=time.time(), last_seen=time.time())
    sender.start()
    try:
        t0 = time.monotonic()
        sender.submit([inc], time.time())
        # the POST arrives, its answer drips: counted an error (retried) once the 1 s deadline passes
        assert wait_until(lambda: sender.sent_total["error"] >= 1, 10), sender.sent_total
        assert len(drip.posted) >= 1 and time.monotonic() - t0 < 10
    finally:
        sender.stop(flush_timeout=0.0)
