"""The remediation stage's pure parts (issue 42): the config section, the decisions, the breaker and its
persisted state, the other shards' actions read from Alertmanager's answer, and ``scontrol show node``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fabricmon.aggregator import incident_store
from fabricmon.aggregator.config import load_aggregator_config
from fabricmon.aggregator.remediation import breaker
from fabricmon.aggregator.remediation.actions import parse_show_node
from fabricmon.aggregator.remediation.breaker import Breaker, NodeRecord, RemediationState
from fabricmon.aggregator.remediation.config import RemediationSettings
from fabricmon.aggregator.remediation.policy import Candidate, decide, undo_due
from fabricmon.aggregator.remediation.remediator import remote_actions_of
from fabricmon.cli import main
from fabricmon.components import Kind
from fabricmon.configload import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def link(node: str, alert: str = "FabricLinkDown", iid: str = "i1") -> Candidate:
    return Candidate(iid, alert, Kind.LINK, f"{node}/mlx5_0/1", node)


def state(limit: int = 2, window: float = 600.0) -> RemediationState:
    return RemediationState(Breaker(limit, window))


def go(c, s=None, st=None, now=1000.0, owns=lambda n: True, in_flight=frozenset(), remote=()):
    return decide(c, s or RemediationSettings(mode="act"), st if st is not None else state(), now,
                  in_flight=in_flight, owns=owns, remote=remote)


def test_config_section_off_by_default_dry_run_when_present_and_one_line_per_mistake(tmp_path):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"cluster": "c", "generate": {"nodes": 4}}))
    base = {"topology": "t.yaml", "state_file": str(tmp_path / "s.json"), "auth": {"insecure": True}}
    f = tmp_path / "a.yaml"
    f.write_text(yaml.safe_dump(base))
    assert load_aggregator_config(f).remediation is None
    f.write_text(yaml.safe_dump({**base, "remediation": {}}))
    assert load_aggregator_config(f).remediation.mode == "dry_run"
    bad = [({"mode": "yes"}, "remediation.mode: must be dry_run or act"),
           ({"alerts": {"SoftwareStraggler": ["slurm_drain"]}}, "remediation.alerts.SoftwareStraggler: never acted"),
           ({"alerts": {"FabricLeafDegraded": ["slurm_drain"]}}, "remediation.alerts.FabricLeafDegraded: never"),
           ({"actions": ["reboot"]}, "remediation.actions[0]: unknown action 'reboot'"),
           ({"actions": ["webhook"]}, "remediation.webhook.url: an http(s) URL is required"),
           ({"max_nodes_percent": 150}, "remediation.max_nodes_percent: a percentage"),
           ({"window": 0}, "remediation.window: must be > 0"),
           ({"exclude": ["node 1"]}, "remediation.exclude[0]: a node name or shell pattern")]
    for section, line in bad:
        f.write_text(yaml.safe_dump({**base, "remediation": section}))
        with pytest.raises(ConfigError) as exc:
            load_aggregator_config(f)
        assert str(exc.value).startswith(f"{f}: {line}"), str(exc.value)
    f.write_text(yaml.safe_dump({"topology": "t.yaml", "auth": {"insecure": True}, "remediation": {"mode": "act"}}))
    with pytest.raises(ConfigError, match="remediation: needs state_file"):
        load_aggregator_config(f)
    assert main(["check-config", str(f)]) == 2


def test_limit_is_the_larger_of_max_nodes_and_the_percentage():
    assert RemediationSettings(max_nodes=2, max_nodes_percent=5).limit(1000) == 50
    assert RemediationSettings(max_nodes=2, max_nodes_percent=5).limit(16) == 2
    assert RemediationSettings(max_nodes=0, max_nodes_percent=5).limit(41) == 3  # ceil(2.05)


def test_only_node_local_hardware_faults_and_the_owners_nodes():
    assert go(link("n1", "SoftwareStraggler")) is None
    assert go(link("n1", "FabricCableDegrading")) is None
    assert go(Candidate("i", "FabricLeafDegraded", Kind.LEAF, "leaf-u1-r5", "")).result == "not_node_local"
    assert go(Candidate("i", "FabricLinkDown", Kind.UPLINK, "leaf-u0-r0/p33", "")).result == "not_node_local"
    assert go(Candidate("i", "FabricLinkErrors", Kind.RAIL, "rail3", "")).result == "not_node_local"
    assert go(link("n1"), owns=lambda n: False) is None  # another shard owns it: that one decides
    assert go(Candidate("i", "GPUXidFatal", Kind.GPU, "n1/gpu2", "n1")).result == "act"
    s = RemediationSettings(mode="act", exclude=("n1", "gpu-00[0-3]"))
    assert go(link("n1"), s).result == go(link("gpu-002"), s).result == "excluded"
    assert go(link("gpu-004"), s).result == "act"


def test_cooldown_runs_from_the_action_and_one_job_per_node():
    st = state(limit=10)
    st.nodes["n1"] = NodeRecord("n1", 1000.0, "old", "FabricLinkDown", "n1/mlx5_0/1", "fabricmon: x",
                                ["slurm_drain"], undone_at=1500.0)
    assert go(link("n1", iid="new"), st=st, now=1600.0).result == "cooldown"
    assert go(link("n1", iid="new"), st=st, now=4601.0).result == "act"
    assert go(link("n2"), st=state(), in_flight=frozenset({"n2"})) is None


def test_the_breaker_trips_on_the_action_that_would_exceed_it_counts_other_shards_and_forgets_at_reset():
    st = state(limit=2)
    assert [go(link(n, iid=n), st=st).result for n in ("a", "b", "c", "d")] == ["act", "act", "breaker", "breaker"]
    assert st.breaker.tripped and st.breaker.tripped_reason.startswith("an action on c would be node 3 ")
    st.breaker.reset(2000.0)
    assert go(link("e", iid="e"), st=st, now=2001.0).result == "act"
    # another shard drained two nodes in the window: one more here trips it
    st = state(limit=2)
    assert go(link("a"), st=st, remote=((990.0, "x"), (995.0, "y"))).result == "breaker"
    # ... but not once they left the window
    st = state(limit=2, window=600.0)
    assert go(link("a"), st=st, now=2000.0, remote=((990.0, "x"), (995.0, "y"))).result == "act"


def test_undo_waits_for_undo_after_clean_and_does_not_count():
    st = state(limit=1)
    st.nodes["n1"] = NodeRecord("n1", 1000.0, "i1", "FabricLinkDown", "n1/mlx5_0/1", "fabricmon: x", ["slurm_drain"])
    st.breaker.actions.append((1000.0, "n1"))
    assert undo_due(st, frozenset({"n1"}), 1100.0, 300.0) == []
    assert undo_due(st, frozenset(), 1200.0, 300.0) == []  # clean since 1200
    assert undo_due(st, frozenset({"n1"}), 1300.0, 300.0) == []  # a new fault: clean again from scratch
    assert undo_due(st, frozenset(), 1400.0, 300.0) == []
    assert undo_due(st, frozenset(), 1700.0, 300.0) == ["n1"]
    assert st.breaker.count(1700.0) == 0 and len(st.breaker.actions) == 1  # the undo added nothing


def test_state_persists_and_loads_tolerantly(tmp_path):
    st = state(limit=2)
    assert go(link("a", iid="ia"), st=st).result == "act"  # decide() counts it; the remediator records it
    st.nodes["a"] = NodeRecord("a", 1000.0, "ia", "FabricLinkDown", "a/mlx5_0/1",
                               "fabricmon: FabricLinkDown a/mlx5_0/1 ia", ["slurm_drain"])
    path = tmp_path / "state.json"
    incident_store.save(path, [], {}, {"remediation": st.to_json()})
    again = breaker.load(incident_store.read_section(path, "remediation"), 2, 600.0, str(path))
    assert again.nodes["a"].reason == "fabricmon: FabricLinkDown a/mlx5_0/1 ia" and again.breaker.count(1000.0) == 1
    assert incident_store.read_state(path) == ([], 0)  # the incidents' reader ignores the section
    # a record of the wrong shape is skipped, not the file
    body = json.loads(path.read_text())
    body["remediation"]["nodes"].append({"node": 5})
    path.write_text(json.dumps(body))
    assert list(breaker.load(incident_store.read_section(path, "remediation"), 2, 600.0, "s").nodes) == ["a"]
    # a file that does not parse: the breaker starts tripped (fail safe), with a log line
    path.write_text("{not json")
    assert breaker.load(incident_store.read_section(path, "remediation"), 2, 600.0, "s").breaker.tripped
    assert not breaker.load(None, 2, 600.0, "s").breaker.tripped  # a first start


def test_remote_actions_come_from_the_other_shards_annotations():
    alerts = [{"labels": {"alertname": "FabricLinkDown"},
               "annotations": {"shard": "units 1", "remediation_acted": '{"node":"n9","at":1000.5}'}},
              {"labels": {}, "annotations": {"shard": "units 0", "remediation_acted": '{"node":"n1","at":999}'}},
              {"labels": {}, "annotations": {"remediation_acted": "not json"}}, "junk", {"annotations": None}]
    assert remote_actions_of(alerts, "units 0") == [(1000.5, "n9")]
    assert remote_actions_of({"not": "a list"}, "") == []


def test_scontrol_show_node_lines_from_slurm_22_05():
    # captured from the real slurmctld 22.05.8 of tests/support/slurmrig.py (tests/fixtures/slurm/README.md)
    lines = (FIXTURES / "show-node-o.txt").read_text().splitlines()
    got = [(n.state, n.reason, n.drained) for n in map(parse_show_node, lines)]
    assert got == [("UNKNOWN", "", False), ("IDLE+DRAIN", "fabricmon: FabricLinkDown node-000/mlx5_0/1 abc", True),
                   ("IDLE+NOT_RESPONDING", "", False), ("DOWN+DRAIN", "bad PSU, ticket [4411]", True)]


def test_a_dry_runs_counts_do_not_carry_into_act_and_a_dry_run_never_undoes_a_real_drain(tmp_path):
    from fabricmon.aggregator.incidents import IncidentManager
    from fabricmon.aggregator.remediation.executor import Executor
    from fabricmon.aggregator.remediation.remediator import Remediator

    dry = state(limit=1)
    dry.mode = "dry_run"
    assert go(link("a", iid="ia"), st=dry).result == "act"  # decide() admits; the remediator records dry
    dry.nodes["a"] = NodeRecord("a", 1000.0, "ia", "FabricLinkDown", "a/mlx5_0/1", "fabricmon: r", ["slurm_drain"],
                                dry_run=True)
    assert go(link("b", iid="ib"), st=dry).result == "breaker"
    dry.nodes["z"] = NodeRecord("z", 900.0, "iz", "FabricLinkDown", "z/mlx5_0/1", "fabricmon: z", ["slurm_drain"])
    dry.breaker.actions.append((900.0, "z"))  # drained for real by an earlier act
    act = breaker.load(dry.to_json(), 1, 600.0, "s", "act")
    assert not act.breaker.tripped and list(act.nodes) == ["z"] and [n for _, n in act.breaker.actions] == ["z"]
    # back to a dry run: the real drain of z is due for its undo, which a dry run only reports (once)
    back = breaker.load(act.to_json(), 1, 600.0, "s", "dry_run")
    assert list(back.nodes) == ["z"]

    class Recording:
        name = "slurm_drain"
        calls: list[str] = []

        def apply(self, node, reason, incident):
            self.calls.append(f"apply {node}")
            return "done"

        def undo(self, node, reason):
            self.calls.append(f"undo {node}")
            return "done"

    ex = Executor({"slurm_drain": Recording()}, retries=0, backoff_s=0.0)
    r = Remediator(RemediationSettings(undo_after=10.0), back, ex, owns=lambda n: True)
    for t in (2000.0, 2011.0, 2022.0):
        r.tick(t, IncidentManager(), [])
        assert ex.wait_idle(5.0)
    assert Recording.calls == [] and back.nodes["z"].undone_at is None
    assert r.undos_total[("slurm_drain", "dry_run")] == 1


def test_an_incidents_remediation_entries_persist_with_it(tmp_path):
    from fabricmon import components
    from fabricmon.aggregator.incidents import Finding, IncidentManager

    mgr = IncidentManager()
    (inc,) = mgr.update([Finding("FabricLinkDown", components.link("n1", "mlx5_0", "1"), {"node": "n1"}, ["x"])],
                        1000.0)
    inc.remediation = [{"at": "2026-01-01T00:00:00Z", "decision": "done", "actions": ["slurm_drain"], "node": "n1",
                        "at_unix": 1000.0}, {"bad": {"nested": 1}}]
    path = tmp_path / "state.json"
    incident_store.save(path, [inc], {})
    ((back, _),) = incident_store.read_state(path)[0]
    assert back.remediation == inc.remediation[:1]
