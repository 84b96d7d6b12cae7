"""Scoring detections against ground truth: pages for precision, info findings per decoy."""

from __future__ import annotations

from fabricmon.demo.scoring import score

FAULT = {"kind": "flaky_cable", "component": "node-003/mlx5_3/1", "alertname": "FabricLinkErrors",
         "start": 100.0, "end": 200.0}
DECOYS = [{"kind": "stage_imbalance", "job": "llm-70b", "stage": 3},
          {"kind": "seqlen_imbalance", "job": "llm-70b"},
          {"kind": "dataloader_slow", "node": "node-030"}]


def _inc(iid, alertname, component, t, severity):
    return {"id": iid, "alertname": alertname, "component": component, "first_seen": t, "severity": severity}


def test_precision_counts_pages_and_each_info_finding_belongs_to_one_decoy():
    incs = [_inc("a", "FabricLinkErrors", "node-003/mlx5_3/1", 101.0, "warning"),
            _inc("b", "StageImbalance", "llm-70b/stage3", 20.0, "info"),
            _inc("c", "StageImbalance", "llm-70b", 40.0, "info"),
            _inc("d", "SoftwareStraggler", "node-030", 50.0, "info")]
    sc = score([FAULT], incs, duration=600, decoys=DECOYS)
    assert (sc["pages"], sc["precision"], sc["recall"], sc["info_findings"]) == (1, 1.0, 1.0, 3)
    assert [d["info_ids"] for d in sc["per_decoy"]] == [["b"], ["c"], ["d"]]
    assert sc["decoy_pages"] == 0


def test_a_page_on_a_decoy_is_a_false_positive_and_a_decoy_page():
    incs = [_inc("a", "FabricLinkErrors", "node-003/mlx5_3/1", 101.0, "warning"),
            _inc("e", "StragglerRank", "node-030", 60.0, "warning")]
    sc = score([FAULT], incs, duration=600, decoys=DECOYS)
    assert sc["precision"] == 0.5 and sc["decoy_pages"] == 1
    assert sc["per_decoy"][2]["page_ids"] == ["e"] and sc["unmatched_incidents"] == ["e"]
