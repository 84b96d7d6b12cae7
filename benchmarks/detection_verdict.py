"""bench_detection.py's judgement of detection delays and cost, as data in and reasons out (pure: no I/O).

``late_detections``: the faults first seen later than their goal.  The goals (3 s for hard faults, 12 s for
the others) were set at 1 s polls, where the detection window is 1 s; judged from the first poll that could
see the fault (a fault injected just after a poll is in no batch for up to one interval).  A fault is
raised on evidence in ``persist_windows`` windows (a degraded link or a config drift after a 2 s
persistence: the next poll), and each window widens to the poll interval, so the confirming window ends
``(persist_windows - 1) x (interval - window_s)`` later than at 1 s polls; the goal follows (raising on one
window would page on any one-poll burst).  Hangs (60 s) and switch-side faults (40 s, sweep-paced) keep
their goals.

``judge_cost``: each ground-truth fault's standalone impact against the first incident on its component
that lists jobs: a pair with truth >= 0.03 is within bounds when ``|estimate - truth| <= max(0.25 x truth,
0.02)``; a fault no incident localized, a hurt job the incident does not list, and a job listed without an
estimate are pairs out of bounds (never left out of the count).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HARD = ("link_down", "link_flap", "link_degraded", "nvlink_down", "flaky_cable")
HARD_S, OTHER_S, HANG_S, SWITCH_S = 3.0, 12.0, 60.0, 40.0
TRUTH_MIN = 0.03  # pairs judged: the fault slows the job by at least this much alone
PHANTOM_TRUTH = 0.01


def confirm_s(interval: float, persist_windows: int, window_s: float) -> float:
    return (persist_windows - 1) * max(0.0, interval - window_s)


def goal_s(kind: str, interval: float, persist_windows: int, window_s: float,
           switch_kinds: Iterable[str] = ()) -> float:
    if kind == "rank_hang":
        return HANG_S
    if kind in set(switch_kinds):
        return SWITCH_S
    return (HARD_S if kind in HARD else OTHER_S) + confirm_s(interval, persist_windows, window_s)


def late_detections(results: Sequence[Mapping[str, Any]], interval: float, persist_windows: int,
                    window_s: float, switch_kinds: Iterable[str] = ()) -> list[str]:
    """One line per fault seen later than its goal (``results``: seed, ground, score.detection_delay_s)."""
    sw = set(switch_kinds)
    slow = []
    for r in results:
        for fi, g in enumerate(r["ground"]):
            d = r["score"]["detection_delay_s"].get(str(fi))
            if d is None:
                continue  # a miss: recall's to count
            limit = goal_s(g["kind"], interval, persist_windows, window_s, sw)
            lag = math.ceil(g["start"] / interval - 1e-9) * interval - g["start"]
            if d - lag > limit + 1e-9:
                slow.append(f"seed {r['seed']}: {g['kind']} {g['component']} first seen {d:.1f} s "
                            f"({d - lag:.1f} s after the first poll that could see it) > {limit:g} s")
    return slow


@dataclass
class CostJudgement:
    pairs: list[dict[str, Any]] = field(default_factory=list)  # one row per judged or listed pair
    errors: list[float] = field(default_factory=list)  # |estimate - truth| of every estimated pair
    judged: int = 0
    within: int = 0
    by_case: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # [within, judged]
    off: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)


def judge_cost(results: Sequence[Mapping[str, Any]]) -> CostJudgement:
    """``results``: seed, ground (with ``impact``), incidents (relative times, ``impact``), duration."""
    out = CostJudgement()
    for r in results:
        ground, incs = r["ground"], r["incidents"]
        for g in ground:
            if "impact" not in g or not g.get("component"):
                continue
            hits = sorted((i for i in incs if i["component"] == g["component"] and i.get("impact")),
                          key=lambda i: i["first_seen"])
            truth = {x["job"]: x["step_slowdown"] for x in g["impact"]}
            est = {x["job"]: x["step_slowdown"] for x in hits[0]["impact"]} if hits else {}
            g_end = g["end"] if g["end"] is not None else r["duration"]
            for job in sorted(set(truth) | set(est)):
                # each fault's truth is its standalone effect; where another fault hurt the job at the same
                # time the estimate is that fault's share by time slices (aggregator/cost.py)
                overlap = any(o is not g and o.get("impact") and any(x["job"] == job for x in o["impact"])
                              and o["start"] < g_end and g["start"] < (o["end"] if o["end"] is not None else 1e18)
                              for o in ground)
                case = "overlapping" if overlap else ("lone straggler" if g["kind"] == "slow_gpu" else "alone")
                t, e = truth.get(job, 0.0), est.get(job)
                row = {"seed": r["seed"], "kind": g["kind"], "component": g["component"],
                       "span": (g["start"], g_end), "job": job, "estimate": e, "truth": t, "case": case}
                if e is None:
                    if t >= TRUTH_MIN:
                        why = ("no estimate" if job in est else "job not listed" if hits else
                               "fault not localized, no incident")
                        out.judged += 1
                        out.by_case[case][1] += 1
                        out.pairs.append({**row, "ok": False, "why": why})
                        out.off.append(f"seed {r['seed']}: {g['kind']} {g['component']} ({case}) {job}: {why}, "
                                       f"truth {t:.3f}")
                    continue
                out.errors.append(abs(e - t))
                if t >= TRUTH_MIN:
                    ok = abs(e - t) <= max(0.25 * t, 0.02)
                    out.judged += 1
                    out.within += ok
                    out.by_case[case][0] += ok
                    out.by_case[case][1] += 1
                    out.pairs.append({**row, "ok": ok, "why": ""})
                    if not ok:
                        out.off.append(f"seed {r['seed']}: {g['kind']} {g['component']} ({case}) {job}: estimated "
                                       f"{e:.3f}, truth {t:.3f}")
                if e >= TRUTH_MIN and t < PHANTOM_TRUTH:
                    out.phantom.append(f"seed {r['seed']}: {g['kind']} {g['component']} listed {job} at {e:.3f}, "
                                       f"truth {t:.3f}")
    return out


def pair_table(j: CostJudgement) -> list[str]:
    """The judged pairs as a markdown table (docs/benchmarks.md)."""
    lines = ["| seed | fault | component | span (s) | job | estimated | standalone truth | within bounds |",
             "|---|---|---|---|---|---|---|---|"]
    for p in j.pairs:
        est = "-" if p["estimate"] is None else f"{p['estimate']:.3f}"
        ok = "yes" if p["ok"] else f"no ({p['why']})" if p["why"] else "no"
        lines.append(f"| {p['seed']} | {p['kind']} | {p['component']} | {p['span'][0]:.0f}-{p['span'][1]:.0f} | "
                     f"{p['job']} | {est} | {p['truth']:.3f} | {ok} |")
    return lines
