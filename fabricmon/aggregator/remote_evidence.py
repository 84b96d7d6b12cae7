"""Cross-shard explanation: the other shards' open fabric evidence, read from Alertmanager.

A rail-optimized job's rings span its units, so one flaky cable on rail 3 in shard 1 makes every rank
of rail 3 late in communication, in every shard.  The shards that hold those ranks but not the cable
see comm-late stragglers with clean counters on their own rail and, alone, would page StragglerRank
for a fault another shard already alerts on.  Each shard therefore learns the OTHER shards' open
fabric evidence incidents (``RemoteIncident``) and the correlator lets its comm-late groups with no
local evidence ride on a remote incident of the same rail (``CrossShard``).

Source: Alertmanager's active alerts (``GET /api/v2/alerts``), not the peers' /api/incidents.  Every
shard already has the Alertmanager URLs in its config (no shard map with HTTP addresses is needed,
and none exists for the gRPC-only shard map agents use); Alertmanager holds what every shard sent,
including a shard that was just killed (its alerts stay active until their endsAt), so a restart of
the faulty shard does not make the others page; and one GET answers for all peers.  The answer is
filtered to this cluster (a ``filter`` matcher), to the aggregator's own alerts (the ``incident_id``
annotation, which the Prometheus fallback rules do not set), to fabric evidence alert names, and to
components on units this shard does not own.

Polled off the tick thread (``AlertmanagerEvidence``: its own thread, a timeout per request, a size
bound on the answer and on the incidents kept); the tick only reads the last snapshot.  A snapshot
older than ``stale_after`` explains nothing: an unreachable Alertmanager makes stragglers page again
(after the grace), it never hides them for good.  Failures are counted and logged once per outage.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..components import Component, Kind
from ..topology import Topology
from .deadline_http import exchange
from .incident_store import component_of
from .remediation.remediator import remote_actions_of
from .verdicts import ALERT_LLR, FIRE, WAIT

log = structlog.get_logger("fabricmon.aggregator.remote_evidence")

# kinds of component whose evidence slows a rail's ring (a NIC's or a leaf's fault; not a GPU's); and
# uplinks (no rail: they explain no straggler here), whose other shards' alerts decide FabricSpineDegraded
# with this shard's own (switch_side.fold_spines)
REMOTE_EVIDENCE_ALERTS = frozenset(a for a in ALERT_LLR if not a.startswith(("GPU", "NVLink")))
REMOTE_KINDS = frozenset({Kind.LINK, Kind.NIC, Kind.LEAF, Kind.UPLINK})
MAX_BODY_BYTES = 16 * 1024 * 1024  # an Alertmanager answer larger than this is not read (bounded memory)
MAX_INCIDENTS = 4096  # remote incidents kept per snapshot (bounded work per tick)
QUERY = "/api/v2/alerts?active=true&silenced=false&inhibited=true&unprocessed=true"


@dataclass(frozen=True, slots=True)
class RemoteIncident:
    """An open fabric evidence alert another shard sent."""

    alertname: str
    component: Component
    rail: int | None
    units: frozenset[int]
    shard: str  # the sender's shard (its ``shard`` annotation), "" when it sent none
    incident_id: str

    def name(self) -> str:
        """``FabricLinkErrors on n1/mlx5_3/1 (shard units 16-31)``: what an operator reads."""
        where = f"shard {self.shard}" if self.shard else \
            "unit " + ",".join(str(u) for u in sorted(self.units)) + ", another shard"
        return f"{self.alertname} on {self.component.id} ({where})"


def leaf_units(topo: Topology) -> dict[str, frozenset[int]]:
    """Leaf name -> the units whose nodes are cabled to it."""
    out: dict[str, set[int]] = {}
    for n in topo.nodes.values():
        for nic in (*n.nics, *n.unbound):
            leaf = nic.leaf if nic.leaf is not None else topo.leaf_of(n.name, nic.rail)
            out.setdefault(leaf, set()).add(n.unit)
    return {k: frozenset(v) for k, v in out.items()}


def _rail_of(topo: Topology, c: Component) -> int | None:
    if c.rail is not None:
        return c.rail
    if c.node in topo.nodes and c.device:
        nic = topo.nic(c.node, c.device)
        if nic is not None:
            return nic.rail
    return None


def parse_active(alerts: object, *, cluster: str, topo: Topology, own_units: frozenset[int],
                 leaves: dict[str, frozenset[int]] | None = None,
                 limit: int = MAX_INCIDENTS) -> tuple[list[RemoteIncident], int]:
    """(the other shards' fabric evidence incidents in Alertmanager's ``GET /api/v2/alerts`` answer,
    how many entries were malformed).  Pure: no I/O.  A component this shard owns, or whose units the
    topology does not know, is never remote (an unknown one explains nothing: a page beats a guess)."""
    if not isinstance(alerts, list):
        return [], 1
    leaves = leaf_units(topo) if leaves is None else leaves
    out: list[RemoteIncident] = []
    bad = 0
    seen: set[tuple[str, str]] = set()
    for a in alerts:
        if len(out) >= limit:
            break
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
            bad += 1
            continue
        lab, ann = a["labels"], a.get("annotations") or {}
        if not isinstance(ann, dict) or not ann.get("incident_id"):
            continue  # not the aggregator's (a Prometheus fallback rule, another tool)
        alertname = lab.get("alertname", "")
        if alertname not in REMOTE_EVIDENCE_ALERTS or (cluster and lab.get("cluster", "") != cluster):
            continue
        ctype, cid = str(lab.get("component_type", "")), str(lab.get("component", ""))
        if (alertname, cid) in seen:
            continue
        try:
            c = component_of(ctype, cid, {k: str(v) for k, v in lab.items()})
        except ValueError:
            bad += 1
            continue
        if c.kind not in REMOTE_KINDS:
            continue
        if c.kind is Kind.LEAF:
            units = leaves.get(c.id, frozenset())
        elif c.kind is Kind.UPLINK:
            units = leaves.get(c.leaf, frozenset())  # named by its leaf end: that leaf's shard holds it
        else:
            spec = topo.nodes.get(c.node)
            units = frozenset((spec.unit,)) if spec is not None else frozenset()
        if not units or units & own_units:
            continue
        seen.add((alertname, cid))
        out.append(RemoteIncident(alertname, c, _rail_of(topo, c), units, str(ann.get("shard", "")),
                                  str(ann["incident_id"])))
    return out, bad


def fetch_alerts(url: str, cluster: str, timeout: float) -> object:
    """One GET of Alertmanager's active alerts (filtered to ``cluster``); raises OSError/ValueError."""
    q = QUERY
    if cluster:
        q += "&" + urllib.parse.urlencode({"filter": f'cluster="{cluster}"'})
    # the whole exchange within ``timeout`` (a 200 then a byte every 2 s held the poll: issue 35)
    _, body = exchange(url.rstrip("/").removesuffix("/api/v2/alerts") + q, deadline_s=timeout,
                       max_bytes=MAX_BODY_BYTES)
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("answer nested too deep to be alerts") from None


@dataclass
class _Stats:
    polls: dict[str, int] = field(default_factory=lambda: {"ok": 0, "error": 0})
    malformed: int = 0
    last_ok_wall: float = 0.0


class AlertmanagerEvidence:
    """Polls the Alertmanagers (the first that answers wins) every ``poll_s`` in its own thread."""

    def __init__(self, urls: Sequence[str], *, cluster: str, topo: Topology, own_units: frozenset[int],
                 poll_s: float = 5.0, timeout: float = 3.0,
                 fetch: Callable[[str, str, float], object] = fetch_alerts,
                 wall: Callable[[], float] = time.monotonic, shard: str = "") -> None:
        self.urls = list(urls)
        self.shard = shard  # this shard's name: its own remediation actions are counted locally
        self._actions: tuple[tuple[float, str], ...] = ()
        self.cluster = cluster
        self.topo = topo
        self.own_units = own_units
        self.poll_s = poll_s
        self.timeout = timeout
        # a snapshot older than this explains nothing: the source is gone, stragglers page again
        self.stale_after = 3 * poll_s + 2 * timeout
        self._fetch = fetch
        self._wall = wall
        self._lock = threading.Lock()
        self._incidents: tuple[RemoteIncident, ...] = ()
        self._at: float | None = None
        self._leaves = leaf_units(topo)
        self.stats = _Stats()
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """One poll of the Alertmanagers; True when one answered."""
        errors = []
        for url in self.urls:
            try:
                body = self._fetch(url, self.cluster, self.timeout)
            except (OSError, ValueError) as exc:
                errors.append(f"{url}: {exc}")
                continue
            incs, bad = parse_active(body, cluster=self.cluster, topo=self.topo, own_units=self.own_units,
                                     leaves=self._leaves)
            acts = tuple(remote_actions_of(body, self.shard))
            with self._lock:
                self._incidents, self._at = tuple(incs), self._wall()
                self._actions = acts
                self.stats.polls["ok"] += 1
                self.stats.malformed += bad
                self.stats.last_ok_wall = time.time()
            if self._failing:
                log.info("remote_evidence_recovered", url=url, remote_incidents=len(incs))
                self._failing = False
            return True
        with self._lock:
            self.stats.polls["error"] += 1
        if not self._failing:  # once per outage: a down Alertmanager would log every few seconds
            log.warning("remote_evidence_unreachable", errors=errors[:4],
                        metric="fabricmon_remote_evidence_polls_total{result=\"error\"}",
                        effect="other shards' faults cannot explain this shard's comm-late stragglers: "
                               "they page after the grace")
            self._failing = True
        return False

    def incidents(self) -> tuple[RemoteIncident, ...]:
        """The last snapshot; () once it is older than ``stale_after``."""
        with self._lock:
            if self._at is None or self._wall() - self._at > self.stale_after:
                return ()
            return self._incidents

    def remote_actions(self) -> tuple[tuple[float, str], ...]:
        """(sample time, node) of the other shards' remediation actions in the last read: the breaker counts
        them cluster-wide (the remediator keeps each until it leaves the window, stale or not)."""
        with self._lock:
            return self._actions

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"polls": dict(self.stats.polls), "malformed": self.stats.malformed,
                    "last_ok_wall": self.stats.last_ok_wall, "incidents": len(self._incidents)
                    if self._at is not None and self._wall() - self._at <= self.stale_after else 0}

    def start(self) -> None:
        if self._thread is not None or not self.urls:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="remote-evidence", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout * len(self.urls) + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the poller must not die: a dead one would blind silently
                log.exception("remote_evidence_poll_failed")
            self._stop.wait(self.poll_s)


@dataclass(frozen=True, slots=True)
class Explained:
    """A comm-late straggler group of this shard that rides on a remote incident."""

    job: str
    rail: int
    group: Component
    ranks: tuple[int, ...]
    remote: RemoteIncident


class CrossShard:
    """Per tick: which comm-late groups without local evidence a remote incident explains, and the
    grace before one no remote incident explains may open (the remote incident may open after the
    local stragglers are scored).  The grace runs per (job, rail) from the first tick it was seen
    unexplained; an explained group starts it again when its explanation goes away."""

    def __init__(self) -> None:
        self.unexplained_since: dict[tuple[str, int], float] = {}
        self.explained: list[Explained] = []
        self.explained_total = 0  # groups that became explained (a transition count)
        self.waiting = 0  # groups waiting out the grace in the last tick
        # (alertname, component id) of a remote incident -> the tick it first explained a group here
        self.first_explained: dict[tuple[str, str], float] = {}
        self._was_explained: set[tuple[str, int]] = set()
        self._seen: set[tuple[str, int]] = set()
        self._remote: dict[int, list[RemoteIncident]] = {}
        self._now = 0.0
        self._grace_s = 0.0

    def begin(self, now: float, remote: Iterable[RemoteIncident], grace_s: float) -> None:
        self._now, self._grace_s = now, grace_s
        by_rail: dict[int, list[RemoteIncident]] = {}
        for r in remote:
            if r.rail is not None:
                by_rail.setdefault(r.rail, []).append(r)
        self._remote = by_rail
        self.explained = []
        self.waiting = 0
        self._seen = set()

    def judge(self, job: str, rail: int, group: Component, ranks: tuple[int, ...]) -> RemoteIncident | str:
        """The remote incident that explains the group, else FIRE (grace over) or WAIT."""
        key = (job, rail)
        self._seen.add(key)
        hits = self._remote.get(rail)
        if hits:
            # the strongest explanation first: a link down over a leaf degraded over errors
            best = min(hits, key=lambda r: (-ALERT_LLR.get(r.alertname, 0.0), r.component.id))
            self.unexplained_since.pop(key, None)
            self.explained.append(Explained(job, rail, group, ranks, best))
            return best
        since = self.unexplained_since.setdefault(key, self._now)
        if self._now - since < self._grace_s:
            self.waiting += 1
            return WAIT
        return FIRE

    def end(self) -> None:
        """Forget the groups not seen this tick (their grace starts again if they come back)."""
        for key in list(self.unexplained_since):
            if key not in self._seen:
                del self.unexplained_since[key]
        remote_now = {(e.remote.alertname, e.remote.component.id) for e in self.explained}
        for k in list(self.first_explained):
            if k not in remote_now:
                del self.first_explained[k]
        for k in remote_now:
            self.first_explained.setdefault(k, self._now)
        now_explained = {(e.job, e.rail) for e in self.explained}
        self.explained_total += len(now_explained - self._was_explained)
        self._was_explained = now_explained

    def stats(self) -> dict[str, object]:
        """For /metrics: ranks explained now per remote alertname, groups waiting, transitions counted."""
        ranks: dict[str, int] = {}
        for e in self.explained:
            ranks[e.remote.alertname] = ranks.get(e.remote.alertname, 0) + len(e.ranks)
        return {"explained_ranks": ranks, "explained_groups": len(self.explained), "waiting": self.waiting,
                "explained_total": self.explained_total}


__all__ = ["AlertmanagerEvidence", "CrossShard", "Explained", "RemoteIncident", "fetch_alerts", "parse_active"]
