"""benchmarks/detection_verdict.py: what bench_detection.py fails a run for (pure functions over its results)."""

from __future__ import annotations

import sys

from support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from detection_verdict import judge_cost, late_detections  # noqa: E402


def _fault(kind: str, component: str, start: float, end: float, impact: list[tuple[str, float]]) -> dict:
    return {"kind": kind, "component": component, "start": start, "end": end,
            "impact": [{"job": j, "step_slowdown": v} for j, v in impact]}


def _incident(component: str, first_seen: float, impact: list[tuple[str, float | None]]) -> dict:
    return {"component": component, "first_seen": first_seen,
            "impact": [{"job": j, "step_slowdown": v} for j, v in impact]}


def test_a_fault_no_incident_localized_counts_its_hurt_jobs_out_of_bounds():
    """Before, a fault that was never detected was left out of the cost count (27/30 where it was 27/31)."""
    ground = [_fault("link_degraded", "node-0840/mlx5_7/1", 62, 160, [("vlm-13b", 0.234)]),
              _fault("slow_gpu", "node-0779/gpu7", 75, 149, [("vlm-13b", 0.231)]),
              _fault("slow_gpu", "node-0062/gpu1", 66, 127, [("llm-70b", 0.345), ("idle", 0.001)]),
              _fault("flaky_cable", "node-0001/mlx5_0/1", 10, 50, [("llm-70b", 0.08)])]
    incidents = [_incident("node-0840/mlx5_7/1", 70, [("vlm-13b", 0.240)]),
                 _incident("node-0062/gpu1", 80, [("llm-70b", 0.346)]),
                 _incident("node-0001/mlx5_0/1", 12, [("vlm-13b", 0.0)])]  # the hurt job is not listed
    j = judge_cost([{"seed": 5206, "ground": ground, "incidents": incidents, "duration": 240.0}])
    assert (j.within, j.judged) == (2, 4)
    assert [(p["component"], p["ok"], p["why"]) for p in j.pairs if not p["ok"]] == [
        ("node-0779/gpu7", False, "fault not localized, no incident"),
        ("node-0001/mlx5_0/1", False, "job not listed")]
    assert j.by_case["overlapping"] == [1, 2] and j.by_case["lone straggler"] == [1, 1]
    assert j.phantom == []


def test_detection_goals_follow_the_confirming_window_at_longer_polls():
    """A degraded link confirmed at the second 5 s poll (5 s after the first that could see it) is on time at a
    5 s interval; 6 s after it at 1 s polls is late, as is a slow GPU 17 s after its first poll at 5 s."""
    ground = [{"kind": "link_degraded", "component": "l", "start": 62.0, "end": 160.0},
              {"kind": "slow_gpu", "component": "g", "start": 75.0, "end": 149.0}]

    def run(delays: dict[str, float], interval: float) -> list[str]:
        results = [{"seed": 1, "ground": ground, "score": {"detection_delay_s": delays}}]
        return late_detections(results, interval, persist_windows=2, window_s=1.0)

    # first poll that could see them: 65 (lag 3) and 75 (lag 0)
    assert run({"0": 8.0, "1": 15.0}, 5.0) == []
    assert run({"0": 8.0, "1": 17.0}, 5.0) == ["seed 1: slow_gpu g first seen 17.0 s (17.0 s after the first poll "
                                               "that could see it) > 16 s"]
    assert run({"0": 6.0}, 1.0) == ["seed 1: link_degraded l first seen 6.0 s (6.0 s after the first poll that "
                                    "could see it) > 3 s"]
