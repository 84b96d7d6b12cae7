"""StragglerRank's lateness and rank labels, fixed when it fires (issue 36).

``lateness="compute"`` or ``"comm"`` says what the aggregator found late; the shipped inhibitions hide only
comm lateness under a fabric alert (tests/deploy/test_alertmanager_inhibitions.py, a real Alertmanager).
Alertmanager keys an alert on its labels, so the value is fixed by the finding that opened the incident.
"""

from __future__ import annotations

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.incidents import Finding, IncidentManager
from fabricmon.components import gpu
from support.enginerig import Cluster, synced_ranks


def _sent_labels(inc) -> dict[str, str]:
    """The labels the Alertmanager client sends for an incident (what inhibitions match on)."""
    client = AlertmanagerClient([], cluster="test")
    return client.alerts_for([inc])[inc.id]["labels"]


def test_compute_straggler_is_labelled_compute_with_its_rank():
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if (n, g) == ("node-006", 2) else 0.0)
    c.run(30)
    [inc] = c.incidents(alertname="StragglerRank")
    labels = _sent_labels(inc)
    assert labels["lateness"] == "compute" and labels["rank"] == str(6 * 8 + 2), labels
    assert labels["component"] == "node-006/gpu2" and labels["hpc_job"] == "llm"


def test_comm_straggler_with_clean_counters_is_labelled_comm():
    """One rank's own transfers slow, nothing on its path counts errors: a comm straggler."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.0,
                              slow_transfer=lambda step, n, g: 0.3 if (n, g) == ("node-005", 4) else 0.0)
    c.run(30)
    [inc] = c.incidents(alertname="StragglerRank")
    labels = _sent_labels(inc)
    assert labels["lateness"] == "comm" and labels["rank"] == str(5 * 8 + 4), labels


def test_lateness_and_rank_never_change_once_the_alert_fired():
    """A rank whose flags clear and come back the other way (or another rank on the same GPU) is the same
    incident: its alert keeps the labels it fired with, else Alertmanager would hold a second alert."""
    m = IncidentManager(default_hold_s=20.0)
    on = gpu("node-006", 2)

    def finding(lateness: str, rank: int) -> Finding:
        return Finding("StragglerRank", on, {"node": "node-006", "gpu": "2", "hpc_job": "llm", "lateness": lateness,
                                             "rank": str(rank)}, ["late"], ranks=(rank,), jobs=("llm",))

    [inc] = m.update([finding("compute", 50)], 100.0)
    m.update([finding("comm", 51)], 101.0)
    assert inc.open and inc.labels["lateness"] == "compute" and inc.labels["rank"] == "50", inc.labels
    assert _sent_labels(inc)["lateness"] == "compute"
