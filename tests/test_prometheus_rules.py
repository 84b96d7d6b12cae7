"""deploy/prometheus: promtool check rules and promtool test rules; alert names per DESIGN."""

from __future__ import annotations

import re

import pytest
import yaml

from promtools import REPO, promtool

PROM = REPO / "deploy" / "prometheus"
RULE_FILES = sorted(PROM.glob("*.rules.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.test.yml"))
PROMETHEUS_ALERTS = {
    "FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded", "FabricPFCStorm",
    "FabricCongestion", "RDMARetransmits", "FabricConfigDrift", "NVLinkDown", "NVLinkErrors", "GPUXidFatal",
    "FabricmonAgentDown", "FabricmonCollectorFailing", "FabricCableDegrading",
}
CONTRACT_LABELS = {"severity", "component_type", "component", "node", "rail", "leaf", "gpu", "job", "cluster"}
COMPONENT_TYPES = {"link", "nic", "gpu", "node", "rail", "leaf", "spine", "config", "nvlink"}


def _rules() -> list[dict]:
    out = []
    for f in RULE_FILES:
        for group in yaml.safe_load(f.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def test_promtool_check_rules() -> None:
    assert RULE_FILES
    res = promtool("check", "rules", *RULE_FILES)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_unit_tests() -> None:
    assert TEST_FILES
    res = promtool("test", "rules", *TEST_FILES)
    assert res.returncode == 0, res.stdout + res.stderr


def test_alerts_match_the_contract() -> None:
    alerts = [r for r in _rules() if "alert" in r]
    names = [a["alert"] for a in alerts]
    assert sorted(names) == sorted(PROMETHEUS_ALERTS)
    runbooks = (PROM / "runbooks.md").read_text()
    for a in alerts:
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]
        assert a["labels"]["component_type"] in COMPONENT_TYPES, a["alert"]
        assert "component" in a["expr"], a["alert"]
        assert a["annotations"]["summary"], a["alert"]
        anchor = a["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == a["alert"].lower()
        assert f"## {a['alert']}\n" in runbooks
        # `for` stays short: the aggregator is the fast path, these rules the backstop.
        assert re.fullmatch(r"\d+[sm]", a["for"]), a["alert"]
        seconds = int(a["for"][:-1]) * (60 if a["for"].endswith("m") else 1)
        assert seconds <= 120, a["alert"]


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for f in TEST_FILES:
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
                for exp in t.get("exp_alerts") or []:
                    assert set(exp["exp_labels"]) - {"instance", "xid", "collector"} <= CONTRACT_LABELS, exp
    assert firing >= PROMETHEUS_ALERTS, PROMETHEUS_ALERTS - firing
    assert silent >= PROMETHEUS_ALERTS, PROMETHEUS_ALERTS - silent


@pytest.mark.integration
def test_real_prometheus_loads_and_evaluates_the_rules(tmp_path) -> None:
    """A real Prometheus (started by tests/promtools.py) loads the rules and evaluates them without error."""
    from promtools import http, running_prometheus, wait_until

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
    """GPUXidFatal means the same XIDs whether Prometheus or the aggregator raises it."""
    from fabricmon.aggregator.config import DetectionSettings

    text = (REPO / "deploy" / "prometheus" / "fabricmon-alerts.rules.yml").read_text()
    lists = set(re.findall(r'fabricmon_gpu_xid_errors_total\{xid=~"([0-9|]+)"\}', text))
    assert len(lists) == 1, lists
    assert sorted(int(x) for x in lists.pop().split("|")) == sorted(DetectionSettings().xid_fatal)
