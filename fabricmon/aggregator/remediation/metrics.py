"""The remediation stage's /metrics series (read by the self-monitoring dashboard and FabricmonRemediationHalted).

Exported whether or not remediation is on: ``fabricmon_remediation_enabled`` 0 says it is off, so a dashboard
reading 0 actions is not mistaken for a stage that acts and found nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .config import ACTIONS
from .policy import RESULTS
from .remediator import Remediator


def remediation_series(r: Remediator | None) -> Iterator[Metric]:
    snap = r.snapshot() if r is not None else None
    g = GaugeMetricFamily("fabricmon_remediation_enabled",
                          "1 when the remediation section is configured, by mode (dry_run or act); 0 when off.",
                          labels=["mode"])
    for mode in ("dry_run", "act"):
        g.add_metric([mode], 1 if snap is not None and snap["mode"] == mode else 0)
    yield g
    c = CounterMetricFamily("fabricmon_remediation_actions",
                            "Remediation decisions and action results by action and result (done, dry_run, breaker, "
                            "cooldown, excluded, not_node_local, foreign_drain, failed).", labels=["action", "result"])
    # every (action, result) from the start at 0, so a rate reads 0 rather than no data (off: the same zeros)
    counts = {(a, res): 0 for a in ACTIONS for res in RESULTS}
    counts.update((snap or {}).get("actions_total", {}))
    for (a, res), n in sorted(counts.items()):
        c.add_metric([a, res], n)
    yield c
    c = CounterMetricFamily("fabricmon_remediation_undos",
                            "Undo of fabricmon's own actions (RESUME, untaint) by action and result.",
                            labels=["action", "result"])
    for (a, res), n in sorted((snap or {}).get("undos_total", {}).items()):
        c.add_metric([a, res], n)
    yield c
    g = GaugeMetricFamily("fabricmon_remediation_breaker_tripped",
                          "1 while the remediation circuit breaker is tripped (every action refused until "
                          "`fabricmon remediation reset`), by mode.", labels=["mode"])
    for mode in ("dry_run", "act"):
        g.add_metric([mode], 1 if snap is not None and snap["mode"] == mode and snap["tripped"] else 0)
    yield g
    g = GaugeMetricFamily("fabricmon_remediation_breaker_limit",
                          "Nodes the breaker lets be acted on per window: max(max_nodes, ceil(max_nodes_percent of "
                          "the topology's nodes)); 0 when off.")
    g.add_metric([], snap["limit"] if snap is not None else 0)
    yield g
    g = GaugeMetricFamily("fabricmon_remediation_nodes_out",
                          "Nodes fabricmon has out of service now (drained or tainted, not yet undone).")
    g.add_metric([], snap["nodes_out"] if snap is not None else 0)
    yield g
    g = GaugeMetricFamily("fabricmon_remediation_in_flight", "Nodes with an action or undo running now.")
    g.add_metric([], snap["in_flight"] if snap is not None else 0)
    yield g
    c = CounterMetricFamily("fabricmon_remediation_retries", "Failed action attempts retried with backoff.")
    c.add_metric([], snap["retries_total"] if snap is not None else 0)
    yield c
