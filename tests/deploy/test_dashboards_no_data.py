"""The Fabric map never reads green "OK" when its source is gone (issue 25).

Real agents (a simulated 8-node cluster in tree mode) scraped by a real Prometheus with the
repository's recording rules, and an aggregator target that is down (nothing listens on its port),
so every aggregator series is absent: every cell of the Fabric map's incident panels must read
"no data / aggregator down" through the panel's own value mappings, not "OK".  With the aggregator
up the same cells read "OK" or a severity (tests/deploy/test_prometheus_live.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.promlive import substitute
from support.promtools import REPO, RULE_FILES, live_fabric, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FABRIC = REPO / "dashboards" / "json" / "fabricmon-fabric.json"
NO_DATA_TEXT = "no data / aggregator down"


def _mapped(value: float, mappings: list[dict]) -> str | None:
    for m in mappings:
        if m["type"] == "value":
            hit = m["options"].get(str(int(value)) if value == int(value) else str(value))
            if hit is not None:
                return hit.get("text")
    return None


def _incident_panels() -> list[dict]:
    d = json.loads(FABRIC.read_text())
    panels = [p for p in d["panels"] if p.get("type") != "row"]
    return [p for p in panels if any(m["type"] == "value" and "0" in m["options"]
                                     for m in p["fieldConfig"]["defaults"]["mappings"])]


def test_fabric_map_reads_no_data_with_the_aggregator_down(tmp_path: Path) -> None:
    from fabricmon.sim.scenario import ClusterSpec, Scenario

    panels = _incident_panels()
    # the grid, the leaves' and the nodes' worst incident (spines/rails exist only while one is open)
    assert {p["title"] for p in panels} >= {"Worst open incident per leaf",
                                            "Leaves: worst open incident", "Nodes: worst open incident"}
    scn = Scenario(ClusterSpec(8, "roce", 4, seed=3), 120.0)
    with live_fabric(scn, tmp_path, rule_files=RULE_FILES, aggregator=False, probe=False,
                     down_aggregator_replica=True) as lf:
        prom = lf.prom
        wait_until(lambda: len(prom.query("fabricmon:ib_port:info{leaf!=''}")) >= 64
                   and prom.query('up{job="fabricmon-aggregator"} == 0'), 30.0,
                   "port info with leaves from 8 nodes, the aggregator target seen down", interval=0.5)
        assert prom.query("fabricmon_incident_open") == []
        cells: dict[str, list[str]] = {}
        for p in panels:
            mappings = p["fieldConfig"]["defaults"]["mappings"]
            for t in p["targets"]:
                for r in prom.query(substitute(t["expr"])):
                    cells.setdefault(p["title"], []).append(_mapped(float(r["value"][1]), mappings))
        assert lf.errors == [], lf.errors
    assert len(cells["Worst open incident per leaf"]) == 16  # 2 units x 8 rails: one row per leaf
    assert len(cells["Leaves: worst open incident"]) == 16
    assert len(cells["Nodes: worst open incident"]) == 8
    wrong = {title: sorted(set(v) - {NO_DATA_TEXT}) for title, v in cells.items() if set(v) != {NO_DATA_TEXT}}
    assert not wrong, f"Fabric map cells not reading {NO_DATA_TEXT!r} with the aggregator down: {wrong}"
