"""Assembles an agent from its config: sources, poller, exporter, stream and intake."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ..buildinfo import ReloadStatus, runtime_exposition
from ..config import AgentConfig
from ..configload import ConfigError, split_hostport
from ..sources import registry
from ..sources.base import Source
from ..sources.inventory import Inventory, RailLog, discover
from ..sources.pci_affinity import GpuScan
from ..sources.registry import SourceContext
from ..textcheck import node_name_problem
from .exporter import AgentHTTPServer, RenderedSnapshot
from .linkwatch import LinkWatch
from .poller import Poller
from .selfmetrics import AgentSelfCollector, self_exposition
from .supervise import Supervisor

log = structlog.get_logger("fabricmon.agent")


# How long a thread that wants the GIL waits before the holder must hand it over (CPython's default is
# 5 ms).  A scrape takes the GIL several times (the accept loop, its handler thread, after each socket
# call); whenever the poll, the stream or a source thread is running Python, each of those can wait the
# whole interval: traced, the agent's slowest scrapes waited 4-5 ms for the accept loop or the handler
# thread to run at all (issue 39's p99).  At 0.5 ms the busy thread is interrupted only while another
# one waits, so a poll costs no more when nothing is scraped.
GIL_SWITCH_INTERVAL = 0.0005


def hand_over_gil_promptly() -> None:
    """The agent process' GIL switch interval (``fabricmon agent`` sets it at start)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)


def token_problem(path: str | None) -> str | None:
    """Why the stream's token file cannot be used (unreadable or empty), or None.  Read at every
    /readyz: a token the pod cannot read is the one stream fault that is local (issue: a Secret
    mounted root:root 0440 for a non-root agent)."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(65536)
    except OSError as exc:
        return f"stream.token_file: {path}: not readable ({exc.strerror or exc})"
    if not data.strip():
        return f"stream.token_file: {path}: empty"
    return None


def resolve_node_name(cfg: AgentConfig) -> str:
    """--node-name, else the fixture's ``hostname`` beside ``sys/``, else this host's name.

    Raises ConfigError when the name breaks the rule the aggregator applies (textcheck): refused
    here once, at start, rather than by the aggregator on every reconnect."""
    name, origin = _node_name(cfg)
    why = node_name_problem(name)
    if why is not None:
        raise ConfigError(f"{origin}: node name {name[:60]!r}{'...' if len(name) > 60 else ''}: {why}")
    return name


def _node_name(cfg: AgentConfig) -> tuple[str, str]:
    if cfg.node_name:
        return cfg.node_name, "node_name"
    root = os.path.abspath(cfg.sysfs_root)
    if os.path.basename(root) == "sys":
        beside = os.path.join(os.path.dirname(root), "hostname")
        try:
            with open(beside) as fh:
                name = fh.read().strip()
            if name:
                return name, beside
        except OSError:
            pass
    return socket.gethostname().split(".")[0], "hostname"


def source_context(cfg: AgentConfig) -> SourceContext:
    """The host facts sources read besides their own ``sources.<name>`` section."""
    return SourceContext(sysfs_root=cfg.sysfs_root, host_root=cfg.host_root, ethtool_dir=cfg.ethtool_dir,
                         nvml=cfg.nvml, profile=cfg.profile)


def build_sources(cfg: AgentConfig) -> list[Source]:
    """The enabled sources (sources/registry.py), each from its own section."""
    return registry.build_sources(cfg.sources, source_context(cfg))


def make_discover(cfg: AgentConfig) -> Callable[[], Inventory]:
    ib = cfg.sources.infiniband
    extra = cfg.sources.ethtool.interfaces
    rail_memory: dict[str, str] = {}
    cache: dict = {}
    gpu_scan = GpuScan()  # the PCI bus' GPUs, for rails by PCI affinity: each function read once
    rail_log = RailLog()

    def _discover() -> Inventory:
        inv = discover(cfg.sysfs_root, ib.include, ib.exclude, dict(cfg.rails), extra, rail_memory, cache,
                       ib.min_ports if ib.enabled else 0, gpu_scan)
        rail_log(inv)
        return inv

    return _discover


@dataclass
class Agent:
    cfg: AgentConfig
    node: str
    poller: Poller
    clock: Callable[[], float]
    http: AgentHTTPServer | None = None
    extras: list = field(default_factory=list)  # stream client, intake: things with stop()
    stream: Any = None  # StreamClient when an aggregator is configured
    shard: Any = None  # ShardTarget when the config has a shard section (it starts the stream)
    supervisor: Supervisor = field(default_factory=Supervisor)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _rendered: RenderedSnapshot | None = None
    _live_body: list[Callable[[], bytes]] = field(default_factory=list)
    _http_addr: tuple[str, int] | None = None
    web: Any = None  # WebConfig: TLS and basic auth for /metrics (--web.config.file)
    reload_status: ReloadStatus = field(default_factory=ReloadStatus)
    _built: list | None = None  # the sources build_sources made (a reload rebuilds them); None: the caller's
    link_watch: LinkWatch | None = None  # None: disabled (0) or no faster than the polls themselves
    _watch_thread: threading.Thread | None = None

    def start_http(self, listen: str | None = None) -> int:
        host, port = split_hostport(listen or self.cfg.listen)
        stream_stats: Callable[[], dict[str, Any]] | None = None
        if self.stream is not None or self.shard is not None:
            # A shard's stream may start after this (once the node label is read): zeros until then.
            def current_stream_stats() -> dict[str, Any]:
                return self.stream.stats() if self.stream is not None else {}

            stream_stats = current_stream_stats
        # The agent's own counters (delivery, threads, link watch) are read at each scrape, a few
        # dozen lines: a count shows once its event happened.  The build and process metrics (which
        # read /proc) are rendered with the snapshot, after each poll and on each supervisor pass.
        self._live_body = [self_exposition(AgentSelfCollector(self.node, stream_stats, self.supervisor.stats,
                                                              self.link_watch_stats))]
        if self.shard is not None:
            from .shard_target import shard_exposition

            self._live_body.append(shard_exposition(self.shard))
        rendered = RenderedSnapshot(lambda: self.poller.latest, self.clock, [runtime_exposition(self.reload_status)])
        self._rendered = rendered
        # Render in the poll thread right after each poll, so a scrape only copies bytes.
        self.poller.add_listener(rendered.refresh)
        self.supervisor.after_check(rendered.refresh_extras)
        rendered.refresh_extras()
        self.http = self._new_http(host, port)
        self._http_addr = (host, self.http.port)
        self.supervisor.add("exporter", lambda: self.http is not None and self.http.alive(), self._restart_http)
        return self.http.port

    def _new_http(self, host: str, port: int) -> AgentHTTPServer:
        http = AgentHTTPServer(host, port, self._metrics, not_ready=self.not_ready, alive=self.alive, web=self.web)
        http.start()
        return http

    def _restart_http(self) -> None:
        if self._stop.is_set() or self._http_addr is None:
            return
        old = self.http
        if old is not None:
            old.close_dead()
        self.http = self._new_http(*self._http_addr)  # the same port: scrapers keep their target

    def _metrics(self) -> list:
        parts: list = self._rendered.parts() if self._rendered is not None else []
        return parts + [live() for live in self._live_body]

    # Settings a reload applies; any other change needs a restart (listeners, stream, spool, intake).
    RELOADABLE = ("sources", "profile", "rails", "log")

    def reload(self, new: AgentConfig) -> list[str]:
        """Apply ``new`` (SIGHUP): rebuild the sources with it, keeping the stream, spool, intake and
        listeners as they are.  Returns the changed sections; raises ConfigError, changing nothing,
        when a setting that needs a restart changed."""
        old = self.cfg
        fixed = [f for f in old.__dataclass_fields__ if f not in self.RELOADABLE
                 and getattr(old, f) != getattr(new, f)]
        if fixed:
            raise ConfigError(f"{', '.join(fixed)} changed: needs a restart (reload applies "
                              f"{', '.join(self.RELOADABLE)})")
        if self.stream is not None and new.stream.token_file:
            from ..secretfiles import token_lines_problem

            # checked before anything is applied: a token file the agent cannot read, or that is not one
            # token per line (caught mid-write, a bad Secret), fails the reload and the stream stays
            try:
                text = Path(new.stream.token_file).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"stream.token_file: cannot read {new.stream.token_file}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
            problem = token_lines_problem(text)
            if problem:
                raise ConfigError(f"stream.token_file: {new.stream.token_file}"
                                  f"{' ' if problem == 'is empty' else ': '}{problem}")
        if self.stream is not None:
            from .stream_channel import tls_problem

            # a certificate caught mid-write or invalid: refused, the live stream keeps its own
            problem = tls_problem(self.stream.options.tls)
            if problem:
                raise ConfigError(problem)
        changed = [f for f in self.RELOADABLE if getattr(old, f) != getattr(new, f)]
        if changed and changed != ["log"]:
            if self._built is None:
                raise ConfigError("sources were given by the program running the agent: cannot rebuild them")
            fresh = build_sources(new)
            old_built = self._built
            self.poller.swap_sources(old_built, fresh, make_discover(new))
            self._built = fresh
            for src in old_built:
                try:
                    src.close()
                except Exception as exc:  # a source that fails to close must not stop the reload
                    log.warning("source_close_failed", collector=src.name, error=str(exc))
        self.cfg = new
        for src in self._built or ():  # switch credentials (gnmi_switches): re-read, changed ones reconnect
            refresh = getattr(src, "refresh_credentials", None)
            if refresh is not None and refresh():
                changed.append(f"sources.{src.name} credential files (contents: reconnecting those switches)")
        if self.stream is not None:
            try:
                what = self.stream.credentials_changed()
                if what is not None and self.stream.refresh_credentials():
                    changed.append("stream.token_file (contents: reconnecting with the new token)"
                                   if what == "token file" else
                                   "stream.tls_* (contents: reconnecting with the new certificates)")
            except OSError as exc:  # read a moment ago: the next connect reads it again and says why
                log.warning("token_file_unreadable", file=new.stream.token_file, error=exc.strerror or str(exc))
        return changed

    def secret_files(self) -> list[str | None]:
        """The files a rotation changes (watched by filewatch.py): the stream's token and TLS files, and the
        gNMI switches' CA and credential files."""
        gnmi = self.cfg.sources.gnmi_switches
        switches = [f for t in gnmi.targets for f in (t.tls_ca, t.username_file, t.password_file)] \
            if gnmi.enabled else []
        if self.stream is None and self.shard is None:
            return switches
        st = self.cfg.stream
        return [st.token_file, st.tls_ca, st.tls_cert, st.tls_key, *switches]

    def not_ready(self) -> list[str]:
        """Why the agent does not do its job now; empty when ready (what /readyz answers)."""
        problems: list[str] = []
        snap = self.poller.latest
        limit = max(3 * self.cfg.interval, 5.0)
        if snap is None:
            problems.append("no snapshot yet")
        elif self.clock() - snap.ts > limit:
            problems.append(f"last poll {self.clock() - snap.ts:.1f}s ago (limit {limit:.1f}s)")
        if snap is not None:
            for st in snap.sources:
                if st.stuck:  # a read blocked in a driver: those series are not monitored now
                    problems.append(f"{st.source}: read blocked past its deadline: {', '.join(st.stuck[:8])}"
                                    + (f" and {len(st.stuck) - 8} more" if len(st.stuck) > 8 else ""))
        if self._thread is not None and not self._thread.is_alive():
            problems.append("poller thread down")
        inventory = self.poller.inventory
        missing = inventory.expected_but_missing if inventory is not None else ""
        if missing:  # a wrong --sysfs-root looks exactly like a healthy node without RDMA otherwise
            problems.append(missing)
        if self.shard is not None:
            problems.extend(self.shard.not_ready())
        # Only local faults: an aggregator that is down or refuses the stream is a metric and an
        # alert (the batches spool), never a reason to hold a DaemonSet rollout.
        if self.stream is not None or self.shard is not None:
            token = token_problem(self.cfg.stream.token_file)
            if token:
                problems.append(token)
        if self.stream is not None:
            if not self.stream.alive():
                problems.append("stream thread down")
            elif not self.stream.delivering():
                problems.append("stream neither connected nor spooling")  # the spool refuses writes: local
        dropping = self.stream.state.aggregator_dropping if self.stream is not None else ""
        if dropping:  # acked but not believed: this node's own clock or seq, a local fault to fix here
            problems.append(f"the aggregator drops this node's batches ({dropping}): check the node's clock")
        for name in self.supervisor.down():
            if name not in ("poller", "stream", "shard"):
                problems.append(f"{name} thread down")
        return problems

    def ready(self) -> bool:
        return not self.not_ready()

    def alive(self) -> bool:
        """/healthz: cheap (no source, no NVML); false only when polling stopped for good."""
        return self._thread is None or self._thread.is_alive() or self.supervisor.running()

    def link_watch_stats(self) -> dict[str, float]:
        """The link watch's counters and the poller's off-cadence polls (selfmetrics); {} when disabled."""
        if self.link_watch is None:
            return {}
        out: dict[str, float] = dict(self.link_watch.stats())
        out["interval_seconds"] = self.link_watch.interval
        out["triggered_polls_total"] = self.poller.off_cadence_polls_total
        out["held_total"] = self.poller.off_cadence_held_total
        return out

    def start_polling(self) -> None:
        self._start_poll_thread()
        self.supervisor.add("poller", lambda: self._thread is not None and self._thread.is_alive(),
                            self._start_poll_thread)
        if self.link_watch is not None:
            self._start_watch_thread()
            self.supervisor.add("linkwatch", lambda: self._watch_thread is not None and self._watch_thread.is_alive(),
                                self._start_watch_thread)

    def _start_watch_thread(self) -> None:
        if self._stop.is_set() or self.link_watch is None:
            return
        self._watch_thread = threading.Thread(target=self.link_watch.run, args=(self._stop,), name="linkwatch",
                                              daemon=True)
        self._watch_thread.start()

    def _start_poll_thread(self) -> None:
        if self._stop.is_set():
            return
        self._thread = threading.Thread(
            target=self.poller.run, args=(self._stop, self.cfg.interval, self.cfg.align_polls), name="poller",
            daemon=True
        )
        self._thread.start()

    def supervise(self, stop: threading.Event, every: float = 0.5) -> None:
        """Block, restarting dead threads, until ``stop`` (``fabricmon agent``'s main thread)."""
        self.supervisor.run(stop, every)

    def start_supervisor(self, every: float = 0.5) -> None:
        """Supervise from a daemon thread (an agent run inside another program or a test)."""
        self.supervisor.start(self._stop, every)

    def stop(self) -> None:
        """Stop in order: stop supervising and polling, flush the stream, close sources, then HTTP."""
        self._stop.set()
        self.poller.wake()  # a wait between polls sees the stop at once
        self.supervisor.halt()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, self.cfg.interval * 2))
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=2.0)
        if self.link_watch is not None:
            self.link_watch.close()
        for extra in reversed(self.extras):
            try:
                extra.stop()
            except Exception as exc:
                log.warning("stop_failed", part=type(extra).__name__, error=str(exc))
        self.poller.close()
        if self.http is not None:
            self.http.stop()


def build_agent(
    cfg: AgentConfig,
    clock: Callable[[], float] = time.time,
    sources: list[Source] | None = None,
    inline_sources: bool = False,
) -> Agent:
    node = resolve_node_name(cfg)
    srcs = build_sources(cfg) if sources is None else sources
    poller = Poller(node, srcs, make_discover(cfg), clock=clock, inline_all=inline_sources)
    agent = Agent(cfg=cfg, node=node, poller=poller, clock=clock, _built=list(srcs) if sources is None else None)
    agent.link_watch = make_link_watch(cfg, poller, inline=inline_sources)
    return agent


def make_link_watch(cfg: AgentConfig, poller: Poller, inline: bool = False) -> LinkWatch | None:
    """The link watch of this config: None when disabled (0) or when it would not be faster than the
    polls themselves (``link_watch_interval`` >= ``interval``: every poll already reads link state)."""
    every = cfg.link_watch_interval
    if every <= 0 or every >= cfg.interval:
        return None
    return LinkWatch(lambda: poller.inventory, poller.request_poll, every, inline=inline)
