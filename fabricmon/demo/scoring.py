"""Score detected incidents against a scenario's injected ground truth.

An incident matches a fault when it names the fault's component and was first
seen while the fault was active (from ``start - slack`` to ``end + slack``).
Precision counts pages (incidents of severity warning or critical: what wakes someone);
recall counts faults that have a component (``counter_reset`` has none: anything raised
during it is a false positive).  Info findings (``StageImbalance``, ``SoftwareStraggler``)
are scored per decoy (DESIGN "Jobs, decoys and cost"): a decoy may raise at most one, and
never a page; a page on a decoy's component is a ``decoy_page``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Match:
    fault_index: int
    incident_id: str
    delay_s: float  # first_seen - fault start, simulated seconds
    alertname_ok: bool


# (alertname, names a stage) -> the decoy kind that finding most likely comes from
LIKELY = {("StageImbalance", True): "stage_imbalance", ("StageImbalance", False): "seqlen_imbalance",
          ("SoftwareStraggler", False): "dataloader_slow"}


def is_page(incident: dict) -> bool:
    return incident.get("severity", "warning") in ("warning", "critical")


def decoy_components(decoy: dict) -> tuple[str, ...]:
    """The component ids a decoy could be mistaken for (its node, its job and stages, its link)."""
    if decoy.get("job"):
        return (decoy["job"],)
    if decoy["kind"] == "background_errors":
        return (f"{decoy['node']}/mlx5_{decoy['rail']}/1", f"{decoy['node']}/mlx5_{decoy['rail']}", decoy["node"])
    return (decoy["node"],)


def _on(component: str, prefixes: tuple[str, ...]) -> bool:
    return any(component == p or component.startswith(p + "/") for p in prefixes)


def score(faults: list[dict], incidents: list[dict], *, duration: float, slack: float = 30.0,
          decoys: list[dict] | None = None) -> dict:
    """``faults`` and ``incidents`` carry times in seconds since the scenario started."""
    info = [i for i in incidents if not is_page(i)]
    incidents = [i for i in incidents if is_page(i)]
    matches: list[Match] = []
    matched_incidents: set[str] = set()
    detected: set[int] = set()
    for inc in sorted(incidents, key=lambda i: i["first_seen"]):
        for fi, f in enumerate(faults):
            if not f.get("component"):
                continue
            end = f["end"] if f.get("end") is not None else duration
            if inc["component"] == f["component"] and f["start"] - slack <= inc["first_seen"] <= end + slack:
                matches.append(Match(fi, inc["id"], inc["first_seen"] - f["start"],
                                     inc["alertname"] == f.get("alertname")))
                matched_incidents.add(inc["id"])
                detected.add(fi)
                break
    scored_faults = [i for i, f in enumerate(faults) if f.get("component")]
    tp = len(matched_incidents)
    fp = len(incidents) - tp
    precision = tp / len(incidents) if incidents else 1.0
    recall = len(detected & set(scored_faults)) / len(scored_faults) if scored_faults else 1.0
    first_delay: dict[int, float] = {}
    for m in matches:
        first_delay[m.fault_index] = min(first_delay.get(m.fault_index, m.delay_s), m.delay_s)
    delays = list(first_delay.values())
    decoys = decoys or []
    per_decoy: list[dict] = [{"info_ids": [], "page_ids": sorted(
        i["id"] for i in incidents if i["id"] not in matched_incidents and _on(i["component"], decoy_components(d)))}
        for d in decoys]
    # each info finding is one decoy's: the likeliest cause among the decoys on its component (a stage
    # finding is a stage_imbalance's; the rest go to the decoy with the fewest findings so far)
    for i in sorted(info, key=lambda x: x["first_seen"]):
        cands = [k for k, d in enumerate(decoys) if _on(i["component"], decoy_components(d))]
        if not cands:
            continue
        best = min(cands, key=lambda k: (decoys[k]["kind"] != LIKELY.get((i["alertname"], "/stage" in i["component"])),
                                         len(per_decoy[k]["info_ids"]), k))
        per_decoy[best]["info_ids"].append(i["id"])
    return {
        "pages": len(incidents),
        "decoy_pages": sum(len(d["page_ids"]) for d in per_decoy),
        "info_findings": len(info),
        "per_decoy": per_decoy,
        "true_positives": tp,
        "false_positives": fp,
        "faults": len(scored_faults),
        "faults_detected": len(detected),
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "median_detection_delay_s": round(statistics.median(delays), 3) if delays else None,
        "detection_delay_s": {str(k): round(v, 3) for k, v in sorted(first_delay.items())},
        "alertname_agreement": round(sum(m.alertname_ok for m in matches) / len(matches), 4) if matches else None,
        "unmatched_incidents": sorted(i["id"] for i in incidents if i["id"] not in matched_incidents),
    }
