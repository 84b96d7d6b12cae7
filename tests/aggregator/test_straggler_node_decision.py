"""Several GPUs of one node late together wait for the node-level decision (issue 36).

The node decides (SoftwareStraggler once most of its GPUs are persistent, or a node fault with evidence):
StragglerRank on one of them waits while its siblings are late too.  The hardware signature that pages
(DESIGN "Jobs, decoys and cost") is one GPU late while the other GPUs of its node are not.
"""

from __future__ import annotations

from support.enginerig import Cluster, synced_ranks


def test_dataloader_slow_node_waits_for_the_node_decision_and_never_pages_its_gpus():
    """A slow input pipeline on one host: its eight ranks turn late within a few steps of each other (the
    first reaches the persistence bar while its siblings are on their way).  Before: StragglerRank paged on
    node-004/gpu0, gpu1, ... one by one until enough were persistent for SoftwareStraggler to take over."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if n == "node-004" and step >= 5 + g else 0.0)
    c.run(40)
    paged = sorted({comp for _, alert, comp, _ in c.reported if alert == "StragglerRank"})
    assert paged == [], f"StragglerRank paged on {paged} before the node-level decision"
    got = [(i.alertname, i.component, i.severity) for i in c.engine.open_incidents()]
    assert got == [("SoftwareStraggler", "node-004", "info")], got


def test_two_late_gpus_of_a_node_wait_and_a_lone_one_still_pages():
    """Hardware signature: node-006/gpu2 alone late pages; node-003 with two GPUs late together (clean
    counters, siblings late) waits for the node-level decision and pages nothing."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if (n, g) in (("node-006", 2), ("node-003", 1),
                                                                   ("node-003", 5)) else 0.0)
    c.run(30)
    got = sorted(i.component for i in c.incidents(alertname="StragglerRank"))
    assert got == ["node-006/gpu2"], got


def test_siblings_late_in_comm_only_do_not_hold_a_lone_compute_straggler():
    """One slow GPU makes the GPUs of its node wait for it in their collectives (tensor parallel inside
    the node): late in comm, not compute.  That is the hardware signature, and it pages."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if (n, g) == ("node-006", 2) else 0.0,
                              slow_transfer=lambda step, n, g: 0.3 if (n, g) in (("node-006", 3),
                                                                                 ("node-006", 4)) else 0.0)
    c.run(30)
    gpu2 = c.incidents(alertname="StragglerRank", component="node-006/gpu2")
    assert gpu2 and gpu2[0].labels["lateness"] == "compute", c.engine.incidents()
