"""Builds a long-running agent: sources plus rank intake, NCCL Inspector tail and aggregator stream."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import structlog

from ..config import AgentConfig
from .runtime import Agent, build_agent, build_sources, resolve_node_name

log = structlog.get_logger("fabricmon.agent")


def build_live_agent(cfg: AgentConfig, clock: Callable[[], float] = time.time, *,
                     stream_backoff: tuple[float, float] = (0.5, 30.0), source: str = "agent config") -> Agent:
    """The agent as ``fabricmon agent`` runs it (``--once`` uses ``build_agent`` alone).

    ``stream_backoff``: (min, max) seconds between reconnect attempts (tests shorten it), also
    between lookups of the node's unit.  Raises ConfigError (naming ``source``, the config file)
    before anything starts when the shard section cannot give a replica."""
    node = resolve_node_name(cfg)
    shard_plan = None
    if cfg.shard is not None and not cfg.aggregator:
        from .shard_target import resolve_static

        shard_plan = resolve_static(cfg.shard, node, source)
    fanout = None
    if shard_plan is not None and cfg.sources.ib_switches.enabled:
        from .sweep_fanout import every_replica

        assert cfg.shard is not None
        fanout = every_replica(shard_plan[0], cfg.shard, source)  # the switch sweep: every replica
    sources = build_sources(cfg)
    built = list(sources)  # what a reload rebuilds; the intake and NCCL tail below stay
    extras: list = []
    intake = None
    if cfg.intake.listen or cfg.intake.socket:
        from .intake import RankIntake

        ic = cfg.intake
        intake = RankIntake(node, socket_path=ic.socket, listen=ic.listen, max_jobs=ic.max_jobs,
                            max_series=ic.max_series, latest_ttl=ic.series_ttl, max_connections=ic.max_connections,
                            idle_timeout=ic.idle_timeout, socket_mode=ic.socket_mode, clock=clock)
        try:
            intake.start()
            sources.append(intake)
            extras.append(intake)
        except OSError as exc:  # e.g. the port is taken: the agent still exports fabric metrics
            log.error("rank_intake_unavailable", error=str(exc), socket=cfg.intake.socket, listen=cfg.intake.listen)
            intake = None
    if cfg.nccl_inspector_dir:
        from .nccl_inspector import NcclInspectorSource

        sources.append(NcclInspectorSource(cfg.nccl_inspector_dir, timeout=0.5, max_series=cfg.intake.nccl_max_series,
                                           series_ttl=cfg.intake.nccl_series_ttl))
    agent = build_agent(cfg, clock=clock, sources=sources)
    agent._built = built
    agent.extras.extend(extras)
    if intake is not None:
        # The intake's listeners cannot be restarted from outside: a dead one is reported
        # (log, thread_up 0, /readyz 503) so the orchestrator replaces the agent.
        agent.supervisor.add("intake", lambda: _intake_alive(intake))
    if cfg.aggregator:
        agent.stream = _start_stream(agent, cfg, cfg.aggregator, node, intake, stream_backoff)
        # Stop the stream before the intake so unacked batches reach the spool.
        agent.extras.append(agent.stream)
    elif fanout is not None:
        streams = [_start_stream(agent, cfg, t.address, node, intake if i == 0 else None, stream_backoff,
                                 spool_dir=os.path.join(cfg.stream.spool_dir, t.replica),
                                 name="stream" if i == 0 else f"stream:{t.replica}")
                   for i, t in enumerate(fanout)]
        log.info("switch_sweep_streams", replicas=[t.replica for t in fanout],
                 aggregators=[t.address for t in fanout])
        agent.stream = streams[0]  # its stats and readiness stand for all (each has its own spool)
        agent.extras.extend(streams)
    elif shard_plan is not None:
        agent.shard = _shard_target(agent, cfg, node, intake, stream_backoff, *shard_plan)
        agent.extras.append(agent.shard)  # stops the stream it started, before the intake
    return agent


def _start_stream(agent: Agent, cfg: AgentConfig, address: str, node: str, intake,
                  backoff: tuple[float, float], *, spool_dir: str | None = None, name: str = "stream"):
    from .spool import MemorySpool, Spool
    from .stream import StreamClient, TlsFiles

    spool_dir = spool_dir or cfg.stream.spool_dir
    try:
        os.makedirs(spool_dir, exist_ok=True)
        spool: MemorySpool = Spool(spool_dir, cfg.stream.spool_max_bytes)
    except OSError as exc:
        log.error("spool_dir_unusable_using_memory", spool_dir=spool_dir, error=str(exc))
        spool = MemorySpool(cfg.stream.spool_max_bytes)
    tls = None
    if cfg.stream.tls_ca or cfg.stream.tls_cert:
        tls = TlsFiles(ca=cfg.stream.tls_ca, cert=cfg.stream.tls_cert, key=cfg.stream.tls_key)
    client = StreamClient(address, node, spool=spool, token_file=cfg.stream.token_file, tls=tls,
                          intake=intake, interval_seconds=cfg.interval,
                          backoff_min=backoff[0], backoff_max=backoff[1], host_root=cfg.host_root)
    client.attach(agent.poller)
    client.start()
    agent.supervisor.add(name, client.alive, client.restart)
    return client


def _shard_target(agent: Agent, cfg: AgentConfig, node: str, intake, backoff: tuple[float, float], replicas, target):
    """The stream to the replica that owns this node's unit: started now when the config gives the
    unit, else once the node label is read (the agent polls and exports meanwhile)."""
    from .shard_target import ShardTarget, label_lookup

    sel = cfg.shard
    assert sel is not None  # a shard plan comes only from a shard section (build_agent)

    def start(address: str):
        agent.stream = _start_stream(agent, cfg, address, node, intake, backoff)
        return agent.stream

    lookup = label_lookup(sel, node) if target is None else None
    shard = ShardTarget(node, replicas, start, target=target, lookup=lookup, backoff=backoff)
    agent.supervisor.add("shard", shard.alive, shard.restart)
    return shard.start()


def _intake_alive(intake) -> bool:
    alive = getattr(intake, "alive", None)
    if callable(alive):
        return bool(alive())
    threads = list(getattr(intake, "_threads", ()))
    return all(t.is_alive() for t in threads)
