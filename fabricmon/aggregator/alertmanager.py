"""Alertmanager client: POST /api/v2/alerts to every configured Alertmanager (HA: all of them).

A URL whose host is a name (a Kubernetes headless Service) is expanded to every address it resolves to,
re-resolved every ``resolve_seconds`` (am_peers.py): every replica gets every alert, and a replica that
appears gets the active alerts at once.

Decoupled from ``Engine.tick``: the service hands over the incidents that
changed (``submit``), background threads deliver.  Each URL has its own
bounded queue, backoff and sender thread, so one Alertmanager being down (even
one that accepts the connection and never answers, holding a POST for the
whole timeout) delays nobody else: the Alertmanager HA cluster dedups.
Transitions (open, update, resolve) are never coalesced away; periodic
re-sends of active alerts are (one pending re-send per alert and URL).  When
a queue is full the oldest re-send goes first, and only if none is left the
oldest transition (counted as ``result="dropped"``).  Alertmanager dedups
on the label set, so an alert delivered twice after a retry is one alert.

Failures: a 5xx, a timeout or a refused connection is transient: the batch
stays queued and is retried with backoff.  A 4xx (other than 408 and 429) is
permanent: resending the same alert gets the same answer, so retrying it would
block that Alertmanager's queue forever.  Alertmanager stores the valid alerts
of a batch and answers 400 for the rest, so a rejected batch is re-posted one
alert at a time to find the bad ones; each is logged with Alertmanager's
reason, counted as ``result="rejected"`` and not re-sent (a later transition of
the same incident is tried afresh).  A 3xx is never followed: urllib would follow a
301/302/303 for a POST as a GET without the body, the redirect target (an http-to-https
load balancer) answers 200 and every alert is lost while ``success`` rises.  A redirect is
an error, counted (``result="error"``), logged with its Location, and retried like a 5xx
(the alerts stay queued until the URL is corrected).

Times: incidents run on sample time (the agents' clocks; in simulation the
simulated clock, which starts at a real epoch).  ``startsAt`` is the sample
time the incident opened, mapped to RFC3339 directly.  An active alert's
``endsAt`` is ``max(sample now, wall now) + 4 x resend interval`` so
Alertmanager never auto-resolves an alert we keep re-sending, even when the
sample clock lags the wall clock; a resolved alert's ``endsAt`` is the sample
time it resolved, but never later than the wall clock (Alertmanager treats
an ``endsAt`` in its future as still firing).
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from datetime import datetime
from http.client import HTTPMessage
from typing import IO, Any

import structlog

from ..compat import UTC
from .am_peers import PeerSet, Resolver, expandable, system_resolver
from .cost import impact_sentence
from .deadline_http import exchange
from .incidents import Incident

log = structlog.get_logger("fabricmon.aggregator.alertmanager")

# spine: FabricSpineDegraded hides only its own spine's uplinks (`equal: [cluster, spine]`; a label
# missing on both sides counts as equal, so without it one spine's alert would hide every uplink);
# switch_end: a host cable's swept switch end, which FabricmonAgentDown of its host does not hide
LABEL_KEYS = ("node", "rail", "leaf", "spine", "spine_port", "switch_end", "gpu", "hpc_job", "rank", "job_id",
              "lateness", "cluster")
RESULTS = ("success", "error", "rejected", "dropped")  # fabricmon_alerts_sent_total{result}
OK, RETRY, REJECTED = "ok", "retry", "rejected"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse every redirect: urlopen then raises HTTPError with the 3xx status."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: HTTPMessage, newurl: str) -> None:  # urllib's hook
        return None


MAX_ANSWER_BYTES = 1 << 20  # Alertmanager answers a POST with an empty body or a short error


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Url:
    __slots__ = ("base", "url", "queue", "pending_resend", "next_try", "backoff", "last_error", "retired")

    def __init__(self, url: str) -> None:
        self.base = url  # as configured or expanded: the key the peer set names it by
        self.retired = False  # its address left the peer set: its sender thread ends
        self.url = url.rstrip("/")
        if not self.url.endswith("/api/v2/alerts"):
            self.url += "/api/v2/alerts"
        self.queue: deque[tuple[str, str, dict[str, Any]]] = deque()  # (kind, id, snapshot)
        self.pending_resend: set[str] = set()
        self.next_try = 0.0
        self.backoff = 0.5
        self.last_error = ""


def remediation_text(inc: Incident) -> str:
    if not inc.remediation:
        return ""
    e = inc.remediation[-1]
    return f"{e.get('decision', '')}: {e.get('detail', '')}"


def remediation_acted(inc: Incident) -> str:
    """The node and sample time of the action fabricmon took for this incident (read back by the other
    shards: remediation.remediator.remote_actions_of), "" when it took none."""
    done = [e for e in inc.remediation if e.get("decision") == "done" and "at_unix" in e]
    if not done:
        return ""
    return json.dumps({"node": done[-1].get("node", ""), "at": done[-1]["at_unix"]}, separators=(",", ":"))


class AlertmanagerClient:
    def __init__(self, urls: tuple[str, ...] | list[str], *, cluster: str = "", resend_seconds: float = 30.0,
                 timeout: float = 5.0, queue_max: int = 10000, generator_url: str = "",
                 runbook_base: str = "", wall: Callable[[], float] = time.time, max_batch: int = 200,
                 shard: str = "", resolve_seconds: float = 30.0, resolver: Resolver = system_resolver) -> None:
        self.peers = PeerSet(urls, resolver)
        self.resolve_seconds = resolve_seconds  # 0: never expand a name (one connection to what it resolves to)
        self.urls = [_Url(u) for u in urls]
        self.cluster = cluster
        self.resend_seconds = resend_seconds
        self.timeout = timeout
        self.queue_max = queue_max
        self.generator_url = generator_url.rstrip("/")
        self.runbook_base = runbook_base
        self.wall = wall
        self.max_batch = max_batch
        self.shard = shard  # the ``shard`` annotation: which shard sent it (read back by the other shards)
        self.sent_total: dict[str, int] = dict.fromkeys(RESULTS, 0)
        self._active: dict[str, dict[str, Any]] = {}  # id -> snapshot of an open incident
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._senders_started = False
        self._first_resolution = threading.Event()
        self._last_resend = wall()
        self._sample_now = 0.0

    # ------------------------------------------------------------------ producer side
    def submit(self, incidents: list[Incident], sample_now: float | None = None) -> None:
        """Queue the transitions of incidents that changed (open, update or resolve)."""
        if not self.urls:
            return
        with self._lock:
            if sample_now is not None:
                self._sample_now = max(self._sample_now, sample_now)
            for inc in incidents:
                snap = self._snapshot(inc)
                if inc.open:
                    self._active[inc.id] = snap
                    kind = "open"
                else:
                    self._active.pop(inc.id, None)
                    kind = "resolve"
                for u in self.urls:
                    self._enqueue(u, kind, inc.id, snap)
        self._wake.set()

    def adopt(self, incidents: list[Incident]) -> None:
        """Incidents restored after a restart that Alertmanager still holds active: resend them as
        usual from now on, but send nothing new (no second firing notification)."""
        with self._lock:
            for inc in incidents:
                if inc.open:
                    self._active[inc.id] = self._snapshot(inc)

    def alerts_for(self, incidents: list[Incident]) -> dict[str, dict[str, Any]]:
        """Incident id -> the labels and annotations this client sends for it (what Alertmanager holds)."""
        out = {}
        for inc in incidents:
            snap = self._snapshot(inc)
            out[inc.id] = {"labels": snap["labels"], "annotations": snap["annotations"]}
        return out

    def _snapshot(self, inc: Incident) -> dict[str, Any]:
        labels = {"alertname": inc.alertname, "severity": inc.severity, "component_type": inc.component_type,
                  "component": inc.component}
        for k in LABEL_KEYS:
            v = inc.labels.get(k)
            if v:
                labels[k] = str(v)
        if self.cluster and "cluster" not in labels:
            labels["cluster"] = self.cluster
        return {
            "labels": labels,
            "annotations": {
                "summary": inc.summary,
                "description": inc.full_description(),
                "runbook_url": f"{self.runbook_base}{inc.alertname.lower()}" if self.runbook_base else "",
                "incident_id": inc.id,
                # what the fault costs each hurt job (DESIGN "Jobs, decoys and cost"): the sentence, and the list
                "impact": impact_sentence(inc.impact),
                "impact_json": json.dumps([i.to_dict() for i in inc.impact], separators=(",", ":"))
                if inc.impact else "",
                "shard": self.shard,
                # what remediation decided (the last entry), and what it did for the other shards' breaker
                "remediation": remediation_text(inc),
                "remediation_acted": remediation_acted(inc),
            },
            "starts": inc.first_seen,
            "last_seen": inc.last_seen,
            "resolved_at": inc.resolved_at,
            "id": inc.id,
        }

    def _enqueue(self, u: _Url, kind: str, iid: str, snap: dict[str, Any]) -> None:
        if kind == "resend":
            if iid in u.pending_resend or any(e[1] == iid for e in u.queue):
                return
            u.pending_resend.add(iid)
        if len(u.queue) >= self.queue_max:
            victim = next((e for e in u.queue if e[0] == "resend"), None)
            if victim is not None:
                u.queue.remove(victim)
                u.pending_resend.discard(victim[1])
            else:
                u.queue.popleft()
            self.sent_total["dropped"] += 1
            log.warning("alertmanager_queue_full", url=u.url, queue_max=self.queue_max)
        u.queue.append((kind, iid, snap))

    # ------------------------------------------------------------------ payloads
    def payload(self, snap: dict[str, Any]) -> dict[str, Any]:
        wall = self.wall()
        if snap["resolved_at"] is None:
            ends = max(self._sample_now, snap["last_seen"], wall) + 4 * self.resend_seconds
        else:
            ends = min(snap["resolved_at"], wall)
            ends = max(ends, snap["starts"])
        ann = {k: v for k, v in snap["annotations"].items() if v}
        out = {"labels": snap["labels"], "annotations": ann, "startsAt": rfc3339(snap["starts"]),
               "endsAt": rfc3339(ends)}
        if self.generator_url:
            out["generatorURL"] = f"{self.generator_url}/api/incidents?id={snap['id']}"
        return out

    # ------------------------------------------------------------------ delivery
    def start(self) -> None:
        if self._threads or not self.urls:
            return
        self._stop.clear()
        if self.resolve_seconds > 0 and any(expandable(u) for u in self.peers.configured):
            t = threading.Thread(target=self._resolve_loop, name="alertmanager-resolver", daemon=True)
            self._threads.append(t)
            t.start()
            # a name that resolves promptly is expanded before the first POST; a slow resolver delays the
            # start by at most this, and the names are delivered to as they are until it answers
            self._first_resolution.wait(2.0)
        with self._lock:
            self._senders_started = True
            urls = list(self.urls)
        for u in urls:
            self._start_sender(u)

    def _start_sender(self, u: _Url) -> None:
        t = threading.Thread(target=self._run, args=(u,), name=f"alertmanager-sender-{len(self._threads)}",
                             daemon=True)
        self._threads.append(t)
        t.start()

    def _resolve_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_peers()
            except Exception:  # never let the resolver die: the last addresses stay in use
                log.exception("alertmanager_resolver_error")
            self._first_resolution.set()
            self._stop.wait(self.resolve_seconds)

    def refresh_peers(self) -> bool:
        """Resolve the configured names again and deliver to what they resolve to now.  A new address gets
        every active alert at once (and the resolves still queued for addresses that left); an address that
        left stops being sent to.  True when the set changed."""
        if not self.peers.refresh():
            return False
        with self._lock:
            have = {u.base: u for u in self.urls}
            want = self.peers.urls()
            retired = [u for u in self.urls if u.base not in want]
            carried = [e for r in retired for e in r.queue if e[0] == "resolve"]
            self.urls = [have.get(w) or _Url(w) for w in want]
            added = [u for u in self.urls if u.base not in have]
            for u in added:
                for iid, snap in self._active.items():
                    self._enqueue(u, "resend", iid, snap)
                for kind, iid, snap in carried:
                    self._enqueue(u, kind, iid, snap)
            for r in retired:
                r.retired = True
            started = self._senders_started
        if started:
            for u in added:
                self._start_sender(u)
        self._wake.set()
        return True

    def peer_counts(self) -> dict[str, int]:
        """Addresses each configured URL delivers to now (fabricmon_alertmanager_peers{url})."""
        with self._lock:
            return self.peers.counts()

    def stop(self, flush_timeout: float = 2.0) -> None:
        if not self._threads:
            return
        self.flush(flush_timeout)
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + self.timeout + 2
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = []
        with self._lock:
            self._senders_started = False

    def flush(self, timeout: float) -> bool:
        """Wait until every queue is empty (or ``timeout`` wall seconds); True when empty."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(u.queue for u in self.urls):
                    return True
            self._wake.set()
            time.sleep(0.05)
        return False

    def pending(self) -> int:
        with self._lock:
            return sum(len(u.queue) for u in self.urls)

    def _run(self, u: _Url) -> None:
        while not self._stop.is_set() and not u.retired:
            try:
                self._once(u)
            except Exception:  # never let the sender die
                log.exception("alertmanager_sender_error", url=u.url)
            # shared wake-up: a thread that misses a set() another cleared waits at most 0.1 s
            self._wake.wait(0.1)
            self._wake.clear()

    def _resends_due(self) -> None:
        with self._lock:
            if self.wall() - self._last_resend < self.resend_seconds:
                return
            self._last_resend = self.wall()
            for iid, snap in self._active.items():
                for u in self.urls:
                    self._enqueue(u, "resend", iid, snap)

    def _once(self, u: _Url | None = None) -> None:
        """One delivery round for ``u`` (its own thread), or for every URL in turn (tests)."""
        self._resends_due()
        for each in ([u] if u is not None else self.urls):
            self._deliver(each)

    def _deliver(self, u: _Url) -> None:
        now = time.monotonic()
        if not u.queue or now < u.next_try:
            return
        with self._lock:
            items: list[tuple[str, str, dict[str, Any]]] = []
            ids: set[str] = set()
            for e in u.queue:  # one entry per alert and POST: an open is delivered before its resolve
                if e[1] in ids or len(items) >= self.max_batch:
                    break
                ids.add(e[1])
                items.append(e)
            body = [self.payload(e[2]) for e in items]
        status = self._post(u, body)
        if status == REJECTED and len(body) > 1:
            # which alerts? Alertmanager kept the valid ones; re-posting those is harmless (dedup)
            results = [(e, self._post(u, [b])) for e, b in zip(items, body, strict=True)]
        else:
            results = [(e, status) for e in items]
        with self._lock:
            for e, st in results:
                if st == RETRY:
                    continue
                if u.queue and u.queue[0] is e:
                    u.queue.popleft()
                else:  # the queue was trimmed or partly delivered meanwhile
                    try:
                        u.queue.remove(e)
                    except ValueError:
                        pass
                if e[0] == "resend":
                    u.pending_resend.discard(e[1])
                if st == OK:
                    self.sent_total["success"] += 1
                else:
                    self.sent_total["rejected"] += 1
                    self._active.pop(e[1], None)  # the same alert would be refused every resend
            retry = sum(1 for _, st in results if st == RETRY)
            if retry:
                self.sent_total["error"] += retry
                u.next_try = now + u.backoff * random.uniform(0.8, 1.2)
                u.backoff = min(u.backoff * 2, 30.0)
            else:
                u.backoff = 0.5
                u.next_try = 0.0

    def _post(self, u: _Url, body: list[dict[str, Any]]) -> str:
        """OK, RETRY (5xx, 408, 429, timeout, connection) or REJECTED (any other 4xx)."""
        data = json.dumps(body).encode()
        req = urllib.request.Request(u.url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            # the whole POST within ``timeout``, not each read: a 200 dripping a byte every 2 s held this
            # Alertmanager's queue (issue 35); past it the batch is retried, and the other URLs go on
            code, _ = exchange(req, deadline_s=self.timeout, max_bytes=MAX_ANSWER_BYTES, handlers=(_NoRedirect,))
            status = OK if 200 <= code < 300 else RETRY
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read(500).decode(errors="replace").strip()
            except OSError:
                detail = ""
            if 300 <= exc.code < 400:
                error = f"HTTP {exc.code} redirect to {exc.headers.get('Location', '?')[:200]}: not followed for " \
                        f"a POST (the alerts would be lost); configure the URL it redirects to"
                if error != u.last_error:
                    log.error("alertmanager_redirect_refused", url=u.url, status=exc.code,
                              location=exc.headers.get("Location", "")[:200])
                    u.last_error = error
                return RETRY
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                if len(body) == 1:
                    lab = body[0].get("labels", {})
                    log.error("alertmanager_rejected_alert", url=u.url, status=exc.code, reason=detail[:300],
                              alertname=lab.get("alertname"), component=lab.get("component"))
                return REJECTED
            error = f"HTTP {exc.code}: {detail[:200]}"
            if error != u.last_error:
                log.warning("alertmanager_post_failed", url=u.url, error=error)
                u.last_error = error
            return RETRY
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if str(exc) != u.last_error:
                log.warning("alertmanager_post_failed", url=u.url, error=str(exc))
                u.last_error = str(exc)
            return RETRY
        if status == OK and u.last_error:
            log.info("alertmanager_post_recovered", url=u.url)
            u.last_error = ""
        return status
