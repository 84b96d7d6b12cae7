"""Open incidents across an aggregator restart: persisted, restored, reconciled with Alertmanager.

A restarted aggregator (or shard) used to forget its open incidents: a fault still active was
opened again as a new incident (a new id, sent again), and one that cleared while the process was
down was never resolved by it (Alertmanager expired it at its endsAt).  Now the open incidents
and what was sent for each are written atomically (write a temporary file, fsync, rename) after
every tick that changed one; at start they are restored under their own ids with their evidence
clock at the start and a hold of at least the restart grace (``agents_down.restart_grace``), so:

- a fault that is still there is refreshed by its node's first batches: nothing is sent again
  (Alertmanager still has the alert active; ``AlertmanagerClient.adopt`` resends it as before);
- a fault that cleared while the aggregator was down gets no evidence: resolved once, after the grace;
- an incident that Alertmanager no longer has active (expired while the aggregator was down) is
  sent firing again at once if its fault persists: Alertmanager told the on-call it resolved.

The file is the aggregator's own state: a bad one is logged once with its path and problem and
ignored (the aggregator starts empty, as before), never a reason not to start.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from ..atomic import atomic_write_bytes
from .incidents import Incident, IncidentManager

log = structlog.get_logger("fabricmon.aggregator")

SCHEMA = 1
_FIELDS = ("id", "alertname", "severity", "component_type", "component", "labels", "evidence", "first_seen",
           "last_seen", "ranks", "jobs", "description", "related_to", "absorbed", "version", "hold_s")


def _record(inc: Incident, sent: dict | None) -> dict[str, Any]:
    rec = {k: getattr(inc, k) for k in _FIELDS}
    rec["sent"] = sent
    return rec


def save(path: str | Path, incidents: Iterable[Incident], sent: dict[str, dict]) -> None:
    """Every open incident and the alert last sent for it (``sent``: incident id -> labels/annotations)."""
    body = {"schema": SCHEMA, "incidents": [_record(i, sent.get(i.id)) for i in incidents if i.open]}
    atomic_write_bytes(path, json.dumps(body, sort_keys=True).encode(), fsync=True)


def load(path: str | Path) -> list[tuple[Incident, dict | None]]:
    """The persisted open incidents; [] (and one log line naming the file and problem) when the file is
    missing, unreadable or not this format."""
    p = Path(path)
    if not p.exists():
        return []
    try:
        body = json.loads(p.read_text())
        if not isinstance(body, dict) or body.get("schema") != SCHEMA:
            raise ValueError(f"schema: expected {SCHEMA}, got {body.get('schema') if isinstance(body, dict) else body!r}")
        out = []
        for i, rec in enumerate(body.get("incidents", [])):
            missing = [k for k in _FIELDS if k not in rec]
            if missing:
                raise ValueError(f"incidents[{i}]: missing {', '.join(missing)}")
            out.append((Incident(**{k: rec[k] for k in _FIELDS}), rec.get("sent")))
        return out
    except (OSError, ValueError, TypeError) as exc:
        log.error("incident_state_unusable", file=str(p), error=str(exc), detail="starting without open incidents")
        return []


def restore(manager: IncidentManager, records: list[tuple[Incident, dict | None]], now: float,
            grace_s: float) -> list[Incident]:
    """Open the persisted incidents again under their ids; their evidence clock starts at ``now`` and
    their hold covers the restart grace, so only a fault that stays silent past it resolves."""
    out = []
    for inc, _ in records:
        inc.hold_s = max(inc.hold_s, grace_s)
        manager.restore(inc, now)
        out.append(inc)
    return out


def active_at_alertmanager(url: str, timeout: float = 5.0) -> set[tuple[str, str]] | None:
    """(alertname, component) of the alerts Alertmanager holds active; None when it cannot be asked."""
    q = "/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true"
    try:
        with urllib.request.urlopen(url.rstrip("/") + q, timeout=timeout) as resp:
            alerts = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        log.warning("alertmanager_reconcile_failed", url=url, error=str(exc))
        return None
    return {(a["labels"].get("alertname", ""), a["labels"].get("component", "")) for a in alerts
            if isinstance(a, dict) and isinstance(a.get("labels"), dict)}


def reconcile(restored: list[Incident], active: set[tuple[str, str]] | None) -> tuple[list[Incident], list[Incident]]:
    """(still active at Alertmanager: adopt without sending, gone: send firing again).  When no
    Alertmanager answered, every incident is treated as still active (the resends re-fire it anyway)."""
    if active is None:
        return list(restored), []
    keep = [i for i in restored if (i.alertname, i.component) in active]
    gone = [i for i in restored if (i.alertname, i.component) not in active]
    return keep, gone
