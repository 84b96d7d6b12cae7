"""Open incidents across an aggregator restart: persisted, restored, reconciled with Alertmanager.

A restarted aggregator (or shard) used to forget its open incidents: a fault still active was
opened again as a new incident (a new id, sent again), and one that cleared while the process was
down was never resolved by it (Alertmanager expired it at its endsAt).  Now the open incidents
and what was sent for each are written atomically (write a temporary file, fsync, rename) after
every tick that changed one; at start they are restored under their own ids with their evidence
clock at the start, and the engine's resume check (resume_check.py) decides what is sent:

- a fault that is still there is refreshed by its node's first batches: nothing is sent again
  when Alertmanager still has the alert active (``AlertmanagerClient.adopt`` resends it as before),
  and it is sent firing when Alertmanager no longer has it (it told the on-call it resolved);
- a fault that cleared while the aggregator was down gets no evidence in its node's first batches:
  nothing is sent firing, it is resolved once.

The file is the aggregator's own state and never a reason not to start or to stop (issue 35): a file
that does not parse is logged once with its path and problem and ignored (the aggregator starts
empty); a record whose field has the wrong type, or whose id does not parse, is skipped (logged and
counted), not the file; nesting and size are bounded.  A save that fails (disk full, a directory or
a read-only path where the file goes) is logged and counted (``fabricmon_state_save_failures_total``,
alert FabricmonStateSaveFailing) and the alert of that change is still sent.  Reconciling with
Alertmanager at start is bounded in total time and size and takes any answer: what it cannot read
it treats as no answer.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from .. import components as comp
from ..atomic import atomic_write_bytes
from ..components import Component, Kind
from .deadline_http import exchange
from .incidents import Incident, IncidentManager

log = structlog.get_logger("fabricmon.aggregator")

SCHEMA = 1
_FIELDS = ("id", "alertname", "severity", "component_type", "component", "labels", "evidence", "first_seen",
           "last_seen", "ranks", "jobs", "description", "related_to", "absorbed", "version", "hold_s")
MAX_STATE_BYTES = 64 * 1024 * 1024  # ~100,000 open incidents; a larger file is not this aggregator's


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_time(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strs(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# Each persisted field and what it must be: the store is an input edge, and an Incident with a str
# hold_s raised TypeError at start, every start (issue 35).
FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "id": (_is_str, "a string"), "alertname": (_is_str, "a string"), "severity": (_is_str, "a string"),
    "component_type": (_is_str, "a string"), "component": (_is_str, "a string"),
    "labels": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
               "an object of strings"),
    "evidence": (_strs, "a list of strings"), "first_seen": (_is_time, "a finite number >= 0"),
    "last_seen": (_is_time, "a finite number >= 0"),
    "ranks": (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "a list of integers"),
    "jobs": (_strs, "a list of strings"), "description": (_is_str, "a string"), "related_to": (_is_str, "a string"),
    "absorbed": (_strs, "a list of strings"), "version": (_is_int, "an integer"),
    "hold_s": (_is_time, "a finite number >= 0"),
}


def _record(inc: Incident, sent: dict[str, Any] | None) -> dict[str, Any]:
    rec = {k: getattr(inc, k) for k in _FIELDS}
    rec["sent"] = sent
    if inc.remediation:  # optional: what remediation decided about it (older files have none)
        rec["remediation"] = inc.remediation
    return rec


def _entries(v: object) -> list[dict[str, Any]]:
    """An incident's persisted remediation entries: objects of strings, numbers and lists of strings; any
    other shape is dropped (the incident is restored without them)."""
    if not isinstance(v, list):
        return []
    ok = (str, int, float, list)
    return [dict(e) for e in v[:64] if isinstance(e, dict) and all(isinstance(k, str) and isinstance(x, ok)
                                                                    for k, x in e.items())]


def save(path: str | Path, incidents: Iterable[Incident], sent: dict[str, dict[str, Any]],
         extra: dict[str, Any] | None = None) -> None:
    """Every open incident and the alert last sent for it (``sent``: incident id -> labels/annotations);
    ``extra``: further top-level sections (``remediation``: the breaker and what it did to nodes)."""
    body: dict[str, Any] = {**(extra or {}), "schema": SCHEMA,
                            "incidents": [_record(i, sent.get(i.id)) for i in incidents if i.open]}
    # the directory may not exist yet (check-config allows a creatable one): only this process reads it
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(body, sort_keys=True).encode(), fsync=True)


def record_problem(rec: object) -> str | None:
    """None for a record load can restore; else the first field that is missing or of the wrong type."""
    if not isinstance(rec, dict):
        return f"expected an object, got {type(rec).__name__}"
    missing = [k for k in _FIELDS if k not in rec]
    if missing:
        return f"missing {', '.join(missing)}"
    for k, (ok, what) in FIELD_TYPES.items():
        if not ok(rec[k]):
            return f"{k}: expected {what}, got {repr(rec[k])[:40]}"
    if rec.get("sent") is not None and not isinstance(rec["sent"], dict):
        return f"sent: expected an object or null, got {type(rec['sent']).__name__}"
    try:
        component_of(rec["component_type"], rec["component"], rec["labels"])
    except ValueError as exc:
        return str(exc)
    return None


def read_state(path: str | Path) -> tuple[list[tuple[Incident, dict[str, Any] | None]], int]:
    """(the persisted open incidents, the records skipped).  A file that is missing, unreadable, too
    large, too deep or not this format gives no records (one log line naming the file and problem); a
    record that does not check out is skipped (one log line naming it and its field), not the file."""
    p = Path(path)
    if not p.exists():
        return [], 0
    try:
        if p.stat().st_size > MAX_STATE_BYTES:
            raise ValueError(f"{p.stat().st_size} bytes, at most {MAX_STATE_BYTES}")
        try:
            body = json.loads(p.read_text())
        except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
            raise ValueError("nested too deep to be this format") from None
        if not isinstance(body, dict) or body.get("schema") != SCHEMA:
            raise ValueError(f"schema: expected {SCHEMA}, got "
                             f"{body.get('schema') if isinstance(body, dict) else body!r}"[:120])
        records = body.get("incidents", [])
        if not isinstance(records, list):
            raise ValueError(f"incidents: expected a list, got {type(records).__name__}")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        log.error("incident_state_unusable", file=str(p), error=str(exc), detail="starting without open incidents")
        return [], 0
    out = []
    skipped = 0
    for i, rec in enumerate(records):
        problem = record_problem(rec)
        if problem is not None:
            skipped += 1
            log.error("incident_state_record_skipped", file=str(p), error=f"incidents[{i}].{problem}")
            continue
        inc = Incident(**{k: rec[k] for k in _FIELDS})
        inc.remediation = _entries(rec.get("remediation"))
        out.append((inc, rec.get("sent")))
    return out, skipped


UNREADABLE = "unreadable"  # read_section: the file is there but does not parse


def read_section(path: str | Path, key: str) -> object:
    """The top-level ``key`` of the state file: None when the file or the key is absent, ``UNREADABLE`` when
    the file is there but cannot be read as this format (the caller decides what that means for it)."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        if p.stat().st_size > MAX_STATE_BYTES:
            return UNREADABLE
        body = json.loads(p.read_text())
    except (OSError, ValueError, RecursionError):
        return UNREADABLE
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        return UNREADABLE
    return body.get(key)


def load(path: str | Path) -> list[tuple[Incident, dict[str, Any] | None]]:
    """The persisted open incidents that check out (read_state without the count)."""
    return read_state(path)[0]


class StateSaver:
    """The runtime's ``on_changed`` hook that persists the open incidents, and never raises: a save that
    fails is logged (once per distinct error, and when it recovers) and counted, and the next change
    tries again.  ``skipped``: the records the load at start skipped."""

    def __init__(self, path: str, open_incidents: Callable[[], list[Incident]],
                 sent_for: Callable[[list[Incident]], dict[str, dict[str, Any]]], skipped: int = 0,
                 extra: Callable[[], dict[str, Any]] | None = None) -> None:
        self.path = path
        self.extra = extra  # further sections saved with the incidents (the remediation state)
        self._lock = threading.Lock()  # the tick and the remediation state save through one hook
        self._open = open_incidents
        self._sent_for = sent_for
        self.failures_total = 0
        self.skipped_total = skipped
        self.last_error = ""

    def __call__(self, changed: list[Incident], now: float) -> None:
        try:
            with self._lock:
                open_ = self._open()
                save(self.path, open_, self._sent_for(open_), self.extra() if self.extra is not None else None)
        except (OSError, ValueError, TypeError) as exc:  # disk full, a directory, read-only, unencodable
            self.failures_total += 1
            if str(exc) != self.last_error:
                log.error("incident_state_save_failed", file=self.path, error=str(exc),
                          detail="open incidents are not persisted until a save succeeds")
            self.last_error = str(exc)
            return
        if self.last_error:
            log.info("incident_state_save_recovered", file=self.path)
            self.last_error = ""

    def stats(self) -> dict[str, int]:
        return {"state_save_failures_total": self.failures_total, "state_records_skipped_total": self.skipped_total}


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


# The Prometheus fallback rules' alerts carry this label (deploy/prometheus/mixin.py): they are not this
# aggregator's, and one of them active says nothing of whether Alertmanager still holds ours.
FALLBACK_SENDER = ("sender", "prometheus")
RECONCILE_MAX_BYTES = 16 * 1024 * 1024  # Alertmanager's answer for ~20,000 active alerts


def active_at_alertmanager(url: str, timeout: float = 5.0) -> set[tuple[str, str]] | None:
    """(alertname, component) of the aggregator's alerts Alertmanager holds active (the fallback rules'
    are left out); None when it cannot be asked or its answer is no list of alerts.  The whole exchange
    ends within ``timeout`` (deadline_http), and entries that are not an alert with string labels are
    skipped."""
    q = "/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true"
    try:
        _, body = exchange(url.rstrip("/") + q, deadline_s=timeout, max_bytes=RECONCILE_MAX_BYTES)
        alerts = json.loads(body)
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("alertmanager_reconcile_failed", url=url, error=str(exc)[:300])
        return None
    if not isinstance(alerts, list):
        log.warning("alertmanager_reconcile_failed", url=url, error=f"expected a list, got {type(alerts).__name__}")
        return None
    key, fallback = FALLBACK_SENDER
    out = set()
    for a in alerts:
        labels = a.get("labels") if isinstance(a, dict) else None
        if not isinstance(labels, dict):
            continue
        name, cid = labels.get("alertname", ""), labels.get("component", "")
        if labels.get(key) == fallback:
            continue
        if isinstance(name, str) and isinstance(cid, str):
            out.add((name, cid))
    return out


def reconcile_with(urls: Iterable[str], per_url_s: float, budget_s: float,
                   ask: Callable[[str, float], set[tuple[str, str]] | None] = active_at_alertmanager,
                   ) -> set[tuple[str, str]] | None:
    """The first Alertmanager's answer, each asked within ``per_url_s`` and all within ``budget_s``: the
    listeners start after this, so it must end whatever the Alertmanagers do."""
    end = time.monotonic() + budget_s
    for url in urls:
        left = end - time.monotonic()
        if left <= 0.05:
            log.warning("alertmanager_reconcile_failed", url=url, error=f"no time left of {budget_s:g} s")
            return None
        active = ask(url, min(per_url_s, left))
        if active is not None:
            return active
    return None


def reconcile(restored: list[Incident], active: set[tuple[str, str]] | None) -> tuple[list[Incident], list[Incident]]:
    """(still active at Alertmanager: adopt without sending, gone: send firing again).  When no
    Alertmanager answered, every incident is treated as still active (the resends re-fire it anyway)."""
    if active is None:
        return list(restored), []
    keep = [i for i in restored if (i.alertname, i.component) in active]
    gone = [i for i in restored if (i.alertname, i.component) not in active]
    return keep, gone
