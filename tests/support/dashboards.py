"""The dashboards' panels and the metric names their queries use."""

from __future__ import annotations

import re

AGGREGATOR_METRICS = {"fabricmon_agents_connected", "fabricmon_ingest_samples_total", "fabricmon_component_suspicion",
                      "fabricmon_rank_lateness_score", "fabricmon_incidents_open", "fabricmon_alerts_sent_total",
                      "fabricmon_incident_open", "fabricmon_incident_started_timestamp_seconds",
                      "fabricmon_incident_gpu_hours_per_hour", "fabricmon_agents_unknown",
                      "fabricmon_agents_never_connected", "fabricmon_ingest_batches_dropped_total",
                      "fabricmon_heartbeats_dropped_total", "fabricmon_state_save_failures_total",
                      "fabricmon_remediation_actions_total", "fabricmon_remediation_breaker_tripped",
                      "fabricmon_remediation_nodes_out"}


PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "day_of_month", "day_of_week", "days_in_month", "delta", "deriv", "exp", "floor",
    "histogram_quantile", "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
    "last_over_time", "ln", "log10", "log2", "max_over_time", "min_over_time", "minute", "month", "predict_linear",
    "present_over_time", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc",
    "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector", "year",
    "label_values", "query_result",  # Grafana's variable functions
}


PROMQL_KEYWORDS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
    "inf", "nan",
}


def _panels(dash: dict):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers that are not functions, keywords or labels)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # string literals (label values, regexes)
    s = re.sub(r"\{[^{}]*\}", " ", s)                       # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                       # range/subquery durations
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", s)  # label lists
    s = re.sub(r"\$\{?\w+\}?", " ", s)                      # Grafana variables
    s = re.sub(r"\boffset\s+\d+[smhdwy]", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        ident, call = m.group(1), m.group(2)
        if call and ident in PROMQL_FUNCTIONS | PROMQL_KEYWORDS:
            continue
        if ident in PROMQL_KEYWORDS or re.fullmatch(r"\d.*", ident):
            continue
        assert not call, f"unknown function {ident!r} in {expr!r}"
        names.add(ident)
    return names
