"""deploy/prometheus/runbooks.md: every alert either sender raises has a runbook, and every fault runbook says what
to check, the commands, when to escalate and whether and how to drain: a page the on-call cannot act on is noise."""

from __future__ import annotations

import re

from fabricmon.aggregator.incidents import SEVERITY
from support.promtools import REPO

RUNBOOKS = REPO / "deploy" / "prometheus" / "runbooks.md"
PARTS = ("**Check**", "**Commands**", "**Escalate**", "**Drain**")


def _sections() -> dict[str, str]:
    text = RUNBOOKS.read_text()
    heads = list(re.finditer(r"^## (\S+)\n", text, re.M))
    return {m.group(1): text[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
            for i, m in enumerate(heads)}


def test_every_aggregator_alert_has_a_runbook() -> None:
    missing = set(SEVERITY) - set(_sections())
    assert not missing, f"alerts the aggregator sends with no runbook: {sorted(missing)}"


def test_fault_runbooks_say_check_commands_escalate_drain() -> None:
    sections = _sections()
    faults = [a for a in SEVERITY if not a.startswith("Fabricmon")]
    assert len(faults) >= 17
    for alert in faults:
        body = sections[alert]
        for part in PARTS:
            assert f"- {part}:" in body, f"{alert}: no {part} part"
        commands = body.split("- **Commands**:", 1)[1].split("- **Escalate**:", 1)[0]
        if alert not in ("StageImbalance",):
            assert re.search(r"`[a-z][\w-]+ [^`]+`", commands), f"{alert}: no command to run"


def test_the_drain_procedure_is_written_once_and_names_both_schedulers() -> None:
    text = RUNBOOKS.read_text()
    drain = text.split("### Draining a node", 1)[1].split("\n## ", 1)[0]
    assert 'scontrol update NodeName=<node> State=DRAIN Reason="fabricmon:' in drain
    assert "kubectl cordon <node>" in drain and "kubectl drain <node> --ignore-daemonsets" in drain
    assert "never for a leaf, spine, rail or uplink" in drain


def test_the_default_runbook_base_names_the_shipped_runbooks() -> None:
    """runbook_base's default (and so every aggregator alert's runbook_url) points at this file in this
    project's repository, and each alert's anchor is a heading there (it once named a docs/runbooks.md
    that did not exist)."""
    from fabricmon.aggregator.config import AlertmanagerSettings

    base = AlertmanagerSettings().runbook_base
    prefix = "https://github.com/gpu-fabricmon/gpu-fabricmon/blob/main/"
    assert base.startswith(prefix) and base.endswith("#"), base
    assert (REPO / base[len(prefix):-1]).resolve() == RUNBOOKS.resolve()
    anchors = {h.lower() for h in _sections()}
    assert {a.lower() for a in SEVERITY} <= anchors
