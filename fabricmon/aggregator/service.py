"""Wire the aggregator from its config and run it until asked to stop.

``AggregatorRuntime`` (runtime.py) does the work: engine + gRPC intake + HTTP +
Alertmanager sender, ticked every ``tick_seconds`` of wall time at the cluster
clock (``clock.mode``: the aggregator's wall clock, or the median of the nodes'
sample times; admission.py).  This module turns the config into one: the
topology, the clock, the credentials streams are bound to.
"""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from ..configload import split_hostport
from ..topology import load_topology
from .admission import ClusterClock
from .alertmanager import AlertmanagerClient
from .config import AggregatorConfig, load_node_tokens
from .engine import Engine
from .runtime import AggregatorRuntime

log = structlog.get_logger("fabricmon.aggregator")


def _read_token(path: str | None) -> str | None:
    if not path:
        return None
    return Path(path).read_text().strip() or None


def _tls(cfg: AggregatorConfig):
    a = cfg.auth
    if not a.tls_cert:
        return None
    from .server import ServerTls

    return ServerTls(cert=a.tls_cert, key=a.tls_key, client_ca=a.tls_client_ca)


def build_engine(cfg: AggregatorConfig) -> Engine:
    topo = load_topology(cfg.topology)
    clock = ClusterClock(cfg.clock.mode, max_skew_s=cfg.clock.max_skew_s, max_age_s=cfg.clock.max_age_s)
    return Engine(topo, cfg.detection, cluster=cfg.cluster or topo.cluster,
                  shard_units=cfg.shard.units or None, cluster_clock=clock)


def grpc_auth_kwargs(cfg: AggregatorConfig, source: str = "aggregator config") -> dict:
    """The credentials ``start_grpc_server`` binds streams to, read from the files the config names."""
    a = cfg.auth
    if not a.authenticated:
        log.warning("aggregator_insecure", reason="auth.insecure is set: any peer that reaches the gRPC port "
                    "may speak for any node")
    return {"token": _read_token(a.token_file), "tls": _tls(cfg),
            "node_tokens": load_node_tokens(a.node_tokens_file, source) if a.node_tokens_file else None,
            "max_skew_s": cfg.clock.max_skew_s}


def build_runtime(cfg: AggregatorConfig) -> AggregatorRuntime:
    engine = build_engine(cfg)
    am = cfg.alertmanager
    sender = AlertmanagerClient(am.urls, cluster=engine.cluster, resend_seconds=am.resend_seconds,
                                timeout=am.timeout, queue_max=am.queue_max, generator_url=am.generator_url,
                                runbook_base=am.runbook_base)
    return AggregatorRuntime(engine, grpc_listen=cfg.grpc_listen, grpc_kwargs=grpc_auth_kwargs(cfg),
                             http_listen=split_hostport(cfg.http_listen), sender=sender,
                             tick_seconds=cfg.tick_seconds)


def run_aggregator(cfg: AggregatorConfig, stop_event: threading.Event) -> int:
    rt = build_runtime(cfg)
    try:
        rt.start()
    except Exception as exc:  # noqa: BLE001 - report and stop cleanly
        log.error("aggregator_start_failed", error=str(exc))
        return 1
    log.info("aggregator_started", grpc=rt.grpc_address, http=cfg.http_listen, nodes=len(rt.engine.topology.nodes),
             alertmanagers=list(cfg.alertmanager.urls), clock=cfg.clock.mode)
    try:
        rt.run(stop_event)
    finally:
        rt.stop()
        log.info("aggregator_stopped")
    return 0
