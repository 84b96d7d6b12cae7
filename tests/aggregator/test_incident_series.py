"""The aggregator's per-incident series: fabricmon_incident_open and
fabricmon_incident_started_timestamp_seconds, one per OPEN incident (the dashboards'
incidents table and annotations read them); resolved incidents disappear."""

from __future__ import annotations

import subprocess

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.aggregator.http_api import AggregatorCollector
from support.enginerig import Cluster, flaky
from support.promtools import PROMTOOL, require_binary


def _scrape(engine) -> tuple[bytes, dict[str, list]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AggregatorCollector(engine))
    text = generate_latest(reg)
    fams = {f.name: f.samples for f in text_string_to_metric_families(text.decode())}
    return text, fams


def test_open_incident_has_series_and_resolved_one_disappears() -> None:
    c = Cluster()
    c.run(20)
    _, fams = _scrape(c.engine)
    assert fams["fabricmon_incident_open"] == [] and fams["fabricmon_incident_started_timestamp_seconds"] == []

    c.run(30, flaky("node-003", "mlx5_3"))
    [inc] = c.incidents(alertname="FabricLinkErrors")
    text, fams = _scrape(c.engine)
    lint = subprocess.run([require_binary(PROMTOOL), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
    want = {"alertname": "FabricLinkErrors", "severity": inc.severity, "component_type": "link",
            "component": "node-003/mlx5_3/1", "node": "node-003", "rail": "3", "leaf": "leaf-u0-r3",
            "hpc_job": "", "job_id": "", "spine": ""}  # no job's ranks use the link; spine: an uplink's
    opened = [s for s in fams["fabricmon_incident_open"] if s.labels["alertname"] == "FabricLinkErrors"]
    assert [(s.labels, s.value) for s in opened] == [(want, 1.0)]
    started = [s for s in fams["fabricmon_incident_started_timestamp_seconds"] if s.labels == want]
    assert [s.value for s in started] == [inc.first_seen]
    # bounded by the open incidents: one series each, no more
    assert len(fams["fabricmon_incident_open"]) == len(c.engine.open_incidents())

    c.run(40)
    assert inc.resolved_at is not None
    _, fams = _scrape(c.engine)
    assert not [s for s in fams["fabricmon_incident_open"] if s.labels["alertname"] == "FabricLinkErrors"]
    assert not [s for s in fams["fabricmon_incident_started_timestamp_seconds"]
                if s.labels["alertname"] == "FabricLinkErrors"]
