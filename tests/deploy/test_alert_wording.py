"""One wording per alert across both senders (issue 36): an alert that the aggregator and the Prometheus
rules both send has one summary, so a page reads the same whichever sent it (the fallback rules take over
while the aggregator is down).  The rules name the component with ``{{ $labels.component }}``, the
aggregator with ``{component}``."""

from __future__ import annotations

import yaml

from fabricmon.aggregator.incidents import SUMMARY
from support.promtools import REPO


def _rule_summaries() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in sorted((REPO / "deploy" / "prometheus").glob("*.rules.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    out.setdefault(r["alert"], set()).add(r["annotations"]["summary"])
    return out


def test_alerts_both_senders_send_have_one_summary() -> None:
    rules = _rule_summaries()
    both = sorted(set(rules) & set(SUMMARY))
    assert len(both) >= 10, both  # the fabric, NVLink, XID, cable and agent alerts
    differ = {a: (SUMMARY[a], sorted(rules[a])) for a in both
              if {s.replace("{{ $labels.component }}", "{component}") for s in rules[a]} != {SUMMARY[a]}}
    assert not differ, f"worded differently by the aggregator and the Prometheus rules: {differ}"
