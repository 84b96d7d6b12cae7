"""A restarted aggregator resumes its open incidents (issue 25, "restarts that page nobody"): they are
persisted atomically with what was sent, restored under their own ids at start and reconciled with
Alertmanager's active alerts, so a fault still there is not fired again and one that cleared while
the aggregator was down is resolved once.  Engine-level batches (tests/aggregator/test_engine.py's Cluster),
the aggregator's AlertmanagerClient and a real Alertmanager 0.25 with a webhook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fabricmon import components
from fabricmon.aggregator import incident_store
from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.service import resume_incidents
from fabricmon.components import Component, Kind
from support.amrig import Webhook, _start_am
from support.enginerig import Cluster, _port, _set_state
from support.waiting import wait_until

LINK = "node-001/mlx5_6/1"


def _step(c: Cluster, sender: AlertmanagerClient, persist, inject=None) -> None:
    c.feed(inject)
    changed = c.engine.tick(c.t)
    if changed:
        sender.submit(changed, c.t)
        persist(changed, c.t)


def _down(cl: Cluster) -> None:
    _set_state(cl, "node-001", "mlx5_6", 1, 2)


def _up(cl: Cluster) -> None:
    _set_state(cl, "node-001", "mlx5_6", 4, 5)


@pytest.fixture
def rig(tmp_path):
    hook = Webhook()
    am = _start_am(tmp_path / "am", hook.url)
    yield hook, am
    am.stop()
    hook.close()


def _first_life(tmp_path, am) -> tuple[str, str]:
    """An aggregator that opens FabricLinkDown on LINK, then dies (SIGKILL: nothing resolved)."""
    state = str(tmp_path / "incidents.json")
    a = Cluster(nodes=4, nodes_per_unit=4)
    sender = AlertmanagerClient([am.url], cluster="test", resend_seconds=300.0)
    sender.start()
    persist = resume_incidents(state, a.engine, sender, now=a.t)
    for _ in range(3):
        _step(a, sender, persist)
    _step(a, sender, persist, lambda cl: (_down(cl), cl.feeds["node-001"].add(
        "fabricmon_ib_port_errors_total", _port("mlx5_6") + (("counter", "link_downed"),), 1)))
    for _ in range(3):
        _step(a, sender, persist)
    sender.flush(timeout=5.0)
    sender.stop(flush_timeout=0.0)
    inc = a.engine.manager.get_open("FabricLinkDown", LINK)
    assert inc is not None
    return state, inc.id


def _statuses(hook: Webhook) -> list[str]:
    return [a["status"] for n in hook.received for a in n["alerts"] if a["labels"]["component"] == LINK]


@pytest.mark.integration
@pytest.mark.parametrize("still_down", [True, False])
def test_a_restart_neither_fires_again_nor_forgets_to_resolve(tmp_path, rig, still_down):
    hook, am = rig
    state, first_id = _first_life(tmp_path, am)
    assert wait_until(lambda: _statuses(hook) == ["firing"], 10), _statuses(hook)
    saved = json.loads(Path(state).read_text())
    assert [(r["alertname"], r["component"], r["id"]) for r in saved["incidents"]] == [("FabricLinkDown", LINK,
                                                                                        first_id)]
    assert saved["incidents"][0]["sent"]["labels"]["component"] == LINK
    # The second life: the same topology, a fresh engine and sender, the state file.
    b = Cluster(nodes=4, nodes_per_unit=4)
    b.t += 30.0  # it was down for 30 s
    if still_down:
        _down(b)
    sender = AlertmanagerClient([am.url], cluster="test", resend_seconds=300.0)
    sender.start()
    try:
        persist = resume_incidents(state, b.engine, sender, now=b.t)
        inc = b.engine.manager.get_open("FabricLinkDown", LINK)
        assert inc is not None and inc.id == first_id
        for _ in range(20):
            _step(b, sender, persist)
        sender.flush(timeout=5.0)
        wait_until(lambda: False, 2.0)  # a second firing would reach the webhook within group_interval (1 s)
        # still down: nothing new; cleared: resolved once, as soon as its node's first batches show nothing
        # (5 intervals) and its own hold (10 s) passed, no longer at the end of the restart grace
        assert _statuses(hook) == (["firing"] if still_down else ["firing", "resolved"]), _statuses(hook)
        if still_down:
            _step(b, sender, persist, _up)
        for _ in range(70):  # past the restart grace (60 s) and the link's hold
            _step(b, sender, persist)
        sender.flush(timeout=5.0)
        assert wait_until(lambda: _statuses(hook) == ["firing", "resolved"], 10), _statuses(hook)
        assert [i.id for i in b.engine.incidents() if i.component == LINK] == [first_id]
        assert json.loads(Path(state).read_text())["incidents"] == []
    finally:
        sender.stop(flush_timeout=0.0)


@pytest.mark.integration
@pytest.mark.parametrize("still_down", [True, False])
def test_a_fault_that_cleared_while_down_is_not_paged_again_when_alertmanager_lost_it(tmp_path, rig, still_down):
    """Issue 35 item 14 / issue 36: after a restart, a fault that cleared while the aggregator was down
    paged again (sent firing at start, then resent) when Alertmanager no longer held it.  Now it is sent
    only when the node's first batches still show it."""
    hook, am = rig
    state, first_id = _first_life(tmp_path, am)
    assert wait_until(lambda: _statuses(hook) == ["firing"], 10), _statuses(hook)
    am.stop()  # Alertmanager lost it (restarted without its data, or it expired while we were down)
    hook2 = Webhook()
    am2 = _start_am(tmp_path / "am2", hook2.url)
    b = Cluster(nodes=4, nodes_per_unit=4)
    b.t += 30.0
    if still_down:
        _down(b)
    sender = AlertmanagerClient([am2.url], cluster="test", resend_seconds=2.0)  # resends every 2 s
    sender.start()
    try:
        persist = resume_incidents(state, b.engine, sender, now=b.t)
        for _ in range(30):  # past the node's first batches and the link's hold
            _step(b, sender, persist)
            wait_until(lambda: False, 0.1)  # let the 2 s resends run between the steps
        sender.flush(timeout=5.0)
        wait_until(lambda: False, 2.0)  # a firing would reach the webhook within group_interval (1 s)
        firing = [a for a in am2.get_alerts() if a["labels"].get("component") == LINK
                  and a["status"]["state"] == "active"]
        if still_down:  # Alertmanager had told nobody it resolved: the fault is there, sent firing once
            assert [st for n in hook2.received for a in n["alerts"] if a["labels"]["component"] == LINK
                    for st in [a["status"]]] == ["firing"]
            assert len(firing) == 1 and b.engine.manager.get_open("FabricLinkDown", LINK).id == first_id
        else:
            assert [a for n in hook2.received for a in n["alerts"] if a["labels"]["component"] == LINK] == []
            assert firing == [] and b.engine.manager.get_open("FabricLinkDown", LINK) is None
    finally:
        sender.stop(flush_timeout=0.0)
        am2.stop()
        hook2.close()


def test_a_bad_state_file_is_named_and_ignored(tmp_path):
    bad = tmp_path / "incidents.json"
    bad.write_text('{"schema": 1, "incidents": [{"id": "x"}]}')
    assert incident_store.load(bad) == []
    assert incident_store.load(tmp_path / "absent.json") == []
    bad.write_text("{not json")
    assert incident_store.load(bad) == []


def test_a_stored_id_parses_back_to_the_component_the_engine_keys_it_by(tmp_path):
    """The store is an input edge: its (component_type, component) becomes the Component the detectors
    hand out, with node and device filled (a restored link's NIC is ``node/dev``, never ``/``)."""
    link = incident_store.component_of("link", LINK, {"node": "node-001", "rail": "6", "leaf": "leaf-u0-r6"})
    assert link == components.link("node-001", "mlx5_6") and link.parent() == components.nic("node-001", "mlx5_6")
    assert link.parent().id == "node-001/mlx5_6" and link.labels() == {"node": "node-001", "rail": "6",
                                                                      "leaf": "leaf-u0-r6"}
    nv = incident_store.component_of("nvlink", "node-001/gpu2/nvlink5", {"node": "node-001", "gpu": "2"})
    assert nv == components.nvlink("node-001", 2, 5) and nv.parent() == components.gpu("node-001", 2)
    assert incident_store.component_of("job", "llm/stage3", {}) == components.job("llm", 3)
    assert incident_store.component_of("config", "topology", {}) == Component(Kind.CONFIG, "topology")
    assert incident_store.component_of("config", "node-001/mlx5_6", {}) == components.config("node-001", "mlx5_6")
    assert incident_store.component_of("leaf", "leaf-a3", {"rail": "3"}).rail == 3
    for ctype, cid in (("link", "node-001/mlx5_6"), ("gpu", "node-001/mlx5_6"), ("rail", "leaf-a3"), ("widget", "x")):
        with pytest.raises(ValueError):
            incident_store.component_of(ctype, cid, {})
    # a bad id makes the file unusable like any other bad content: named once, the aggregator starts empty
    rec = {"id": "FabricLinkDown-x", "alertname": "FabricLinkDown", "severity": "critical", "component_type": "link",
           "component": "node-001/mlx5_6", "labels": {}, "evidence": [], "first_seen": 1.0, "last_seen": 1.0,
           "ranks": [], "jobs": [], "description": "", "related_to": "", "absorbed": [], "version": 1, "hold_s": 15.0}
    bad = tmp_path / "incidents.json"
    bad.write_text(json.dumps({"schema": 1, "incidents": [rec]}))
    with capture_logs() as logs:
        assert incident_store.load(bad) == []
    assert [e["error"] for e in logs] == ["incidents[0].component: 'node-001/mlx5_6' is no link id"], logs
    bad.write_text(json.dumps({"schema": 1, "incidents": [{**rec, "component": LINK}]}))
    assert [i.component for i, _ in incident_store.load(bad)] == [LINK]


def test_a_state_directory_not_made_yet_is_made_at_the_first_save(tmp_path):
    """systemd's StateDirectory= exists only once the unit has started, after an install's check-config:
    a directory that does not exist yet passes when it can be made, and the first save makes it (0700)."""
    from fabricmon.aggregator.config import state_dir_problem

    later = tmp_path / "var" / "lib" / "fabricmon-aggregator"
    assert state_dir_problem(later) is None
    incident_store.save(later / "incidents.json", [], {})
    assert later.is_dir() and (later.stat().st_mode & 0o777) == 0o700
    assert json.loads((later / "incidents.json").read_text())["incidents"] == []
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "is not a directory" in (state_dir_problem(blocker / "state") or "")


def test_resuming_holds_the_fallback_until_restored_incidents_are_settled(tmp_path):
    """fabricmon_aggregator_resuming (the fallback rules' hand-back signal) is 1 from start until every
    restored incident is confirmed or let go and the nodes' fresh batches were evaluated, then 0 for good."""
    state = str(tmp_path / "incidents.json")
    a = Cluster(nodes=4, nodes_per_unit=4)
    sender = AlertmanagerClient([], cluster="test")
    persist = resume_incidents(state, a.engine, sender, now=a.t)
    for _ in range(2):
        _step(a, sender, persist)
    _step(a, sender, persist, _down)
    _step(a, sender, persist)
    assert a.engine.manager.get_open("FabricLinkDown", LINK) is not None
    b = Cluster(nodes=4, nodes_per_unit=4)
    b.t += 30.0
    resume_incidents(state, b.engine, sender, now=b.t)
    assert b.engine.resume.pending == 1 and b.engine.views.metrics_snapshot()["resuming"]
    for _ in range(4):
        b.step()
        assert b.engine.views.metrics_snapshot()["resuming"]  # the link's node is up, its incident not settled yet
    for _ in range(20):
        b.step()
    assert b.engine.resume.pending == 0 and not b.engine.views.metrics_snapshot()["resuming"]
    # the link is up again: what the engine reported for it is its resolve alone, never an open
    assert [(c, o) for _, _, c, o in b.reported if c == LINK] == [(LINK, False)]
    assert b.engine.manager.get_open("FabricLinkDown", LINK) is None
