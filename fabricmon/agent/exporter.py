"""Prometheus exposition of the latest Snapshot, and the agent's HTTP endpoints.

``SnapshotCollector.collect()`` only serializes what the poller already
froze; a device that vanished simply has no samples in the new snapshot, so no
stale series linger.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..httploop import LoopHTTPServer
from ..httpserve import TEXT, Chunk, Route, RoutedHTTPServer, landing_page, probe
from ..metrics import SELF_SPECS, SPECS, MetricSpec
from ..model import Snapshot
from .margins import link_margins

ALL_SPECS = {**SPECS, **SELF_SPECS}


def _encodable(value: str) -> bool:
    """False for a label value UTF-8 cannot carry (a lone surrogate) or not a string at all (a source's bug):
    it costs its series, not the scrape."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _safe(value: str) -> str:
    """A value every series carries (the node name): replaced, since dropping it would drop everything."""
    return value if _encodable(value) else value.encode("utf-8", "replace").decode("utf-8")


def _family(spec: MetricSpec, labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


class SnapshotCollector:
    """A prometheus_client custom collector over ``get_snapshot()``."""

    def __init__(self, get_snapshot: Callable[[], Snapshot | None], clock: Callable[[], float] = time.time) -> None:
        self._get = get_snapshot
        self._clock = clock

    def describe(self) -> list:
        return []  # registering must not call collect()

    def collect(self) -> Iterator[Metric]:
        snap = self._get()
        if snap is None:
            return
        node = _safe(snap.node)
        by_family: dict[str, list] = defaultdict(list)
        for s in snap.samples:
            by_family[s.family].append(s)
        for s in link_margins(snap):
            by_family[s.family].append(s)
        for name, samples in by_family.items():
            spec = ALL_SPECS.get(name)
            if spec is None:
                continue  # a reading without a spec is a programming error caught by tests
            fam = _family(spec, ["node", *spec.labels])
            for s in samples:
                values = [v for _, v in s.labels]
                if all(map(_encodable, values)):
                    fam.add_metric([node, *values], s.value)
            yield fam
        up = _family(SELF_SPECS["fabricmon_collector_up"], ["node", "collector"])
        dur = _family(SELF_SPECS["fabricmon_collector_duration_seconds"], ["node", "collector"])
        err = _family(SELF_SPECS["fabricmon_collector_errors_total"], ["node", "collector"])
        for st in snap.sources:
            if not st.present:
                continue  # absent hardware (no GPU) is not a failing collector
            if not _encodable(st.source):
                continue
            up.add_metric([node, st.source], 1.0 if st.up else 0.0)
            dur.add_metric([node, st.source], st.duration_seconds)
            err.add_metric([node, st.source], float(st.errors_total))
        yield up
        yield dur
        yield err
        ts = _family(SELF_SPECS["fabricmon_snapshot_timestamp_seconds"], ["node"])
        ts.add_metric([node], snap.ts)
        yield ts
        age = _family(SELF_SPECS["fabricmon_snapshot_age_seconds"], ["node"])
        age.add_metric([node], max(0.0, self._clock() - snap.ts))
        yield age


def make_registry(get_snapshot: Callable[[], Snapshot | None],
                  clock: Callable[[], float] = time.time) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot, clock))
    return registry


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def render_snapshot(snapshot: Snapshot, prefixes: dict | None = None) -> bytes:
    """The classic text exposition of a snapshot, without the per-scrape ``snapshot_age`` line.

    Same bytes as prometheus_client's ``generate_latest`` over ``SnapshotCollector``
    (a test holds them equal), but about ten times faster; it runs once per poll,
    so a scrape only copies bytes.  ``prefixes`` caches each series' ``name{labels} ``
    across snapshots (series rarely change between polls).
    """
    if prefixes is None:
        prefixes = {}
    node_value = _escape_value(_safe(snapshot.node))
    node = f'node="{node_value}"'
    by_family: dict[str, list] = defaultdict(list)
    for smp in snapshot.samples:
        by_family[smp.family].append(smp)
    out: list[str] = []
    fmt = floatToGoString
    for name, samples in by_family.items():
        spec = ALL_SPECS.get(name)
        if spec is None:
            continue
        out.append(f"# HELP {name} {_escape_help(spec.help)}\n# TYPE {name} "
                   f"{'counter' if spec.kind == 'counter' else 'gauge'}\n")
        for smp in samples:
            key = (name, smp.labels, snapshot.node)
            prefix = prefixes.get(key)
            if prefix is None:
                # Sorted label names, as prometheus_client writes them.
                if all(_encodable(v) for _, v in smp.labels):
                    pairs = sorted((*smp.labels, ("node", _safe(snapshot.node))))
                    prefix = name + "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in pairs) + "} "
                else:
                    prefix = ""  # cached too: the bad series is skipped at no cost on later polls
                prefixes[key] = prefix
            if not prefix:
                continue
            out.append(prefix + fmt(smp.value) + "\n")
    rows = [st for st in snapshot.sources if st.present and _encodable(st.source)]
    for family, getter in (("fabricmon_collector_up", lambda st: 1.0 if st.up else 0.0),
                           ("fabricmon_collector_duration_seconds", lambda st: st.duration_seconds),
                           ("fabricmon_collector_errors_total", lambda st: float(st.errors_total))):
        spec = SELF_SPECS[family]
        out.append(f"# HELP {family} {_escape_help(spec.help)}\n# TYPE {family} {spec.kind}\n")
        for st in rows:
            out.append(f'{family}{{collector="{_escape_value(st.source)}",{node}}} {fmt(getter(st))}\n')
    spec = SELF_SPECS["fabricmon_snapshot_timestamp_seconds"]
    out.append(f"# HELP {spec.name} {_escape_help(spec.help)}\n# TYPE {spec.name} gauge\n"
               f"{spec.name}{{{node}}} {fmt(snapshot.ts)}\n")
    # Defence in depth behind _safe(): an unencodable character becomes "?" rather than failing the scrape.
    return "".join(out).encode("utf-8", "replace")


def _age_lines(snapshot: Snapshot, now: float) -> bytes:
    spec = SELF_SPECS["fabricmon_snapshot_age_seconds"]
    node = f'node="{_escape_value(_safe(snapshot.node))}"'
    return (f"# HELP {spec.name} {_escape_help(spec.help)}\n# TYPE {spec.name} gauge\n"
            f"{spec.name}{{{node}}} {floatToGoString(max(0.0, now - snapshot.ts))}\n").encode("utf-8", "replace")


class RenderedSnapshot:
    """The /metrics body, rendered once per snapshot so a scrape only copies bytes.

    The snapshot's exposition and the ``extras`` (the build and process metrics) are rendered in
    the poll thread right after each poll (``refresh``) and the extras again on each supervisor
    pass (``refresh_extras``, every 0.5 s), so they are never older than that; a scrape renders
    them itself only when nothing refreshed them for ``extras_max_age`` seconds (an agent whose
    poll thread and supervisor are both gone).  What a scrape adds of its own is the one
    ``snapshot_age`` line.

    A scrape that comes between the poller publishing a snapshot and its listener rendering it
    serves the previous body, with that body's own age: rendering it in the scrape too took about
    10 ms, beside the poll thread rendering the same, and was the agent's slowest scrape every
    poll (issue 39's p99)."""

    def __init__(self, get_snapshot: Callable[[], Snapshot | None], clock: Callable[[], float] = time.time,
                 extras: Sequence[Callable[[], bytes]] = (), extras_max_age: float = 2.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._get = get_snapshot
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._shown: Snapshot | None = None  # the snapshot ``_body`` is the exposition of
        self._body = Chunk(b"")  # its gzip form is made once per snapshot, on the first gzip scrape
        self._prefixes: dict = {}
        self._extras = tuple(extras)
        self._extras_max_age = extras_max_age
        self._extras_body: Chunk | None = None
        self._extras_at = float("-inf")

    def refresh(self, snapshot: Snapshot | None = None) -> None:
        """Render ``snapshot`` (or the latest) unless already rendered; the poller calls it after each poll."""
        snap = snapshot if snapshot is not None else self._get()
        if snap is None:
            return
        shown = self._shown
        if shown is not None and (shown.node, shown.seq, shown.ts) == (snap.node, snap.seq, snap.ts):
            return
        if len(self._prefixes) > 4 * max(len(snap.samples), 1000):
            self._prefixes.clear()  # series churned (devices came and went): start over
        body = Chunk(render_snapshot(snap, self._prefixes))
        with self._lock:
            self._body, self._shown = body, snap
        self.refresh_extras()

    def refresh_extras(self) -> None:
        """Render the extras now (after a poll, and on each supervisor pass)."""
        if not self._extras:
            return
        body = Chunk(b"".join(extra() for extra in self._extras))
        with self._lock:
            self._extras_body, self._extras_at = body, self._monotonic()

    def parts(self) -> list[bytes | Chunk]:
        """The cached snapshot exposition, this scrape's age line, then the cached extras (gzip: one
        member each, the cached ones compressed once)."""
        snap = self._get()
        out: list[bytes | Chunk] = []
        if snap is not None:
            with self._lock:
                shown, body = self._shown, self._body
            # abs(): a clock stepped back must not keep a body nobody renders any more
            if shown is None or (shown is not snap and abs(snap.ts - shown.ts) > self._extras_max_age):
                self.refresh(snap)  # nothing rendered it: no poll listener, or it is gone
                with self._lock:
                    shown, body = self._shown, self._body
            if shown is not None:
                out += [body, _age_lines(shown, self._clock())]
        if self._extras:
            with self._lock:
                extras, at = self._extras_body, self._extras_at
            if extras is None or self._monotonic() - at > self._extras_max_age:
                self.refresh_extras()
                with self._lock:
                    extras = self._extras_body
            if extras is not None:
                out.append(extras)
        return out

    def body(self) -> bytes:
        return b"".join(p.data if isinstance(p, Chunk) else p for p in self.parts())


def exposition(snapshot: Snapshot, now: float | None = None) -> bytes:
    """The classic text exposition of one snapshot (what ``--once`` prints)."""
    return render_snapshot(snapshot) + _age_lines(snapshot, snapshot.ts if now is None else now)


class AgentHTTPServer:
    """/metrics, /healthz (liveness: cheap, never touches NVML) and /readyz (the agent does its job).

    ``not_ready()`` returns why the agent is not ready (fresh poll, stream delivering,
    threads up); /readyz answers 503 with those reasons, one a line, or 200.

    Plain HTTP is served by a ``LoopHTTPServer``: one thread accepts, reads and answers, so a
    scrape is one wake-up that sends the pre-rendered parts (issue 39's p99).  With a web config
    (TLS, basic auth) the threaded ``RoutedHTTPServer`` serves: the handshake and the bcrypt
    checks run in a connection's own thread there, never in a loop every scrape waits on.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Callable[[], bytes | list],
        not_ready: Callable[[], list[str]],
        alive: Callable[[], bool] = lambda: True,
        web=None,
    ) -> None:
        self._host = host
        self._routes: dict[str, Route] = {
            "/": landing_page("fabricmon agent", ["/metrics", "/healthz", "/readyz"]),
            "/metrics": lambda q: (200, metrics(), "text/plain; version=0.0.4; charset=utf-8"),
            "/healthz": probe(alive, b"ok\n", b"poller stopped\n"),
            "/readyz": lambda q: _readyz(not_ready),
        }
        self._server = self._listen(port, web)

    def _listen(self, port: int, web) -> LoopHTTPServer | RoutedHTTPServer:
        if web is None:
            return LoopHTTPServer(self._host, port, self._routes, name="agent-http")
        return RoutedHTTPServer(self._host, port, self._routes, name="agent-http", web=web)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def max_connections(self) -> int:
        return self._server.max_connections

    def stats(self) -> dict[str, int]:
        return self._server.stats()

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def alive(self) -> bool:
        return self._server.alive()

    def close_dead(self) -> None:
        """Release the listening socket of a server whose thread died (``stop()`` would wait for it)."""
        self._server.close_dead()

    def set_web(self, web) -> None:
        """TLS and basic auth from now on (a reload rotates certificates); a web config given or taken
        away needs the other kind of listener, on the same port."""
        if isinstance(self._server, RoutedHTTPServer) and web is not None:
            self._server.set_web(web)
            return
        if web is None and isinstance(self._server, LoopHTTPServer):
            return
        port = self.port
        self._server.stop()
        self._server = self._listen(port, web)
        self._server.start()


def _readyz(not_ready: Callable[[], list[str]]) -> tuple[int, bytes, str]:
    try:
        problems = not_ready()
    except Exception as exc:  # a readiness check that fails is an answer, not a dead handler
        problems = [f"readiness check failed: {type(exc).__name__}"]
    if not problems:
        return 200, b"ready\n", TEXT
    return 503, ("".join(f"{p}\n" for p in problems)).encode(), TEXT
