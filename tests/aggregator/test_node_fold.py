"""A node whose NICs fail together is one node incident, one notification (issue 25; DESIGN: "one
host slow on all rails is the host").  Engine-level with hand-built batches (tests/aggregator/test_engine.py's
Cluster), then the same incidents through the aggregator's AlertmanagerClient to a real
Alertmanager 0.25 and its webhook."""

from __future__ import annotations

import pytest

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from support.amrig import Webhook, _start_am
from support.enginerig import Cluster, _port, _set_state
from support.waiting import wait_until


def _down(node: str, devices: list[str]):
    def inject(c: Cluster) -> None:
        for dev in devices:
            _set_state(c, node, dev, 1, 2)
            c.feeds[node].add("fabricmon_ib_port_errors_total", _port(dev) + (("counter", "link_downed"),), 1)
    return inject


def _devices(c: Cluster, node: str) -> list[str]:
    return [n.device for n in c.topo.nodes[node].nics if n.rail is not None]


def test_all_nics_of_a_node_down_is_one_node_incident_and_a_lone_link_its_own():
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.run(5)
    devs = _devices(c, "node-002")
    assert len(devs) == 8
    c.step(_down("node-002", devs))                # the host's 8 rail links at once
    c.step(_down("node-005", devs[3:4]))           # and, elsewhere, one cable
    c.run(5)
    down = {(i.component_type, i.component) for i in c.incidents(alertname="FabricLinkDown") if i.open}
    assert down == {("node", "node-002"), ("link", "node-005/mlx5_3/1")}, down
    node_inc = c.incidents(alertname="FabricLinkDown", component="node-002")[0]
    assert node_inc.severity == "critical" and sorted(node_inc.absorbed) == sorted(f"node-002/{d}/1" for d in devs)
    # back up: resolved once
    c.step(lambda cl: [_set_state(cl, "node-002", d, 4, 5) for d in devs])
    c.run(int(c.engine.settings.hold_s) + 3)
    assert node_inc.resolved_at is not None
    assert [(a, comp, op) for _, a, comp, op in c.reported if comp.startswith("node-002")] == [
        ("FabricLinkDown", "node-002", True), ("FabricLinkDown", "node-002", False)]


def test_two_links_of_a_node_are_still_two_cables():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)
    devs = _devices(c, "node-001")[:2]
    c.step(_down("node-001", devs))
    c.run(5)
    got = sorted((i.component_type, i.component) for i in c.incidents(alertname="FabricLinkDown") if i.open)
    assert got == [("link", f"node-001/{d}/1") for d in sorted(devs)], got


@pytest.mark.integration
def test_a_node_whose_nics_fail_together_is_one_notification(tmp_path):
    hook = Webhook()
    am = _start_am(tmp_path / "am", hook.url)
    sender = AlertmanagerClient([am.url], cluster="test", resend_seconds=60.0)
    sender.start()
    try:
        c = Cluster(nodes=4, nodes_per_unit=4)
        c.run(5)
        c.step(_down("node-002", _devices(c, "node-002")))
        c.run(3)
        opened = [i for i in c.engine.incidents() if i.open]
        sender.submit(opened, c.t)
        assert wait_until(lambda: hook.alerts("firing"), 15)
        sender.flush(timeout=3.0)
        wait_until(lambda: False, 2.0)  # a second notification would come within group_interval (1 s)
        notes = list(hook.received)
    finally:
        sender.stop()
        am.stop()
        hook.close()
    assert len(notes) == 1, notes
    assert [(a["labels"]["alertname"], a["labels"]["component"], a["labels"]["component_type"])
            for a in notes[0]["alerts"]] == [("FabricLinkDown", "node-002", "node")]
