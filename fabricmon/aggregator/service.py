"""Wire the aggregator: Engine + gRPC intake + HTTP + Alertmanager sender + tick loop.

The tick loop runs every ``tick_seconds`` of wall time and ticks the engine at
the cluster clock (``clock.mode``: the aggregator's wall clock, or the median of
the nodes' sample times; admission.py), then hands the incidents that changed
to the Alertmanager sender.  Shutdown order: readiness off, gRPC intake (with
grace), last tick, Alertmanager flush, HTTP.
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
from .http_api import HttpApi

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


def run_aggregator(cfg: AggregatorConfig, stop_event: threading.Event) -> int:
    engine = build_engine(cfg)
    am = cfg.alertmanager
    sender = AlertmanagerClient(am.urls, cluster=engine.cluster, resend_seconds=am.resend_seconds,
                                timeout=am.timeout, queue_max=am.queue_max, generator_url=am.generator_url,
                                runbook_base=am.runbook_base)
    ready = threading.Event()
    grpc_server = None
    http = HttpApi(engine, split_hostport(cfg.http_listen), sender, ready=ready.is_set,
                   grpc_stats=lambda: grpc_server.stats() if grpc_server is not None else {})
    http.start()
    sender.start()
    try:
        from .server import start_grpc_server  # written beside this module; imported lazily

        grpc_server = start_grpc_server(engine, cfg.grpc_listen, **grpc_auth_kwargs(cfg))
    except Exception as exc:  # noqa: BLE001 - report and stop cleanly
        log.error("grpc_start_failed", error=str(exc))
        sender.stop(0.5)
        http.stop()
        return 1
    ready.set()
    log.info("aggregator_started", grpc=cfg.grpc_listen, http=cfg.http_listen, nodes=len(engine.topology.nodes),
             alertmanagers=list(am.urls))
    last = None
    try:
        while not stop_event.wait(cfg.tick_seconds):
            now = engine.newest_ts
            if not now:
                continue
            try:
                changed = engine.tick(now)
            except Exception:  # noqa: BLE001 - one bad tick must not stop alerting
                log.exception("tick_failed")
                continue
            if changed:
                sender.submit(changed, now)
                for inc in changed:
                    log.info("incident", alertname=inc.alertname, component=inc.component,
                             state="open" if inc.open else "resolved", severity=inc.severity)
            last = now
    finally:
        ready.clear()
        stop = getattr(grpc_server, "stop", None)
        if stop is not None:
            try:
                res = stop(5.0)
                wait = getattr(res, "wait", None)
                if wait is not None:
                    wait(6.0)
            except Exception:  # noqa: BLE001
                log.exception("grpc_stop_failed")
        if last is not None and engine.newest_ts > last:
            sender.submit(engine.tick(engine.newest_ts), engine.newest_ts)
        sender.stop(flush_timeout=2.0)
        http.stop()
        log.info("aggregator_stopped")
    return 0
