"""bench_soak.py's judgement of its own run, as data in and reasons out (pure: no I/O).

What an on-call engineer would have been paged for during a soak in which no node is really down
and every fault stays active until the end:

- ``FabricmonAgentDown`` notifications: reconnecting nodes after a shard restart paged as down;
- an alert resolved and then fired again (same alert name and component): a flap that a restart
  or a CPU burst caused, two pages for one fault;
- the first fault after the restart reaching the webhook later than the usual delay plus the
  restarted shard's start-up allowance.

``verdict_line`` gives the one line the run ends with: ``soak verdict: ok ...`` or
``soak verdict: FAIL <why>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# A restarted shard parses its topology and its streams reconnect before it can see anything:
# the first fault after a restart may be this much later than the usual delay.
RESTART_STARTUP_ALLOWANCE_S = 60.0


def _labels(alert: dict) -> dict:
    return alert.get("labels") or {}


def agent_down_pages(alerts: Iterable[tuple[float, str, dict]]) -> list[str]:
    """Components of FabricmonAgentDown notifications that fired (no node is down in a soak)."""
    return sorted({_labels(a).get("component", "?") for _, st, a in alerts
                   if st == "firing" and _labels(a).get("alertname") == "FabricmonAgentDown"})


def refired(alerts: Sequence[tuple[float, str, dict]]) -> list[str]:
    """``alertname component`` of every alert the webhook saw resolved and then firing again."""
    seen_resolved: set[tuple[str, str]] = set()
    out: set[tuple[str, str]] = set()
    for _, st, a in sorted(alerts, key=lambda x: x[0]):
        key = (_labels(a).get("alertname", "?"), _labels(a).get("component", "?"))
        if st == "resolved":
            seen_resolved.add(key)
        elif st == "firing" and key in seen_resolved:
            out.add(key)
    return [f"{n} {c}" for n, c in sorted(out)]


def verdict_line(reasons: Sequence[str], summary: str) -> str:
    return f"soak verdict: FAIL {'; '.join(reasons)}" if reasons else f"soak verdict: ok {summary}"
