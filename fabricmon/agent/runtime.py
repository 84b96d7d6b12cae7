"""Assembles an agent from its config: sources, poller, exporter, stream and intake."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from ..config import AgentConfig
from ..configload import split_hostport
from ..sources.base import Source
from ..sources.inventory import Inventory, discover
from .exporter import AgentHTTPServer, RenderedSnapshot
from .poller import Poller

log = structlog.get_logger("fabricmon.agent")


def resolve_node_name(cfg: AgentConfig) -> str:
    """--node-name, else the fixture's ``hostname`` beside ``sys/``, else this host's name."""
    if cfg.node_name:
        return cfg.node_name
    root = os.path.abspath(cfg.sysfs_root)
    if os.path.basename(root) == "sys":
        beside = os.path.join(os.path.dirname(root), "hostname")
        try:
            with open(beside) as fh:
                name = fh.read().strip()
            if name:
                return name
        except OSError:
            pass
    return socket.gethostname().split(".")[0]


def build_sources(cfg: AgentConfig) -> list[Source]:
    from ..sources.ethtool import EthtoolSource
    from ..sources.fabric_config import FabricConfigSource
    from ..sources.host import HostSource
    from ..sources.infiniband import InfinibandSource
    from ..sources.nvlink import make_nvml_source

    sources: list[Source] = []
    s = cfg.sources
    if s.infiniband.enabled:
        sources.append(InfinibandSource(cfg))
    if s.ethtool.enabled:
        sources.append(EthtoolSource(cfg))
    if s.fabric_config.enabled:
        sources.append(FabricConfigSource(cfg))
    nvml = make_nvml_source(cfg)
    if nvml is not None:
        sources.append(nvml)
    if s.host.enabled and cfg.sysfs_root == "/sys":
        # psutil reads this host's /proc: meaningless for a fixture or simulated tree.
        sources.append(HostSource(cfg))
    return sources


def make_discover(cfg: AgentConfig) -> Callable[[], Inventory]:
    ib = cfg.sources.infiniband
    extra = cfg.sources.ethtool.interfaces
    rail_memory: dict[str, str] = {}
    cache: dict = {}

    def _discover() -> Inventory:
        return discover(cfg.sysfs_root, ib.include, ib.exclude, dict(cfg.rails), extra, rail_memory, cache,
                        ib.min_ports if ib.enabled else 0)

    return _discover


@dataclass
class Agent:
    cfg: AgentConfig
    node: str
    poller: Poller
    clock: Callable[[], float]
    http: AgentHTTPServer | None = None
    extras: list = field(default_factory=list)  # stream client, intake: things with stop()
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start_http(self, listen: str | None = None) -> int:
        host, port = split_hostport(listen or self.cfg.listen)
        rendered = RenderedSnapshot(lambda: self.poller.latest, self.clock)
        # Render in the poll thread right after each poll, so a scrape only copies bytes.
        self.poller.add_listener(rendered.refresh)
        self.http = AgentHTTPServer(host, port, rendered.body, ready=self.ready, alive=self.alive)
        self.http.start()
        return self.http.port

    def ready(self) -> bool:
        snap = self.poller.latest
        return snap is not None and self.clock() - snap.ts <= max(3 * self.cfg.interval, 5.0)

    def alive(self) -> bool:
        return self._thread is None or self._thread.is_alive()

    def start_polling(self) -> None:
        self._thread = threading.Thread(
            target=self.poller.run, args=(self._stop, self.cfg.interval), name="poller", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop in order: stop polling, flush the stream, close sources, then HTTP."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, self.cfg.interval * 2))
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
    return Agent(cfg=cfg, node=node, poller=poller, clock=clock)
