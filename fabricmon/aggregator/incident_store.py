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
import re
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from .. import components as comp
from ..atomic import atomic_write_bytes
from ..components import Component, Kind
from .incidents import Incident, IncidentManager

log = structlog.get_logger("fabricmon.aggregator")

SCHEMA = 1
_FIELDS = ("id", "alertname", "severity", "component_type", "component", "labels", "evidence", "first_seen",
           "last_seen", "ranks", "jobs", "description", "related_to", "absorbed", "version", "hold_s")


def _record(inc: Incident, sent: dict[str, Any] | None) -> dict[str, Any]:
    rec = {k: getattr(inc, k) for k in _FIELDS}
    rec["sent"] = sent
    return rec


def save(path: str | Path, incidents: Iterable[Incident], sent: dict[str, dict[str, Any]]) -> None:
    """Every open incident and the alert last sent for it (``sent``: incident id -> labels/annotations)."""
    body = {"schema": SCHEMA, "incidents": [_record(i, sent.get(i.id)) for i in incidents if i.open]}
    # the directory may not exist yet (check-config allows a creatable one): only this process reads it
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(body, sort_keys=True).encode(), fsync=True)


def load(path: str | Path) -> list[tuple[Incident, dict[str, Any] | None]]:
    """The persisted open incidents; [] (and one log line naming the file and problem) when the file is
    missing, unreadable or not this format."""
    p = Path(path)
    if not p.exists():
        return []
    try:
        body = json.loads(p.read_text())
        if not isinstance(body, dict) or body.get("schema") != SCHEMA:
            raise ValueError(f"schema: expected {SCHEMA}, got "
                             f"{body.get('schema') if isinstance(body, dict) else body!r}")
        out = []
        for i, rec in enumerate(body.get("incidents", [])):
            missing = [k for k in _FIELDS if k not in rec]
            if missing:
                raise ValueError(f"incidents[{i}]: missing {', '.join(missing)}")
            try:
                component_of(rec["component_type"], rec["component"], rec["labels"])
            except ValueError as exc:
                raise ValueError(f"incidents[{i}].{exc}") from None
            out.append((Incident(**{k: rec[k] for k in _FIELDS}), rec.get("sent")))
        return out
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.error("incident_state_unusable", file=str(p), error=str(exc), detail="starting without open incidents")
        return []


_GPU = re.compile(r"gpu(\d+)")
_NVLINK = re.compile(r"nvlink(\d+)")
_RAIL = re.compile(r"rail(\d+)")
_STAGE = re.compile(r"(.+)/stage(\d+)")


def component_of(component_type: str, component: str, labels: dict[str, str]) -> Component:
    """The typed identity of a stored incident: this file is an input edge, the one place its ids are parsed
    (DESIGN "Component ids").  Node, device and indexes are filled so what the correlator derives from an
    open key (a link's NIC: ``Component.parent``) is the component itself, not ``/``; rail and leaf come
    back from the incident's labels.  ValueError for an id its type does not spell."""
    try:
        kind = Kind(component_type)
    except ValueError:
        raise ValueError(f"component_type: unknown {component_type!r}") from None
    rail_label = labels.get("rail", "")
    rail = int(rail_label) if rail_label.isdigit() else None
    leaf = labels.get("leaf", "")
    parts = component.split("/")
    if kind is Kind.LINK and len(parts) == 3 and all(parts):
        return comp.link(parts[0], parts[1], parts[2], rail, leaf)
    if kind is Kind.NIC and len(parts) == 2 and all(parts):
        return comp.nic(parts[0], parts[1], rail, leaf)
    if kind is Kind.GPU and len(parts) == 2 and (g := _GPU.fullmatch(parts[1])):
        return comp.gpu(parts[0], int(g[1]), rail, leaf)
    if kind is Kind.NVLINK and len(parts) == 3 and (g := _GPU.fullmatch(parts[1])) \
            and (n := _NVLINK.fullmatch(parts[2])):
        return comp.nvlink(parts[0], int(g[1]), int(n[1]), rail, leaf)
    if kind is Kind.NODE and len(parts) == 1 and component:
        return comp.node(component)
    if kind is Kind.RAIL and (r := _RAIL.fullmatch(component)):
        return comp.rail(int(r[1]))
    if kind is Kind.LEAF and len(parts) == 1 and component:
        return comp.leaf(component, rail)
    if kind is Kind.SPINE and len(parts) == 1 and component:
        return comp.spine(component)
    if kind is Kind.UPLINK and len(parts) == 2 and parts[0] and parts[1][:1] == "p" and parts[1][1:].isdigit():
        return comp.uplink(parts[0], parts[1][1:], labels.get("spine", ""), labels.get("spine_port", ""))
    if kind is Kind.CONFIG and component == "topology":
        return Component(Kind.CONFIG, "topology")  # FabricmonUnknownNodes: the topology itself
    if kind is Kind.CONFIG and 1 <= len(parts) <= 2 and all(parts):
        return comp.config(parts[0], parts[1] if len(parts) == 2 else "", rail, leaf)
    if kind is Kind.JOB and component:
        st = _STAGE.fullmatch(component)
        return comp.job(st[1], int(st[2])) if st else comp.job(component)
    raise ValueError(f"component: {component!r} is no {kind.value} id")


def restore(manager: IncidentManager, records: list[tuple[Incident, dict[str, Any] | None]], now: float,
            grace_s: float) -> list[Incident]:
    """Open the persisted incidents again under their ids; their evidence clock starts at ``now`` and
    their hold covers the restart grace, so only a fault that stays silent past it resolves."""
    out = []
    for inc, _ in records:
        inc.hold_s = max(inc.hold_s, grace_s)
        manager.restore(inc, component_of(inc.component_type, inc.component, inc.labels), now)
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
