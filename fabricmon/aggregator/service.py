"""Wire the aggregator from its config and run it until asked to stop.

``AggregatorRuntime`` (runtime.py) does the work: engine + gRPC intake + HTTP +
Alertmanager sender, ticked every ``tick_seconds`` of wall time at the cluster
clock (``clock.mode``: the aggregator's wall clock, or the median of the nodes'
sample times; admission.py).  This module turns the config into one: the
topology, the clock, the credentials streams are bound to.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from ..buildinfo import ReloadStatus
from ..configload import ConfigError, split_hostport
from ..filewatch import FileWatch
from ..topology import load_topology
from . import incident_store
from .admission import ClusterClock
from .alertmanager import AlertmanagerClient
from .config import AggregatorConfig
from .conn_gate import ACCEPT_BURST
from .credentials import load_credentials
from .engine import Engine
from .reload import Reloader, secret_files
from .remediation.wiring import build_remediator
from .remote_evidence import AlertmanagerEvidence
from .runtime import AggregatorRuntime

if TYPE_CHECKING:
    from ..webconfig import WebConfig
    from .server import ServerTls

log = structlog.get_logger("fabricmon.aggregator")


def _tls(cfg: AggregatorConfig) -> ServerTls | None:
    a = cfg.auth
    if not a.tls_cert or not a.tls_key:  # given together (AuthSettings checks)
        return None
    from .server import ServerTls

    return ServerTls(cert=a.tls_cert, key=a.tls_key, client_ca=a.tls_client_ca)


def build_engine(cfg: AggregatorConfig, hostname: str | None = None) -> Engine:
    """``hostname`` (default: this host's) names the StatefulSet ordinal for shard.ordinal_from_hostname."""
    topo = load_topology(cfg.topology)
    units = cfg.shard.owned(hostname or socket.gethostname(), "aggregator config", topo)
    if units:
        groups = topo.shape.leaf_groups()
        log.info("shard_units", units=list(units), ordinal_from_hostname=cfg.shard.ordinal_from_hostname,
                 leaves=[leaf for u in units for leaf in groups.get(u, ())][:64])
    clock = ClusterClock(cfg.clock.mode, max_skew_s=cfg.clock.max_skew_s, max_age_s=cfg.clock.max_age_s)
    engine = Engine(topo, cfg.detection, cluster=cfg.cluster or topo.cluster,
                    shard_units=units or None, cluster_clock=clock)
    engine.switch_side.sources = frozenset(cfg.auth.switch_sources)
    return engine


def grpc_auth_kwargs(cfg: AggregatorConfig, source: str = "aggregator config") -> dict[str, Any]:
    """The credentials ``start_grpc_server`` binds streams to, read from the files the config names."""
    a = cfg.auth
    if not a.authenticated:
        log.warning("aggregator_insecure", reason="auth.insecure is set: any peer that reaches the gRPC port "
                    "may speak for any node")
    return {"credentials": load_credentials(a, source), "tls": _tls(cfg), "max_skew_s": cfg.clock.max_skew_s}


# Descriptors kept for everything but agent connections: the HTTP listener's 64 connections, the
# topology and token files, gRPC's own pipes and timers, log and spool files.
FD_RESERVE = 160


def plan_fd_limit(wanted: int, soft: int, hard: int, reserve: int = FD_RESERVE,
                  per_connection: int = 1) -> tuple[int, int]:
    """(the soft RLIMIT_NOFILE to set, the gRPC connections that fit under it): the soft limit is
    raised toward the hard one for ``wanted`` connections of ``per_connection`` descriptors each
    plus the reserve; when even the hard limit is too low the connection limit shrinks to fit, so
    the limit is what runs out, never the descriptors (at least 16 connections)."""
    infinite = hard < 0  # RLIM_INFINITY
    need = wanted * per_connection + reserve
    new_soft = max(soft, need) if infinite else max(soft, min(need, hard))
    return new_soft, max(16, min(wanted, (new_soft - reserve) // per_connection))


def fit_descriptors(wanted: int, gate: bool = False) -> int:
    """The gRPC connection limit that fits the descriptor limit (raised toward its hard limit for it).
    Behind the connection gate a connection takes three descriptors (the client's, the relay's to
    gRPC, gRPC's end of it) and up to ``ACCEPT_BURST`` more are accepted before the gate judges them."""
    per, reserve = (3, FD_RESERVE + 8 * ACCEPT_BURST) if gate else (1, FD_RESERVE)
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return wanted
    new_soft, fits = plan_fd_limit(wanted, soft, hard, reserve, per)
    if new_soft != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        except (OSError, ValueError):
            new_soft, fits = soft, max(16, min(wanted, (soft - reserve) // per))
    if fits < wanted:
        log.warning("grpc_connection_limit_lowered", wanted=wanted, limit=fits, rlimit_nofile=new_soft,
                    hint="raise LimitNOFILE (systemd) or the container's nofile ulimit")
    return fits


def build_runtime(cfg: AggregatorConfig, web: WebConfig | None = None, reload_status: ReloadStatus | None = None,
                  hostname: str | None = None) -> AggregatorRuntime:
    engine = build_engine(cfg, hostname)
    am = cfg.alertmanager
    sender = AlertmanagerClient(am.urls, cluster=engine.cluster, resend_seconds=am.resend_seconds,
                                timeout=am.timeout, queue_max=am.queue_max, generator_url=am.generator_url,
                                runbook_base=am.runbook_base, shard=shard_name(engine.shard_units),
                                resolve_seconds=am.resolve_seconds)
    remote = None
    if engine.shard_units is not None and am.urls:
        remote = AlertmanagerEvidence(am.urls, cluster=engine.cluster, topo=engine.topology,
                                      own_units=engine.shard_units, poll_s=am.evidence_poll_seconds,
                                      shard=shard_name(engine.shard_units),
                                      timeout=min(am.timeout, am.evidence_poll_seconds))
        engine.remote = remote
    owned = sum(1 for spec in engine.topology.nodes.values()
                if engine.shard_units is None or spec.unit in engine.shard_units)
    limits = cfg.grpc_limits
    grpc_kwargs = {**grpc_auth_kwargs(cfg),
                   "max_connections": fit_descriptors(limits.connections_for(owned), limits.connection_gate),
                   "handshake_timeout": limits.handshake_timeout_s, "idle_timeout": limits.idle_timeout_s,
                   "connection_gate": limits.connection_gate}
    on_changed = resume_incidents(cfg.state_file, engine, sender) if cfg.state_file else None
    background: list[Any] = [remote] if remote is not None else []
    if cfg.remediation is not None and on_changed is not None:  # validate() requires a state_file with it
        r = build_remediator(cfg.remediation, engine, cfg.state_file, shard=sender.shard,
                             remote=remote.remote_actions if remote is not None else None)
        on_changed.extra = lambda: {"remediation": r.to_json()}
        r.persist = lambda: on_changed([], engine.newest_ts)
        background.append(r.executor)
    return AggregatorRuntime(engine, grpc_listen=cfg.grpc_listen, grpc_kwargs=grpc_kwargs,
                             http_listen=split_hostport(cfg.http_listen), sender=sender,
                             tick_seconds=cfg.tick_seconds, http_web=web, reload_status=reload_status,
                             on_changed=on_changed, background=tuple(background))


def shard_name(units: frozenset[int] | None) -> str:
    """``units 0-15`` (ranges of the owned units): how the other shards name this one."""
    if not units:
        return ""
    parts: list[str] = []
    run: list[int] = []
    for u in sorted(units):
        if run and u != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(u)
    parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return "units " + ",".join(parts)


RECONCILE_BUDGET_S = 15.0  # all Alertmanagers together, before the listeners start


def resume_incidents(path: str, engine: Engine, sender: AlertmanagerClient,
                     now: float | None = None) -> incident_store.StateSaver:
    """Restore the open incidents persisted at ``path``, note which ones Alertmanager still holds (asked
    within a bounded time, whatever it answers), and leave them to the engine's resume check: each is sent
    again only once its node's first batches show its evidence, else resolved once (resume_check.py).
    Returns the runtime's ``on_changed`` hook that persists the open incidents after every change
    (aggregator/incident_store.py)."""
    now = time.time() if now is None else now
    records, skipped = incident_store.read_state(path)
    if records:
        with engine.lock:
            # their own holds: the resume check keeps them while their nodes reconnect
            restored = incident_store.restore(engine.manager, records, now, 0.0)
        active = incident_store.reconcile_with([u.url.removesuffix("/api/v2/alerts") for u in sender.urls],
                                               per_url_s=sender.timeout, budget_s=RECONCILE_BUDGET_S)
        keep, gone = incident_store.reconcile(restored, active)
        held = {id(i) for i in keep}
        with engine.lock:
            engine.resume.restored([(i, incident_store.component_of(i.component_type, i.component, i.labels),
                                     id(i) in held) for i in restored], sender.adopt)
        log.info("incidents_resumed", file=path, at_alertmanager=len(keep), lost_by_alertmanager=len(gone),
                 skipped=skipped,
                 detail="each is sent again only once its node's first batches show it, else resolved once")
    return incident_store.StateSaver(path, engine.open_incidents, sender.alerts_for, skipped)


def run_aggregator(cfg: AggregatorConfig, stop_event: threading.Event, *, web: WebConfig | None = None,
                   reload: threading.Event | None = None,
                   load: Callable[[], AggregatorConfig] | None = None,
                   load_web: Callable[[], WebConfig | None] | None = None,
                   source: str = "aggregator config", watch_period: float | None = None) -> int:
    """Run until ``stop_event``; when ``reload`` is set (SIGHUP), ``load()`` the config (and
    ``load_web()`` the web config) again and apply it, or log why not and keep the running one
    (reload.py, in its own thread).  The token and TLS files are watched every ``watch_period`` s
    (None: filewatch.watch_period(); 0: not watched) and a change runs the same reload."""
    status = ReloadStatus()
    rt = build_runtime(cfg, web=web, reload_status=status)
    reloader = (Reloader(rt, cfg, status, load=load, load_web=load_web, web=web, source=source)
                if load is not None else None)
    # a token or certificate rewritten on disk (a Kubernetes Secret update) runs the same reload
    watch = (FileWatch(secret_files(cfg), lambda _changed: reloader.files_changed.set(), status, watch_period)
             if reloader is not None and reload is not None else None)
    try:
        rt.start()
    except OSError:
        raise  # a busy HTTP port: the CLI prints one line and exits 2
    except RuntimeError as exc:
        if "cannot listen" in str(exc):
            raise ConfigError(f"{exc} (address in use or not local)") from None
        log.error("aggregator_start_failed", error=str(exc))
        return 1
    except Exception as exc:  # report and stop cleanly
        log.error("aggregator_start_failed", error=str(exc))
        return 1
    log.info("aggregator_started", grpc=rt.grpc_address, http=cfg.http_listen, nodes=len(rt.engine.topology.nodes),
             alertmanagers=list(cfg.alertmanager.urls), clock=cfg.clock.mode)
    if reloader is not None and reload is not None:
        reloader.start(reload, stop_event)  # off the detection thread: ticks go on during a reload
    if watch is not None:
        watch.start(stop_event)
    try:
        rt.run(stop_event)
    finally:
        rt.stop()
        if reloader is not None:
            reloader.join(5.0)
        log.info("aggregator_stopped")
    return 0
