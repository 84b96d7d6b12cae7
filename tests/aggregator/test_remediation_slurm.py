"""Acting on faults against a real Slurm (issue 42): ``slurmctld`` + ``slurmd`` + ``munged`` on localhost
(tests/support/slurmrig.py; node-000 runs a slurmd, node-001..015 are configured only, which is all
``scontrol update`` needs).  The engine runs in process on sample time (support/enginerig.py) with the
remediation stage built as the service builds it; the actions are the real ``scontrol`` calls, and what
Slurm did is read back with ``sinfo``, not with the code under test."""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.remediation.config import RemediationSettings
from fabricmon.aggregator.remediation.metrics import remediation_series
from fabricmon.aggregator.remediation.wiring import build_remediator
from fabricmon.cli import main
from support.enginerig import Cluster, _port, _set_state, flaky

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")]

NODES = tuple(f"node-{i:03d}" for i in range(16))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from support.slurmrig import Slurm, require_slurm

    require_slurm()
    s = Slurm(tmp_path_factory.mktemp("slurm"), NODES[0], extra_nodes=NODES[1:])
    try:
        yield s.start()
    finally:
        s.stop()


class Rig:
    """A 16-node cluster (two units of 8) whose engine acts through the real scontrol."""

    def __init__(self, tmp_path, slurm, **settings) -> None:
        self.slurm = slurm
        self.c = Cluster(nodes=16, nodes_per_unit=8)
        assert tuple(self.c.topo.nodes) == NODES
        self.state_file = str(tmp_path / "state.json")
        s = RemediationSettings(**{"max_nodes_percent": 0.0, "undo_after": 20.0, "retry_backoff_s": 0.2,
                                   "slurm": slurm_settings(slurm), **settings})
        self.r = build_remediator(s, self.c.engine, self.state_file)
        self.c.run(10)  # clean first: nothing to decide

    def settle(self, seconds: int = 1, inject=None) -> None:
        """Sample time passes; the executor's scontrol calls finish and the next tick applies them."""
        for _ in range(seconds):
            self.c.step(inject)
            assert self.r.executor.wait_idle(30.0)
        self.c.step(inject)

    def entries(self, alertname: str) -> list[dict]:
        inc = self.c.incidents(alertname=alertname)
        return inc[-1].to_dict()["remediation"] if inc else []

    def metrics(self) -> str:
        reg = CollectorRegistry(auto_describe=False)

        class C(Collector):
            def collect(inner):  # noqa: N805
                return remediation_series(self.r)

        reg.register(C())
        return generate_latest(reg).decode()


def slurm_settings(slurm):
    from fabricmon.aggregator.remediation.config import SlurmSettings

    # scontrol finds the test's slurm.conf through SLURM_CONF: a wrapper script sets it, as a site's would
    wrapper = slurm.root / "scontrol.sh"
    wrapper.write_text(f"#!/bin/sh\nSLURM_CONF={slurm.conf} exec scontrol \"$@\"\n")
    wrapper.chmod(0o755)
    return SlurmSettings(scontrol=str(wrapper))


def down(node: str, dev: str = "mlx5_0"):
    def inject(cl):
        _set_state(cl, node, dev, 1, 2)
        cl.feeds[node].add("fabricmon_ib_port_errors_total", _port(dev) + (("counter", "link_downed"),), 1)
    return inject


def up(node: str, dev: str = "mlx5_0"):
    return lambda cl: _set_state(cl, node, dev, 4, 5)


def test_a_link_fault_drains_its_node_and_the_resolution_plus_undo_after_resumes_it(tmp_path, slurm):
    rig = Rig(tmp_path, slurm, mode="act")
    assert slurm.node_state("node-000")[0] == "idle"
    rig.settle(1, down("node-000"))
    rig.settle(3)
    inc = rig.c.incidents(alertname="FabricLinkDown")[0]
    state, reason = slurm.node_state("node-000")
    assert state in ("drained", "draining") and reason == f"fabricmon: FabricLinkDown node-000/mlx5_0/1 {inc.id}"
    assert [e["decision"] for e in rig.entries("FabricLinkDown")] == ["act", "done"]
    # the decision is on the incident's Alertmanager annotations too
    ann = AlertmanagerClient([]).alerts_for([inc])[inc.id]["annotations"]
    assert ann["remediation"] == "done: slurm_drain apply done on node-000"
    assert '"node":"node-000"' in ann["remediation_acted"]
    assert 'fabricmon_remediation_actions_total{action="slurm_drain",result="done"} 1.0' in rig.metrics()
    # the link comes back: the incident resolves after its hold, then the node stays clean for undo_after
    rig.settle(1, up("node-000"))
    rig.settle(10)
    assert inc.resolved_at is not None
    assert slurm.node_state("node-000")[0] in ("drained", "draining"), "resumed before undo_after"
    rig.settle(25)
    assert slurm.node_state("node-000") in (("idle", ""), ("idle*", "")), slurm.text("slurmctld")
    assert 'fabricmon_remediation_undos_total{action="slurm_drain",result="done"} 1.0' in rig.metrics()
    assert [e["decision"] for e in inc.remediation][-1] == "undo_done"


def test_an_operators_drain_is_never_touched_nor_resumed(tmp_path, slurm):
    rig = Rig(tmp_path, slurm, mode="act")
    # node-001 drained by an operator before the fault: fabricmon leaves it and never resumes it
    slurm.run("scontrol", "update", "NodeName=node-001", "State=DRAIN", "Reason=bad PSU, ticket 4411")
    rig.settle(1, down("node-001"))
    rig.settle(3)
    assert slurm.node_state("node-001") == ("drained", "bad PSU, ticket 4411")
    assert [e["decision"] for e in rig.entries("FabricLinkDown")] == ["act", "foreign_drain"]
    # node-002: fabricmon drains it, then an operator takes the drain over with a reason of their own
    rig.settle(1, down("node-002", "mlx5_1"))
    rig.settle(3)
    assert slurm.node_state("node-002")[1].startswith("fabricmon: FabricLinkDown node-002/mlx5_1/1 ")
    slurm.run("scontrol", "update", "NodeName=node-002", "State=DRAIN", "Reason=operator: reseat cable")
    rig.settle(1, lambda cl: (up("node-001")(cl), up("node-002", "mlx5_1")(cl)))
    rig.settle(40)
    assert all(i.resolved_at is not None for i in rig.c.incidents(alertname="FabricLinkDown"))
    assert slurm.node_state("node-001") == ("drained", "bad PSU, ticket 4411")
    assert slurm.node_state("node-002") == ("drained", "operator: reseat cable")
    m = rig.metrics()
    # one decision per incident: node-001's link also flapped (a second incident, left alone again)
    foreign = [e for i in rig.c.engine.incidents() for e in i.remediation if e["decision"] == "foreign_drain"]
    assert {e["node"] for e in foreign} == {"node-001"}
    assert f'fabricmon_remediation_actions_total{{action="slurm_drain",result="foreign_drain"}} {len(foreign)}.0' in m
    assert 'fabricmon_remediation_undos_total{action="slurm_drain",result="foreign_drain"} 1.0' in m
    assert 'fabricmon_remediation_undos_total{action="slurm_drain",result="done"} 0.0' in m


def _undrained(state: tuple[str, str]) -> bool:
    """Neither drained nor draining and no reason set.  Compared by that, not by the whole state: a
    slurmd still registering reads ``unknown`` and then ``idle`` (a CI run saw it move mid-test)."""
    st, reason = state
    return "drain" not in st and reason == ""  # drained, draining, drained* (not responding), mixed+drain


def test_a_dry_run_changes_nothing_and_says_what_it_would_have_done(tmp_path, slurm, capsys):
    rig = Rig(tmp_path, slurm)  # the section without a mode: a dry run
    assert rig.r.s.mode == "dry_run"
    assert _undrained(slurm.node_state("node-003"))
    rig.settle(1, down("node-003", "mlx5_2"))
    rig.settle(3)
    assert rig.c.incidents(alertname="FabricLinkDown")
    assert _undrained(slurm.node_state("node-003"))
    inc = rig.c.incidents(alertname="FabricLinkDown")[0]
    (entry,) = rig.entries("FabricLinkDown")
    assert entry["decision"] == "dry_run" and entry["detail"] == "would run slurm_drain on node-003"
    assert entry["reason"] == f"fabricmon: FabricLinkDown node-003/mlx5_2/1 {inc.id}"
    assert 'fabricmon_remediation_actions_total{action="slurm_drain",result="dry_run"} 1.0' in rig.metrics()
    assert 'fabricmon_remediation_actions_total{action="slurm_drain",result="done"} 0.0' in rig.metrics()
    assert "would run slurm_drain on node-003" in capsys.readouterr().out  # the decision's log line


def test_a_burst_drains_only_up_to_the_breaker_which_halts_until_reset(tmp_path, slurm):
    rig = Rig(tmp_path, slurm, mode="act", max_nodes=2)
    burst = {"node-004": "mlx5_0", "node-005": "mlx5_1", "node-006": "mlx5_2", "node-007": "mlx5_3"}

    def inject(cl):
        for n, dev in burst.items():
            down(n, dev)(cl)

    rig.settle(1, inject)
    rig.settle(3)
    drained = [n for n in burst if slurm.node_state(n)[0] in ("drained", "draining")]
    assert len(drained) == 2, [slurm.node_state(n) for n in burst]
    assert [slurm.node_state(n)[1] for n in burst if n not in drained] == ["", ""]
    m = rig.metrics()
    assert 'fabricmon_remediation_actions_total{action="slurm_drain",result="done"} 2.0' in m
    refused = [e for i in rig.c.engine.incidents() for e in i.remediation if e["decision"] == "breaker"]
    assert {e["node"] for e in refused} == set(burst) - set(drained)
    assert all(e["detail"].startswith("circuit breaker tripped: an action on ") for e in refused), refused
    assert f'fabricmon_remediation_actions_total{{action="slurm_drain",result="breaker"}} {len(refused)}.0' in m
    # FabricmonRemediationHalted's expression (deploy/prometheus/tests/fabricmon-remediation.test.yml)
    assert 'fabricmon_remediation_breaker_tripped{mode="act"} 1.0' in m
    # persisted: a restart keeps the breaker tripped
    rig.c.engine.detection.remediation.persist = None
    from fabricmon.aggregator import incident_store

    incident_store.save(rig.state_file, rig.c.engine.open_incidents(), {}, {"remediation": rig.r.to_json()})
    again = build_remediator(rig.r.s, Cluster(nodes=16, nodes_per_unit=8).engine, rig.state_file)
    assert again.state.breaker.tripped
    # `fabricmon remediation reset`: the next tick takes it
    assert main(["remediation", "reset", "--state-file", rig.state_file]) == 0
    rig.settle(1)
    assert 'fabricmon_remediation_breaker_tripped{mode="act"} 0.0' in rig.metrics()


def test_a_leaf_fault_drains_nothing(tmp_path, slurm):
    rig = Rig(tmp_path, slurm, mode="act", max_nodes=16)
    unit1 = [n for n in NODES if rig.c.topo.unit_of(n) == 1]
    assert all(_undrained(slurm.node_state(n)) for n in unit1)

    def inject(cl):
        for n in unit1:
            flaky(n, "mlx5_5")(cl)

    rig.settle(30, inject)
    assert [(i.alertname, i.component) for i in rig.c.engine.incidents()] == [("FabricLeafDegraded", "leaf-u1-r5")]
    assert [(e["decision"], e["detail"]) for e in rig.entries("FabricLeafDegraded")] == [
        ("not_node_local", "leaf leaf-u1-r5 is not on one node: a fault there is for a human")]
    assert [n for n in unit1 if not _undrained(slurm.node_state(n))] == []
    assert 'fabricmon_remediation_actions_total{action="slurm_drain",result="not_node_local"} 1.0' in rig.metrics()
