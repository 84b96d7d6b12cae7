"""deploy/prometheus: the mixin regenerates the files unchanged, promtool check/test rules, alert names per DESIGN."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from support.mixin import MIXIN, PROM, _mixin
from support.promtools import REPO, promtool

RULE_FILES = sorted(PROM.glob("*.rules.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.test.yml"))
PROMETHEUS_ALERTS = {
    "FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded", "FabricPFCStorm",
    "FabricCongestion", "RDMARetransmits", "FabricConfigDrift", "NVLinkDown", "NVLinkErrors", "GPUXidFatal",
    "FabricmonAgentDown", "FabricmonCollectorFailing", "FabricCableDegrading",
}
# fabricmon watching itself (aggregator scraped, alerts delivered, agents streaming): component_type
# `service`, the fabricmon deployment itself, not a fabric component.
SELF_ALERTS = {"FabricmonAggregatorDown", "FabricmonAlertDeliveryFailing", "FabricmonAgentsDisconnected",
               "FabricmonBatchesDropped",
               # blind spots: what an agent cannot see, it says (issue 25)
               "FabricmonAgentStreamDown", "FabricmonAgentRefused", "FabricmonSpoolDropping",
               "FabricmonGPUsUnmonitored", "FabricmonDevicesMissing", "FabricmonReloadFailed",
               "FabricmonNodesNeverConnected",
               # what local users on a node cannot do unseen (issue 35)
               "FabricmonHeartbeatsDropped", "FabricmonIntakeRefusing",
               # the aggregator cannot persist its open incidents (issue 35)
               "FabricmonStateSaveFailing",
               # the switch sweep (sources.ib_switches, issue 40)
               "FabricmonSwitchSweepFailing",
               # acting on faults: the remediation circuit breaker tripped (issue 42)
               "FabricmonRemediationHalted"}
CONTRACT_LABELS = {"severity", "component_type", "component", "node", "rail", "leaf", "gpu", "job", "cluster",
                   "sender"}  # sender: the fallback rules' alerts (prometheus), apart from the aggregator's
COMPONENT_TYPES = {"link", "nic", "gpu", "node", "rail", "leaf", "spine", "config", "nvlink", "service"}


def _rules() -> list[dict]:
    out = []
    for f in RULE_FILES:
        for group in yaml.safe_load(f.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def test_rule_files_are_the_mixins_output(tmp_path) -> None:
    """The checked-in rule files are exactly what mixin.py writes (edit the mixin, not the files)."""
    res = subprocess.run([sys.executable, str(MIXIN), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [p.name for p in RULE_FILES]
    for p in RULE_FILES:
        assert (tmp_path / p.name).read_text() == p.read_text(), f"{p.name}: run python deploy/prometheus/mixin.py"
    res = subprocess.run([sys.executable, str(MIXIN), "--check"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # --check notices a stale file.
    stale = tmp_path / RULE_FILES[0].name
    stale.write_text(stale.read_text() + "# edited by hand\n")
    res = subprocess.run([sys.executable, str(MIXIN), "--check", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and stale.name in res.stderr


def test_mixin_output_loads_as_the_rule_dicts() -> None:
    """The hand-written YAML emitter says what rule_dict says (quoting, block scalars)."""
    mixin = _mixin()
    for rf in mixin.FILES:
        loaded = yaml.safe_load((PROM / rf.name).read_text())
        expected = {"groups": [{"name": g.name,
                                "rules": [mixin.rule_dict(r, mixin.CONFIG, g.fallback) for r in g.rules]}
                               for g in rf.groups]}
        assert loaded == expected, rf.name


def test_mixin_config_reaches_every_rule() -> None:
    mixin = _mixin()
    cfg = mixin.Config(agent_selector='job="site-agents"', aggregator_selector='job="site-aggr"',
                       runbook_url="https://wiki.example/{alert}",
                       for_windows={**mixin.Config().for_windows, "hard": "45s", "stream": "10m"},
                       agents_disconnected_ratio=0.5)
    text = "".join(mixin.render(cfg).values())
    assert "fabricmon-agent" not in text and "fabricmon-aggregator.*" not in text
    assert 'up{job="site-agents"} == 1' in text and 'fabricmon_agents_connected{job="site-aggr"}' in text
    rules = {r["alert"]: r for f in mixin.render(cfg).values() for g in yaml.safe_load(f)["groups"]
             for r in g["rules"] if "alert" in r}
    assert rules["FabricLinkDown"]["for"] == "45s" and rules["FabricmonAgentsDisconnected"]["for"] == "10m"
    assert "> 0.5" in rules["FabricmonAgentsDisconnected"]["expr"]
    assert all(r["annotations"]["runbook_url"] == f"https://wiki.example/{n}" for n, r in rules.items())
    with pytest.raises(ValueError, match="for_windows"):
        mixin.Config(for_windows={"hard": "soon"})
    with pytest.raises(ValueError, match="runbook_url"):
        mixin.Config(runbook_url="https://wiki.example/")
    with pytest.raises(KeyError, match="FabricLinkDown: Config.for_windows has no window 'hard'"):
        mixin.render(mixin.Config(for_windows={"rate": "1m"}))
    with pytest.raises(KeyError, match="nope"):
        mixin.rule_dict(mixin.Record("x:y", "up{${nope}}"), mixin.CONFIG)


def test_promtool_check_rules() -> None:
    assert RULE_FILES
    res = promtool("check", "rules", *RULE_FILES)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.integration
def test_promtool_unit_tests() -> None:
    assert TEST_FILES
    res = promtool("test", "rules", *TEST_FILES)
    assert res.returncode == 0, res.stdout + res.stderr


def test_alerts_match_the_contract() -> None:
    alerts = [r for r in _rules() if "alert" in r]
    names = [a["alert"] for a in alerts]
    assert sorted(names) == sorted(PROMETHEUS_ALERTS | SELF_ALERTS)
    runbooks = (PROM / "runbooks.md").read_text()
    for a in alerts:
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]
        assert a["labels"]["component_type"] in COMPONENT_TYPES, a["alert"]
        assert "component" in a["expr"], a["alert"]
        assert a["annotations"]["summary"], a["alert"]
        assert len(a["annotations"]["description"]) > 40, a["alert"]
        anchor = a["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == a["alert"].lower()
        assert f"## {a['alert']}\n" in runbooks
        # `for` stays short: the aggregator is the fast path, these rules the backstop.  Self alerts
        # wait out restarts and retries instead (but still page within 10 minutes).
        assert re.fullmatch(r"\d+[sm]", a["for"]), a["alert"]
        seconds = int(a["for"][:-1]) * (60 if a["for"].endswith("m") else 1)
        assert seconds <= (600 if a["alert"] in SELF_ALERTS else 120), a["alert"]


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for f in TEST_FILES:
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
                for exp in t.get("exp_alerts") or []:
                    assert set(exp["exp_labels"]) - {"instance", "xid", "collector", "reason"} <= CONTRACT_LABELS, exp
    every = PROMETHEUS_ALERTS | SELF_ALERTS
    assert firing >= every, every - firing
    assert silent >= every, every - silent


@pytest.mark.integration
def test_real_prometheus_loads_and_evaluates_the_rules(tmp_path) -> None:
    """A real Prometheus (started by tests/support/promtools.py) loads the rules and evaluates them without error."""
    from support.promtools import http, running_prometheus, wait_until

    with running_prometheus(tmp_path / "prom", rule_files=RULE_FILES, evaluation_interval="1s",
                            external_labels={"cluster": "test"}) as prom:
        def all_evaluated():
            _, body = http("GET", f"{prom.url}/api/v1/rules")
            rules = [r for g in body["data"]["groups"] for r in g["rules"]]
            if len(rules) != len(_rules()) or any(r["health"] == "unknown" for r in rules):
                return None
            return rules

        rules = wait_until(all_evaluated, 20.0, "every rule evaluated once", interval=0.2)
        bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        if bad:
            pytest.fail(f"rules failing in Prometheus: {bad}")


def test_fatal_xid_list_is_the_aggregators():
    """GPUXidFatal means the same XIDs whether Prometheus or the aggregator raises it: the rule reads
    the agent's per-GPU fatal counter (sources/nvml/xid.py), whose list is the aggregator's."""
    from fabricmon.aggregator.config import DetectionSettings
    from fabricmon.sources.nvml.xid import FATAL_XIDS

    assert FATAL_XIDS == frozenset(DetectionSettings().xid_fatal)
    rule = next(r for r in _rules() if r.get("alert") == "GPUXidFatal")
    assert "increase(fabricmon_gpu_xid_fatal_errors_total[5m]) > 0" in rule["expr"]
    assert " offset " not in rule["expr"]  # no new-series arm: it re-paged every old XID after a restart


def _aggregator_alerts() -> set[str]:
    from fabricmon.aggregator.incidents import SEVERITY

    return set(SEVERITY)


def test_rules_the_aggregator_also_sends_are_its_silent_fallback():
    """One sender per fault: every Prometheus alert the aggregator also sends is silenced while every
    aggregator target is up, and carries no training-job or cost label (only the aggregator knows those)."""
    mixin = _mixin()
    cfg = mixin.Config(aggregator_selector='job="site-aggr"')
    rules = {r["alert"]: r for f in mixin.render(cfg).values() for g in yaml.safe_load(f)["groups"]
             for r in g["rules"] if "alert" in r}
    shared = _aggregator_alerts() & set(rules)
    assert shared >= {"FabricLinkDown", "FabricLinkErrors", "GPUXidFatal", "NVLinkDown", "FabricPFCStorm",
                      "FabricmonAgentDown"}, shared
    # silent while the aggregator is up and done re-evaluating; an alert already firing lasts while its fault
    # does (hand-back, issue 36); a `sender` label keeps it apart from the aggregator's alert in Alertmanager
    arm = ('unless on (cluster)\n(\n  (min by (cluster) (up{job="site-aggr"}) == 1)\n  unless on (cluster)\n'
           '  (max by (cluster) (fabricmon_aggregator_resuming{job="site-aggr"}) == 1)\n)\n)\nor\n')
    for name in sorted(shared):
        expr = rules[name]["expr"]
        assert arm in expr, name
        assert expr.rstrip().endswith(f'ALERTS{{alertname="{name}", alertstate="firing", sender="prometheus"}}\n)')
        assert rules[name]["labels"]["sender"] == "prometheus", name
        assert not re.search(r"hpc_job|gpu_hours|cost", expr + json_dump(rules[name]["labels"])), name
    for name in sorted(set(rules) - shared):  # Prometheus' own alerts: never silenced by the aggregator
        assert 'min by (cluster) (up{job="site-aggr"}) == 1' not in rules[name]["expr"], name


def json_dump(obj) -> str:
    import json

    return json.dumps(obj, sort_keys=True)


def test_every_recording_rule_feeds_a_panel_or_an_alert():
    """A recorded series nobody reads costs storage and evaluation: each one is read by an alert, a
    shipped dashboard, or another recording rule that is."""
    records = [r["record"] for r in _rules() if "record" in r]
    alerts_text = " ".join(r["expr"] for r in _rules() if "alert" in r)
    dashboards = " ".join(p.read_text() for p in sorted((REPO / "dashboards" / "json").glob("*.json")))
    read = {name for name in records if re.search(re.escape(name) + r"\b(?!:)", alerts_text + " " + dashboards)}
    changed = True
    while changed:  # a rule read by a rule that is read
        changed = False
        for r in _rules():
            if "record" in r and r["record"] in read:
                for name in records:
                    if name not in read and re.search(re.escape(name) + r"\b(?!:)", r["expr"]):
                        read.add(name)
                        changed = True
    assert sorted(set(records) - read) == []
