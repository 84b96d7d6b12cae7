"""The Fabric map's leaf x spine map of uplink health against live data: real agents over a simulated
4-node tree (the first node's agent sweeping the switches from the simulator's fake sweep file), the
aggregator's incident series, a real Prometheus with the repository's recording rules.  One uplink down
and one flaky: their cells read the down one critical and the flaky one warning, every other leaf x
spine cell OK, and the error-rate cell of the flaky one counts (both ends of the cable summed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabricmon.sim.scenario import scenario_from_dict
from support.promlive import substitute
from support.promtools import REPO, RULE_FILES, live_fabric, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
FABRIC = REPO / "dashboards" / "json" / "fabricmon-fabric.json"


def _cells(prom, expr: str) -> dict[tuple[str, str], float]:
    return {(r["metric"]["leaf"], r["metric"]["spine"]): float(r["value"][1]) for r in prom.query(substitute(expr))}


def test_leaf_x_spine_map_colours_the_bad_uplinks(tmp_path: Path) -> None:
    panels = {p["title"]: p for p in json.loads(FABRIC.read_text())["panels"]}
    worst = panels["Uplinks: worst open incident, leaf x spine"]["targets"][0]["expr"]
    errors = panels["Uplinks: error rate, leaf x spine"]["targets"][0]["expr"]
    scn = scenario_from_dict({
        "cluster": {"nodes": 4, "layout": "ib", "nodes_per_unit": 2, "seed": 3, "spines": 2, "uplinks_per_leaf": 2},
        "duration": 90, "faults": [
            {"kind": "uplink_down", "leaf": "leaf-u0-r0", "spine": "spine-0", "start": 2},
            {"kind": "uplink_flaky", "leaf": "leaf-u1-r3", "spine": "spine-1", "start": 2, "magnitude": 5}]})
    with live_fabric(scn, tmp_path, rule_files=RULE_FILES, probe=False, deadline=40.0) as lf:
        prom = lf.prom
        wait_until(lambda: (c := _cells(prom, worst)).get(("leaf-u0-r0", "spine-0")) == 3
                   and c.get(("leaf-u1-r3", "spine-1")) == 2, 60.0, "the two uplinks' cells coloured", interval=1.0)
        cells = _cells(prom, worst)
        wait_until(lambda: _cells(prom, errors).get(("leaf-u1-r3", "spine-1"), 0) > 1, 30.0,
                   "the flaky uplink's error rate", interval=1.0)
        rates = _cells(prom, errors)
        assert lf.errors == [], lf.errors
    assert len(cells) == 16 * 2  # 2 units x 8 rails = 16 leaves, two uplinks each, one to each spine
    assert {k: v for k, v in cells.items() if v} == {("leaf-u0-r0", "spine-0"): 3, ("leaf-u1-r3", "spine-1"): 2}
    assert max(v for k, v in rates.items() if k != ("leaf-u1-r3", "spine-1")) < 1
