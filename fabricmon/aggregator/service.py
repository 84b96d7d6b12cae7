"""Wire the aggregator from its config and run it until asked to stop.

``AggregatorRuntime`` (runtime.py) does the work: engine + gRPC intake + HTTP +
Alertmanager sender, ticked every ``tick_seconds`` of wall time at the cluster
clock (``clock.mode``: the aggregator's wall clock, or the median of the nodes'
sample times; admission.py).  This module turns the config into one: the
topology, the clock, the credentials streams are bound to.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from ..buildinfo import ReloadStatus
from ..configload import ConfigError, split_hostport
from ..topology import load_topology
from .admission import ClusterClock
from .alertmanager import AlertmanagerClient
from .config import AggregatorConfig, DetectionSettings, load_node_tokens
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


def build_engine(cfg: AggregatorConfig, hostname: str | None = None) -> Engine:
    """``hostname`` (default: this host's) names the StatefulSet ordinal for shard.ordinal_from_hostname."""
    topo = load_topology(cfg.topology)
    units = cfg.shard.owned(hostname or socket.gethostname(), "aggregator config")
    if units:
        log.info("shard_units", units=list(units), ordinal_from_hostname=cfg.shard.ordinal_from_hostname)
    clock = ClusterClock(cfg.clock.mode, max_skew_s=cfg.clock.max_skew_s, max_age_s=cfg.clock.max_age_s)
    return Engine(topo, cfg.detection, cluster=cfg.cluster or topo.cluster,
                  shard_units=units or None, cluster_clock=clock)


def grpc_auth_kwargs(cfg: AggregatorConfig, source: str = "aggregator config") -> dict:
    """The credentials ``start_grpc_server`` binds streams to, read from the files the config names."""
    a = cfg.auth
    if not a.authenticated:
        log.warning("aggregator_insecure", reason="auth.insecure is set: any peer that reaches the gRPC port "
                    "may speak for any node")
    return {"token": _read_token(a.token_file), "tls": _tls(cfg),
            "node_tokens": load_node_tokens(a.node_tokens_file, source) if a.node_tokens_file else None,
            "max_skew_s": cfg.clock.max_skew_s}


def build_runtime(cfg: AggregatorConfig, web=None, reload_status: ReloadStatus | None = None,
                  hostname: str | None = None) -> AggregatorRuntime:
    engine = build_engine(cfg, hostname)
    am = cfg.alertmanager
    sender = AlertmanagerClient(am.urls, cluster=engine.cluster, resend_seconds=am.resend_seconds,
                                timeout=am.timeout, queue_max=am.queue_max, generator_url=am.generator_url,
                                runbook_base=am.runbook_base)
    on_changed = resume_incidents(cfg.state_file, engine, sender) if cfg.state_file else None
    return AggregatorRuntime(engine, grpc_listen=cfg.grpc_listen, grpc_kwargs=grpc_auth_kwargs(cfg),
                             http_listen=split_hostport(cfg.http_listen), sender=sender,
                             tick_seconds=cfg.tick_seconds, http_web=web, reload_status=reload_status,
                             on_changed=on_changed)


def resume_incidents(path: str, engine: Engine, sender: AlertmanagerClient, now: float | None = None):
    """Restore the open incidents persisted at ``path``, reconcile them with Alertmanager (adopt the
    ones it still holds, send the others firing again), and return the runtime's ``on_changed``
    hook that persists the open incidents after every change (aggregator/incident_store.py)."""
    from . import incident_store

    now = time.time() if now is None else now
    records = incident_store.load(path)
    if records:
        interval = max((ns.interval for ns in engine.nodes.values()), default=1.0)
        with engine.lock:
            restored = incident_store.restore(engine.manager, records, now, interval)
        active = None
        for url in sender.urls:
            active = incident_store.active_at_alertmanager(url.url.removesuffix("/api/v2/alerts"))
            if active is not None:
                break
        keep, gone = incident_store.reconcile(restored, active)
        sender.adopt(keep)
        if gone:
            sender.submit(gone, now)
        log.info("incidents_resumed", file=path, adopted=len(keep), sent_again=len(gone))

    def persist(changed, tick_now: float) -> None:
        open_ = engine.open_incidents()
        incident_store.save(path, open_, sender.alerts_for(open_))

    return persist


def apply_detection(engine: Engine, new: DetectionSettings) -> None:
    """Swap the engine's detection thresholds between two ticks (SIGHUP).  The few values the engine
    derives from them at construction are derived again; the straggler window sizes its history
    bitmasks and so needs a restart."""
    old = engine.settings
    if new.straggler_window != old.straggler_window:
        raise ConfigError("detection.straggler_window changed: needs a restart")
    with engine.lock:
        engine.settings = new
        engine.stragglers.s = new
        engine.manager.default_hold_s = new.hold_s
        engine._fatal_xids = frozenset(str(x) for x in new.xid_fatal)
        engine._config_checks = frozenset(new.config_checks)


def reload_aggregator(rt: AggregatorRuntime, old: AggregatorConfig, new: AggregatorConfig) -> list[str]:
    """Apply what a reload can (the ``detection`` thresholds); raise ConfigError, changing nothing,
    when anything else changed (listeners, auth, topology, Alertmanager need a restart)."""
    fixed = [f.name for f in dataclasses.fields(old) if f.name != "detection"
             and getattr(old, f.name) != getattr(new, f.name)]
    if fixed:
        raise ConfigError(f"{', '.join(fixed)} changed: needs a restart (reload applies detection)")
    changed = [f.name for f in dataclasses.fields(old.detection)
               if getattr(old.detection, f.name) != getattr(new.detection, f.name)]
    if changed:
        apply_detection(rt.engine, new.detection)
    return [f"detection.{c}" for c in changed]


def run_aggregator(cfg: AggregatorConfig, stop_event: threading.Event, *, web=None,
                   reload: threading.Event | None = None,
                   load: Callable[[], AggregatorConfig] | None = None, load_web: Callable | None = None) -> int:
    """Run until ``stop_event``; when ``reload`` is set (SIGHUP), ``load()`` the config (and
    ``load_web()`` the web config) again and apply it, or log why not and keep the running one."""
    status = ReloadStatus()
    rt = build_runtime(cfg, web=web, reload_status=status)
    try:
        rt.start()
    except OSError:
        raise  # a busy HTTP port: the CLI prints one line and exits 2
    except RuntimeError as exc:
        if "cannot listen" in str(exc):
            raise ConfigError(f"{exc} (address in use or not local)") from None
        log.error("aggregator_start_failed", error=str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - report and stop cleanly
        log.error("aggregator_start_failed", error=str(exc))
        return 1
    current = [cfg]

    def _maybe_reload() -> None:
        if reload is None or load is None or not reload.is_set():
            return
        reload.clear()
        try:
            new = load()
            new_web = load_web() if load_web is not None else web
            changed = reload_aggregator(rt, current[0], new)
        except ConfigError as exc:
            status.record(False)
            log.error("config_reload_failed", error=str(exc), detail="still running on the previous config")
            return
        current[0] = new
        if rt.http is not None:
            rt.http.set_web(new_web)  # certificates and users re-read: rotation without a restart
        status.record(True)
        log.info("config_reloaded", changed=changed)

    log.info("aggregator_started", grpc=rt.grpc_address, http=cfg.http_listen, nodes=len(rt.engine.topology.nodes),
             alertmanagers=list(cfg.alertmanager.urls), clock=cfg.clock.mode)
    try:
        rt.run(stop_event, between=_maybe_reload)
    finally:
        rt.stop()
        log.info("aggregator_stopped")
    return 0
