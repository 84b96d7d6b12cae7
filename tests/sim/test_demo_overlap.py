"""The demo end to end on overlapping faults, through a real Alertmanager and webhook.

A flaky cable (node-003 rail 2, 20-120 s) whose leaf degrades later (unit 0 rail 2, 60-130 s):
both faults are found, each alert reaches the webhook firing once and resolved once, and nothing
is left firing at Alertmanager (the defect: the cable was folded into the leaf and never resolved).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from support.paths import REPO

SCENARIO = REPO / "examples" / "scenarios" / "cable-then-leaf.yaml"
CABLE = ("FabricLinkErrors", "node-003/mlx5_2/1")
LEAF = ("FabricLeafDegraded", "leaf-u0-r2")

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")),
    reason="needs the Alertmanager binary (Debian package prometheus-alertmanager)")


@pytest.mark.integration
def test_cable_then_leaf_both_found_each_alert_fired_and_resolved_once(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fabricmon.cli", "--log-level", "warning", "demo", "--scenario", str(SCENARIO),
         "--speed", "20", "--workers", "1", "--report-json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "no Alertmanager" not in proc.stdout, proc.stdout

    # both faults found by the demo's own scoring
    scores = report["scores"]
    assert scores["recall"] == 1.0 and scores["precision"] == 1.0, scores
    incs = {(i["alertname"], i["component"]): i for i in report["incidents"]}
    assert set(incs) == {CABLE, LEAF}, list(incs)
    assert incs[CABLE]["first_seen"] < incs[LEAF]["first_seen"]
    assert incs[CABLE]["resolved_at"] > 120 and incs[LEAF]["resolved_at"] > 130

    # every notification the webhook received: each alert fired once and resolved once, in that order
    notes = report["alertmanager_notifications"]
    assert notes and all(set(n) == {"status", "alertname", "component", "at"} for n in notes), notes
    per_alert = Counter((n["alertname"], n["component"], n["status"]) for n in notes)
    assert per_alert == Counter({(*CABLE, "firing"): 1, (*CABLE, "resolved"): 1,
                                 (*LEAF, "firing"): 1, (*LEAF, "resolved"): 1}), notes
    for key, end in ((CABLE, 120), (LEAF, 130)):
        fired = next(n["at"] for n in notes if (n["alertname"], n["component"]) == key and n["status"] == "firing")
        resolved = next(n["at"] for n in notes
                        if (n["alertname"], n["component"]) == key and n["status"] == "resolved")
        assert fired < resolved and resolved > end, (key, fired, resolved)
    # nothing firing at the end: the last word on every alert is "resolved"
    last = {}
    for n in notes:
        last[(n["alertname"], n["component"])] = n["status"]
    assert set(last.values()) == {"resolved"}, last
