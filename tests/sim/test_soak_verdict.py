"""benchmarks/soak_verdict.py: what bench_soak.py fails a run for (pure functions over webhook records)."""

from __future__ import annotations

import sys

from support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from soak_verdict import agent_down_pages, refired, verdict_line


def _a(t: float, status: str, alertname: str, component: str) -> tuple[float, str, dict]:
    return t, status, {"labels": {"alertname": alertname, "component": component}}


def test_agent_down_pages_are_reasons():
    alerts = [_a(1, "firing", "FabricLinkErrors", "node-1/mlx5_3/1"), _a(2, "firing", "FabricmonAgentDown", "node-7"),
              _a(3, "firing", "FabricmonAgentDown", "node-7"), _a(4, "resolved", "FabricmonAgentDown", "node-9")]
    assert agent_down_pages(alerts) == ["node-7"]


def test_resolved_then_fired_again_is_caught_in_arrival_order():
    flap = [_a(10, "firing", "FabricLeafDegraded", "leaf-u3-r5"),
            _a(40, "resolved", "FabricLeafDegraded", "leaf-u3-r5"),
            _a(55, "firing", "FabricLeafDegraded", "leaf-u3-r5")]
    assert refired(list(reversed(flap))) == ["FabricLeafDegraded leaf-u3-r5"]
    # firing resent while firing, or resolved once at the end: not a re-fire
    steady = [_a(10, "firing", "FabricLinkErrors", "x"), _a(40, "firing", "FabricLinkErrors", "x"),
              _a(90, "resolved", "FabricLinkErrors", "x")]
    assert refired(steady) == []


def test_verdict_line():
    assert verdict_line([], "64 nodes") == "soak verdict: ok 64 nodes"
    assert verdict_line(["a", "b"], "x") == "soak verdict: FAIL a; b"
