"""Inhibitions scoped to what they explain (issue 25), with amtool against a real Alertmanager 0.25
running deploy/alertmanager/alertmanager.yml: alerts are added with ``amtool alert add`` and read
back with ``amtool alert query --inhibited / --active -o json``.

Each case runs in a cluster of its own (every rule has ``cluster`` in ``equal``), so one
Alertmanager holds them all and no case can inhibit another's alerts.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
import yaml

from fabricmon.aggregator.incidents import SEVERITY
from support.promtools import REPO, amtool, running_alertmanager, wait_until

pytestmark = pytest.mark.integration

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


def _straggler(cluster: str, node: str, gpu: int, job: str, unit: int, lateness: str = "comm") -> dict[str, str]:
    # A rank on GPU g of a rail-optimized node uses NIC g, rail g, leaf leaf-u<unit>-r<g>; the labels the
    # aggregator sends (correlator._straggler_finding): lateness "compute" or "comm", and the rank.
    return {"cluster": cluster, "alertname": "StragglerRank", "severity": "warning", "component_type": "gpu",
                "component": f"{node}/gpu{gpu}", "node": node, "gpu": str(gpu), "rail": str(gpu),
                "leaf": f"leaf-u{unit}-r{gpu}", "hpc_job": job, "rank": str(gpu), "lateness": lateness}


def _cable(cluster: str, alertname: str, severity: str, node: str, rail: int, unit: int) -> dict[str, str]:
    return {"cluster": cluster, "alertname": alertname, "severity": severity, "component_type": "link",
            "component": f"{node}/mlx5_{rail}/1", "node": node, "rail": str(rail), "leaf": f"leaf-u{unit}-r{rail}"}


# (case, alerts to add, "alertname component" expected inhibited, and expected active)
CASES = [
    ("shared leaf hides only the job's stragglers under that leaf",
     [{"cluster": "c1", "alertname": "SlowRanksSharedComponent", "severity": "critical", "component_type": "leaf",
           "component": "leaf-u1-r3", "leaf": "leaf-u1-r3", "rail": "3", "hpc_job": "llm-a"},
      _straggler("c1", "node-017", 3, "llm-a", 1),
      _straggler("c1", "node-040", 3, "llm-a", 2),      # same job, same rail, another leaf
      _straggler("c1", "node-018", 3, "llm-b", 1)],     # same leaf, another job
     {"StragglerRank node-017/gpu3"},
     {"SlowRanksSharedComponent leaf-u1-r3", "StragglerRank node-040/gpu3", "StragglerRank node-018/gpu3"}),
    ("shared GPU hides only the ranks on that GPU",
     [{"cluster": "c2", "alertname": "SlowRanksSharedComponent", "severity": "critical", "component_type": "gpu",
           "component": "node-040/gpu2", "node": "node-040", "gpu": "2", "rail": "2", "leaf": "leaf-u2-r2",
       "hpc_job": "llm-a"},
      _straggler("c2", "node-040", 2, "llm-a", 2),
      _straggler("c2", "node-040", 5, "llm-a", 2),      # same node, another GPU
      _straggler("c2", "node-041", 2, "llm-a", 2)],     # same leaf, another node
     {"StragglerRank node-040/gpu2"},
     {"SlowRanksSharedComponent node-040/gpu2", "StragglerRank node-040/gpu5", "StragglerRank node-041/gpu2"}),
    ("a ticket (link errors) hides stragglers under its leaf, never a page elsewhere",
     [{"cluster": "c3", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "link",
           "component": "node-017/mlx5_3/1", "node": "node-017", "rail": "3", "leaf": "leaf-u1-r3"},
      _straggler("c3", "node-018", 3, "llm-a", 1),
      _straggler("c3", "node-040", 3, "llm-a", 2),      # same rail, another leaf: not explained
      {"cluster": "c3", "alertname": "SlowRanksSharedComponent", "severity": "critical", "component_type": "rail",
           "component": "rail3", "rail": "3", "hpc_job": "llm-b"}],
     {"StragglerRank node-018/gpu3"},
     {"FabricLinkErrors node-017/mlx5_3/1", "StragglerRank node-040/gpu3", "SlowRanksSharedComponent rail3"}),
    ("a page (link down) still hides the slow ranks of its rail (sharded aggregators)",
     [{"cluster": "c4", "alertname": "FabricLinkDown", "severity": "critical", "component_type": "link",
           "component": "node-017/mlx5_3/1", "node": "node-017", "rail": "3", "leaf": "leaf-u1-r3"},
      {"cluster": "c4", "alertname": "SlowRanksSharedComponent", "severity": "critical", "component_type": "rail",
           "component": "rail3", "rail": "3", "hpc_job": "llm-b"},
      _straggler("c4", "node-040", 3, "llm-a", 2),
      _straggler("c4", "node-040", 4, "llm-a", 2)],     # rail 4: not explained
     {"SlowRanksSharedComponent rail3", "StragglerRank node-040/gpu3"},
     {"FabricLinkDown node-017/mlx5_3/1", "StragglerRank node-040/gpu4"}),
    # issue 36: the aggregator said the lateness is compute time the fabric does not explain; a cable ticket
    # on its leaf must not mute it ("replace cable" was all the on-call saw), a comm straggler there is the
    # cable's impact and stays hidden
    ("a cable ticket on the leaf hides the comm straggler, never the compute straggler",
     [_cable("c8", "FabricLinkErrors", "warning", "node-017", 3, 1),
      _straggler("c8", "node-018", 3, "llm-a", 1, lateness="compute"),
      _straggler("c8", "node-019", 3, "llm-a", 1, lateness="comm")],
     {"StragglerRank node-019/gpu3"},
     {"FabricLinkErrors node-017/mlx5_3/1", "StragglerRank node-018/gpu3"}),
    ("a flapping link and a degraded leaf: comm stragglers hidden, compute stragglers shown",
     [_cable("c9", "FabricLinkFlapping", "warning", "node-017", 3, 1),
      {"cluster": "c9", "alertname": "FabricLeafDegraded", "severity": "critical", "component_type": "leaf",
       "component": "leaf-u2-r4", "leaf": "leaf-u2-r4", "rail": "4"},
      _straggler("c9", "node-018", 3, "llm-a", 1, lateness="compute"),
      _straggler("c9", "node-019", 3, "llm-a", 1),
      _straggler("c9", "node-041", 4, "llm-a", 2, lateness="compute"),
      _straggler("c9", "node-042", 4, "llm-a", 2),
      _straggler("c9", "node-060", 4, "llm-a", 3)],     # rail 4 of another unit: the rail rule
     {"StragglerRank node-019/gpu3", "StragglerRank node-042/gpu4", "StragglerRank node-060/gpu4"},
     {"FabricLinkFlapping node-017/mlx5_3/1", "FabricLeafDegraded leaf-u2-r4", "StragglerRank node-018/gpu3",
      "StragglerRank node-041/gpu4"}),
    ("agent down (a ticket) hides the node's tickets, not its pages",
     [{"cluster": "c5", "alertname": "FabricmonAgentDown", "severity": "warning", "component_type": "node",
           "component": "node-050", "node": "node-050"},
      {"cluster": "c5", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "link",
           "component": "node-050/mlx5_1/1", "node": "node-050", "rail": "1", "leaf": "leaf-u3-r1"},
      {"cluster": "c5", "alertname": "GPUXidFatal", "severity": "critical", "component_type": "gpu",
           "component": "node-050/gpu1", "node": "node-050", "gpu": "1"},
      {"cluster": "c5", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "link",
           "component": "node-051/mlx5_1/1", "node": "node-051", "rail": "1", "leaf": "leaf-u3-r1"}],
     {"FabricLinkErrors node-050/mlx5_1/1"},
     {"FabricmonAgentDown node-050", "GPUXidFatal node-050/gpu1", "FabricLinkErrors node-051/mlx5_1/1"}),
    ("aggregator down hides the agents' stream-down tickets",
     [{"cluster": "c6", "alertname": "FabricmonAggregatorDown", "severity": "critical", "component_type": "service",
           "component": "10.0.1.5:9722"},
      {"cluster": "c6", "alertname": "FabricmonAgentStreamDown", "severity": "warning", "component_type": "service",
           "component": "node-001", "node": "node-001"},
      {"cluster": "c7", "alertname": "FabricmonAgentStreamDown", "severity": "warning", "component_type": "service",
           "component": "node-002", "node": "node-002"}],     # another cluster's aggregator is up
     {"FabricmonAgentStreamDown node-001"},
     {"FabricmonAggregatorDown 10.0.1.5:9722", "FabricmonAgentStreamDown node-002"}),
    # issue 40: the switch side.  A host cable seen from its swept switch end (label switch_end, as the
    # aggregator sends it: switch_side.py, alertmanager.LABEL_KEYS) stays visible when the host's agent is
    # down; one without a swept end is hidden as before; an uplink (no node) is never the AgentDown's, not
    # even the sweeper's own.
    ("agent down hides a host cable's ticket, not one its switch end still sees",
     [{"cluster": "c11", "alertname": "FabricmonAgentDown", "severity": "warning", "component_type": "node",
           "component": "node-060", "node": "node-060"},
      {"cluster": "c11", "alertname": "FabricmonAgentDown", "severity": "warning", "component_type": "node",
           "component": "sweeper-0", "node": "sweeper-0"},
      {"cluster": "c11", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "link",
           "component": "node-060/mlx5_0/1", "node": "node-060", "rail": "0", "leaf": "leaf-03",
       "switch_end": "leaf-03/p17"},
      {"cluster": "c11", "alertname": "FabricLinkFlapping", "severity": "warning", "component_type": "link",
           "component": "node-060/mlx5_1/1", "node": "node-060", "rail": "1", "leaf": "leaf-04"},
      {"cluster": "c11", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "uplink",
           "component": "leaf-03/p21", "leaf": "leaf-03", "spine": "spine-00", "spine_port": "4"}],
     {"FabricLinkFlapping node-060/mlx5_1/1"},
     {"FabricmonAgentDown node-060", "FabricmonAgentDown sweeper-0", "FabricLinkErrors node-060/mlx5_0/1",
      "FabricLinkErrors leaf-03/p21"}),
    ("a degraded spine hides its own uplinks only",
     [{"cluster": "c12", "alertname": "FabricSpineDegraded", "severity": "critical", "component_type": "spine",
           "component": "spine-01", "spine": "spine-01"},
      {"cluster": "c12", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "uplink",
           "component": "leaf-03/p22", "leaf": "leaf-03", "spine": "spine-01", "spine_port": "4"},
      {"cluster": "c12", "alertname": "FabricLinkErrors", "severity": "warning", "component_type": "uplink",
           "component": "leaf-03/p23", "leaf": "leaf-03", "spine": "spine-02", "spine_port": "4"}],
     {"FabricLinkErrors leaf-03/p22"},
     {"FabricSpineDegraded spine-01", "FabricLinkErrors leaf-03/p23"}),
]


def _key(labels: dict[str, str]) -> tuple[str, str]:
    return labels["cluster"], f"{labels['alertname']} {labels['component']}"


def _query(am_url: str, flag: str) -> list[dict]:
    res = amtool("alert", "query", flag, "-o", "json", f"--alertmanager.url={am_url}")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def test_inhibitions_are_scoped(tmp_path) -> None:
    with running_alertmanager(CONFIG.read_text(), tmp_path / "am") as am:
        end = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
        n = 0
        for _, alerts, _, _ in CASES:
            for labels in alerts:
                res = amtool("alert", "add", *(f"{k}={v}" for k, v in labels.items()), f"--end={end}",
                             "--annotation=summary=test", f"--alertmanager.url={am.url}")
                assert res.returncode == 0, res.stdout + res.stderr
                n += 1

        last: list[tuple[set, set]] = []

        def settled() -> bool:
            # Inhibition is computed asynchronously: wait until every case's expected targets show it.
            inhibited = {_key(a["labels"]) for a in _query(am.url, "--inhibited")}
            active = {_key(a["labels"]) for a in _query(am.url, "--active")}
            last[:] = [(inhibited, active)]
            want = {(alerts[0]["cluster"], c) for _, alerts, hidden, _ in CASES for c in hidden}
            return len(inhibited | active) == n and want <= inhibited

        try:
            wait_until(settled, 15.0, "inhibitions to be computed", interval=0.3)
        except TimeoutError:
            pass  # the per-case assertions below say which case is wrong
        inhibited, active = last[0]
        for case, alerts, hidden, shown in CASES:
            clusters = {a["cluster"] for a in alerts}
            got_hidden = {c for cl, c in inhibited if cl in clusters}
            assert got_hidden == hidden, f"{case}: inhibited {sorted(got_hidden)}, expected {sorted(hidden)}"
            got_shown = {c for cl, c in active if cl in clusters}
            assert got_shown == shown, f"{case}: active {sorted(got_shown)}, expected {sorted(shown)}"


def _alert_severities() -> dict[str, str]:
    out = dict(SEVERITY)
    for f in sorted((REPO / "deploy" / "prometheus").glob("*.rules.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    out.setdefault(r["alert"], r["labels"]["severity"])
    return out


def test_no_ticket_level_source_hides_a_page_on_another_component() -> None:
    """Static, over every rule: a source that can be a warning either targets no critical alert
    (by name or by a severity matcher) or only the same component (`component` in `equal`)."""
    sev = _alert_severities()
    rules = yaml.safe_load(CONFIG.read_text())["inhibit_rules"]

    def names(matchers: list[str]) -> set[str]:
        for m in matchers:
            got = re.fullmatch(r'alertname(=~?|!=)"(.*)"', m)
            if got and got.group(1) != "!=":
                pattern = got.group(2)
                return {a for a in sev if re.fullmatch(pattern, a)}
        excluded = {re.fullmatch(r'alertname!="(.*)"', m).group(1) for m in matchers if m.startswith("alertname!=")}
        return set(sev) - excluded

    for rule in rules:
        sources = names(rule["source_matchers"])
        if not any(sev[a] == "warning" for a in sources):
            continue
        if "component" in rule["equal"] or 'severity!="critical"' in rule["target_matchers"]:
            continue
        pages = sorted(a for a in names(rule["target_matchers"]) if sev[a] == "critical")
        assert not pages, f"ticket-level {sorted(sources)} may hide pages {pages}: {rule}"
