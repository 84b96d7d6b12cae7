"""The aggregator's typed configuration and the detection thresholds.

Every threshold the detectors, the straggler scorer and the correlator use
lives in ``DetectionSettings`` with a default, so a benchmark or a site can
tune it from the ``detection:`` section of the YAML file without code.
All durations are seconds of *sample time* (see DESIGN.md "Time").
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..configload import ConfigError, build, check_hostport, load_yaml_file
from .auth_settings import AuthSettings
from .credentials import load_credentials
from .remediation.config import RemediationSettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ..topology import Topology

__all__ = ["AggregatorConfig", "AlertmanagerSettings", "AuthSettings", "ClockSettings", "ConfigError",
           "DetectionSettings", "GrpcLimits", "ShardSettings", "check_files", "load_aggregator_config"]


def _positive(value: float, path: str, source: str) -> None:
    if not value > 0:  # NaN fails too
        raise ConfigError(f"{source}: {path}: must be > 0, got {value}")


def _check_numbers(obj: DataclassInstance, path: str, source: str, *, positive: frozenset[str] = frozenset(),
                   ratios: frozenset[str] = frozenset(), signed: frozenset[str] = frozenset()) -> None:
    """Every number finite and >= 0 (``signed`` ones may be negative); ``positive`` > 0;
    ``ratios`` within [0, 1].  YAML's ``.nan`` and ``.inf`` are numbers too: a NaN tick
    interval spun the aggregator at full CPU and never let it see SIGTERM."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        values = value if isinstance(value, tuple) else (value,)
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            where = f"{path}.{f.name}" if path else f.name
            if isinstance(value, tuple):
                where += f"[{i}]"
            if not math.isfinite(v):
                raise ConfigError(f"{source}: {where}: must be a finite number, got {v}")
            if f.name in positive and not v > 0:
                raise ConfigError(f"{source}: {where}: must be > 0, got {v}")
            if f.name not in signed and v < 0:
                raise ConfigError(f"{source}: {where}: must be >= 0, got {v}")
            if f.name in ratios and v > 1:
                raise ConfigError(f"{source}: {where}: must be between 0 and 1, got {v}")


@dataclass(frozen=True)
class DetectionSettings:
    # --- windows and hysteresis ---
    window_s: float = 1.0  # detection window; widened to the node's poll interval when that is longer
    persist_windows: int = 2  # raise after evidence in this many ...
    of_windows: int = 3  # ... of the last this many windows
    hold_s: float = 15.0  # resolve after the evidence was clean this long (counter evidence)
    state_hold_s: float = 10.0  # resolve hold for state evidence (link down, degraded, config, NVLink down)
    history_s: float = 120.0  # how long per-component events are kept
    # --- link errors ---
    # error counts per window of window_s seconds, i.e. rates: a window widened to the poll interval
    # needs as many errors per second (a steady 0.3/s never fires at any interval)
    link_errors_min: float = 10.0  # symbol + port_rcv (+ other PMA) errors per window_s
    link_recovery_min: float = 1.0  # link_error_recovery in one window
    phy_errors_min: float = 10.0  # rx_crc/pcs/symbol/lane phy errors per window_s
    link_errors_burst: float = 5000.0  # a single window this large raises at once
    # --- link state ---
    flap_window_s: float = 60.0
    flap_min_transitions: int = 2
    degraded_rate_ratio: float = 0.95  # ACTIVE below this share of the expected rate is degraded
    degraded_persist_s: float = 2.0
    link_down_persist_s: float = 0.0  # 0: the first DOWN sample raises
    # --- PFC ---
    pfc_pause_ratio: float = 0.5  # pause time emitted per second of window on one priority
    pfc_keep_ratio: float = 0.2
    pfc_victim_ratio: float = 0.5  # received pauses must stay below this share of the emitted ones
    # --- congestion (weak evidence) ---
    cnp_rate_min: float = 5000.0  # CNP sent + handled + ECN marked per second
    xmit_wait_rate_min: float = 5.0e4  # port_xmit_wait ticks per second
    congestion_persist_windows: int = 3
    congestion_of_windows: int = 4
    congestion_leaf_min_ports: int = 3
    # --- RDMA transport ---
    retries_min: float = 50.0  # transport retry/sequence errors per window_s
    # --- config drift ---
    config_checks: tuple[str, ...] = ("pfc", "trust", "ecn_np", "ecn_rp", "mtu")
    config_persist_s: float = 2.0
    # the hosts' RoCE priority (the agents' profile.roce_priority): lossless and ECN-marked on each host's
    # switch port too, or FabricConfigDrift check=pfc_mismatch / ecn_mismatch (gnmi_switches, sonic profile)
    roce_priority: int = 3
    # --- GPU / NVLink ---
    nvlink_errors_min: float = 10.0  # replay + crc per window_s
    nvlink_recovery_min: float = 1.0
    nvlink_down_persist_s: float = 0.0
    # The same list as the GPUXidFatal Prometheus rule (tests hold them equal).
    xid_fatal: tuple[int, ...] = (48, 61, 62, 64, 74, 79, 94, 95, 119, 120, 140)
    xid_hold_s: float = 60.0
    # --- leaf folding ---
    leaf_fold_min_links: int = 3
    leaf_fold_ratio: float = 0.5  # or this share of the leaf's links, whichever is smaller (but >= 2)
    fold_grace_s: float = 2.0  # a lone link waits this long when a neighbour on its leaf also shows evidence
    # --- agents ---
    agent_down_s: float = 15.0  # a node silent this long (sample time) while others report
    # after a (re)start no node is called down, nor listed as never connected, before max(this, 5 intervals)
    restart_grace_s: float = 60.0
    # --- stragglers ---
    straggler_z: float = 4.0
    straggler_mad_floor: float = 0.015  # MAD floor as a share of the median step time
    straggler_min_impact: float = 0.03  # lateness as a share of the median step time
    straggler_window: int = 10
    straggler_persist: int = 8
    straggler_clear: int = 3  # persistent ranks clear when fewer flags than this remain in the window
    straggler_mass_ratio: float = 0.25  # more late ranks than this share of a group: not an individual straggler
    straggler_hold_s: float = 20.0
    hang_stall_s: float = 20.0  # JobHung: no collective progress this long while heartbeats go on
    # --- cable health (FabricCableDegrading, cable_health.py) ---
    cable_bucket_s: float = 10.0  # corrected bits are summed per bucket; judged once per bucket
    cable_window_s: float = 300.0  # the trend window
    cable_min_buckets: int = 18  # a BER trend needs this many buckets (3 min) of data
    cable_min_readings: int = 6  # an RX power trend needs this many module readings
    cable_ber_slope: float = 0.08  # decades per minute (1 decade in 12.5 min)
    cable_ber_step: float = 0.15  # each third of the window above the previous by this many decades ...
    cable_ber_rise: float = 0.5  # ... and the last third above the first by this many
    cable_lane_share: float = 0.6  # one lane carrying this share of the corrected bits
    cable_rx_slope_db: float = 0.1  # dB per minute falling
    cable_rx_step_db: float = 0.15  # each third of the window below the previous by this many dB ...
    cable_rx_drop_db: float = 0.5  # ... and the last third below the first by this many
    cable_persist: int = 2  # consecutive judgements before raising
    cable_hold_s: float = 60.0  # resolve once the trend stopped this long
    # --- correlator ---
    medium_evidence: float = 2.5  # log-odds sum at which a component explains slow ranks
    prior_log_odds: float = -4.0
    # sharded (shard.units set): agent intervals a comm-late StragglerRank with no local evidence waits
    # for another shard's fabric incident on its rail to explain it before it opens (remote_evidence.py)
    cross_shard_grace_intervals: int = 3

    _POSITIVE = frozenset((
        "window_s", "persist_windows", "of_windows", "hold_s", "state_hold_s", "history_s", "link_errors_min",
        "link_recovery_min", "phy_errors_min", "link_errors_burst", "flap_window_s", "flap_min_transitions",
        "degraded_rate_ratio", "pfc_pause_ratio", "pfc_victim_ratio", "cnp_rate_min", "xmit_wait_rate_min",
        "congestion_persist_windows", "congestion_of_windows", "congestion_leaf_min_ports", "retries_min",
        "nvlink_errors_min", "nvlink_recovery_min", "xid_hold_s", "leaf_fold_min_links", "leaf_fold_ratio",
        "agent_down_s", "straggler_z", "straggler_mad_floor", "straggler_window", "straggler_persist",
        "straggler_mass_ratio", "straggler_hold_s", "hang_stall_s", "medium_evidence", "cable_bucket_s",
        "cable_window_s",
        "cable_min_buckets", "cable_min_readings", "cable_ber_slope", "cable_rx_slope_db", "cable_persist",
        "cable_hold_s", "cable_lane_share", "cable_ber_rise", "cable_rx_drop_db", "cross_shard_grace_intervals"))
    _RATIOS = frozenset(("degraded_rate_ratio", "pfc_keep_ratio", "pfc_victim_ratio", "leaf_fold_ratio",
                         "straggler_mass_ratio", "straggler_min_impact", "cable_lane_share"))

    def validate(self, path: str, source: str) -> None:
        _check_numbers(self, path, source, positive=self._POSITIVE, ratios=self._RATIOS,
                       signed=frozenset(("prior_log_odds",)))
        if not 1 <= self.persist_windows <= self.of_windows <= 16:
            raise ConfigError(f"{source}: {path}.persist_windows: need 1 <= persist_windows <= of_windows <= 16")
        if not 1 <= self.congestion_persist_windows <= self.congestion_of_windows <= 16:
            raise ConfigError(f"{source}: {path}.congestion_persist_windows: need 1 <= persist <= of <= 16")
        if not 1 <= self.straggler_persist <= self.straggler_window <= 64:
            raise ConfigError(f"{source}: {path}.straggler_persist: need 1 <= persist <= window <= 64")
        if not 0 <= self.roce_priority <= 7:
            raise ConfigError(f"{source}: {path}.roce_priority: must be 0..7, got {self.roce_priority}")
        if self.cross_shard_grace_intervals > 30:
            raise ConfigError(f"{source}: {path}.cross_shard_grace_intervals: at most 30 (a longer wait delays a "
                              f"real page), got {self.cross_shard_grace_intervals}")


@dataclass(frozen=True)
class AlertmanagerSettings:
    urls: tuple[str, ...] = ()
    resend_seconds: float = 30.0
    timeout: float = 5.0
    queue_max: int = 10000
    generator_url: str = ""  # base URL of this aggregator's HTTP API, for generatorURL
    runbook_base: str = "https://github.com/gpu-fabricmon/gpu-fabricmon/blob/main/deploy/prometheus/runbooks.md#"
    # sharded: how often the other shards' open fabric alerts are read back from Alertmanager (remote_evidence.py)
    evidence_poll_seconds: float = 5.0
    # a URL whose host is a name (a headless Service) is sent to at every address it resolves to, resolved
    # again this often (am_peers.py); 0: never expanded
    resolve_seconds: float = 30.0

    def validate(self, path: str, source: str) -> None:
        _check_numbers(self, path, source, positive=frozenset(("resend_seconds", "timeout", "queue_max",
                                                               "evidence_poll_seconds")))
        if 0 < self.resolve_seconds < 1:
            raise ConfigError(f"{source}: {path}.resolve_seconds: 0 (never) or at least 1, got {self.resolve_seconds}")
        for i, u in enumerate(self.urls):
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"{source}: {path}.urls[{i}]: expected an http(s) URL, got {u!r}")
            try:  # the sender and the name expansion (am_peers.py) read host and port from it
                parts = urlsplit(u)
                parts.port  # noqa: B018 - raises on a port out of range or not a number
            except ValueError as exc:
                raise ConfigError(f"{source}: {path}.urls[{i}]: {exc}: {u!r}") from None
            if not parts.hostname:
                raise ConfigError(f"{source}: {path}.urls[{i}]: no host: {u!r}")


@dataclass(frozen=True)
class ClockSettings:
    """What the aggregator ticks at and how far a node's sample time may stray from it
    (aggregator/admission.py).  ``wall``: the aggregator's wall clock (production).
    ``sample``: the median of the nodes' latest sample times (simulated time)."""

    mode: str = "wall"
    max_skew_s: float = 300.0  # a sample further ahead than this is rejected (and counted)
    max_age_s: float = 3600.0  # a sample older than this behind the clock is rejected (and counted)

    def validate(self, path: str, source: str) -> None:
        if self.mode not in ("wall", "sample"):
            raise ConfigError(f"{source}: {path}.mode: must be wall or sample, got {self.mode!r}")
        _check_numbers(self, path, source, positive=frozenset(("max_skew_s", "max_age_s")))


@dataclass(frozen=True)
class ShardSettings:
    """The scalable units (leaf groups) this replica owns; empty: all of them.

    A StatefulSet replica need not list them: with ``ordinal_from_hostname`` replica k (pod
    hostname ``NAME-k``) owns units k*units_per_shard .. (k+1)*units_per_shard - 1, the same rule
    agents dial by (shardmap.kubernetes_aggregator), so one config serves every replica."""

    units: tuple[int, ...] = ()
    units_per_shard: int = 0
    ordinal_from_hostname: bool = False
    # An imported topology's leaf groups by a leaf's name (its units are numbered by the import and move
    # when a leaf is added): every group holding one of these leaves is this replica's, whole.
    leaves: tuple[str, ...] = ()

    def validate(self, path: str, source: str) -> None:
        _check_numbers(self, path, source)
        if self.leaves and (self.units or self.ordinal_from_hostname):
            raise ConfigError(f"{source}: {path}.leaves: give leaves, units or ordinal_from_hostname, one of them")
        for i, leaf in enumerate(self.leaves):
            if not isinstance(leaf, str) or not leaf.strip() or "/" in leaf:
                raise ConfigError(f"{source}: {path}.leaves[{i}]: a leaf name (no '/'), got {leaf!r}")
        if self.ordinal_from_hostname:
            if self.units:
                raise ConfigError(f"{source}: {path}.units: give units or ordinal_from_hostname, not both")
            if self.units_per_shard < 1:
                raise ConfigError(f"{source}: {path}.units_per_shard: required with ordinal_from_hostname, "
                                  f"an integer >= 1, got {self.units_per_shard}")
        elif self.units_per_shard:
            raise ConfigError(f"{source}: {path}.units_per_shard: only with ordinal_from_hostname: true")

    def owned(self, hostname: str, source: str, topology: Topology | None = None) -> tuple[int, ...]:
        """The units this replica owns (empty: all); ``hostname`` gives the StatefulSet ordinal, ``topology``
        the leaf groups of ``leaves``."""
        if self.leaves:
            if topology is None:
                raise ConfigError(f"{source}: shard.leaves: needs the topology to place them")
            return topology.shape.units_of_leaves(self.leaves, f"{source}: shard.leaves")
        if not self.ordinal_from_hostname:
            return self.units
        from ..shardmap import units_of_ordinal

        m = re.fullmatch(r".+-(\d+)", hostname.split(".")[0])
        if m is None:
            raise ConfigError(f"{source}: shard.ordinal_from_hostname: hostname {hostname!r} does not end in a "
                              f"StatefulSet ordinal (NAME-K)")
        return units_of_ordinal(int(m.group(1)), self.units_per_shard)


@dataclass(frozen=True)
class GrpcLimits:
    """What a peer without a credential can hold on the gRPC port.  ``max_connections``: TCP
    connections at once (0: twice the nodes this replica owns, plus 64 for probes and reconnect
    overlap, at least 256), so an agent reconnecting while its old connection lingers always
    fits and a connection flood ends at the limit instead of the process's descriptors.
    ``handshake_timeout_s``: a connection that has not completed TLS and the HTTP/2 preface by
    then is closed (gRPC's default is 120 s).  ``idle_timeout_s``: a connection that carries no call
    for this long is closed (an agent always holds its stream; idle HTTP/2 connections answering
    PINGs would otherwise hold the connection limit for good, issue 35).  ``connection_gate``: the
    gate (aggregator/conn_gate.py) holds the port and, at ``max_connections``, evicts a connection
    that never carried an authenticated stream (the peer host holding the most of them, its oldest
    first) before refusing a new one: re-opened idle connections cannot keep agents out (issue 35).
    false: gRPC's own limit, which refuses the newest connection whoever holds the others."""

    max_connections: int = 0
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 10.0
    connection_gate: bool = True

    def validate(self, path: str, source: str) -> None:
        _check_numbers(self, path, source, positive=frozenset(("handshake_timeout_s", "idle_timeout_s")))

    def connections_for(self, nodes: int) -> int:
        return self.max_connections or max(256, 2 * nodes + 64)


@dataclass(frozen=True)
class AggregatorConfig:
    topology: str = ""
    cluster: str = ""  # default: the topology's cluster name
    grpc_listen: str = "0.0.0.0:9721"
    http_listen: str = "0.0.0.0:9722"
    tick_seconds: float = 0.25  # wall seconds between ticks
    alertmanager: AlertmanagerSettings = field(default_factory=AlertmanagerSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    clock: ClockSettings = field(default_factory=ClockSettings)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    shard: ShardSettings = field(default_factory=ShardSettings)
    grpc_limits: GrpcLimits = field(default_factory=GrpcLimits)
    # Open incidents and what was sent for them, kept across restarts (aggregator/incident_store.py);
    # "" keeps nothing (a restart forgets its open incidents).
    state_file: str = ""
    # Acting on faults (aggregator/remediation/): off unless the section is present; present, a dry run
    # until ``mode: act``
    remediation: RemediationSettings | None = None

    def validate(self, path: str, source: str) -> None:
        if not self.topology:
            raise ConfigError(f"{source}: topology: required (path to the topology YAML)")
        check_hostport(self.grpc_listen, "grpc_listen", source)
        check_hostport(self.http_listen, "http_listen", source)
        _positive(self.tick_seconds, "tick_seconds", source)
        if not math.isfinite(self.tick_seconds) or self.tick_seconds > 60:
            raise ConfigError(f"{source}: tick_seconds: must be at most 60, got {self.tick_seconds}")
        self.auth.validate("auth", source)  # also when the file has no auth section at all
        if self.remediation is not None and not self.state_file:
            raise ConfigError(f"{source}: remediation: needs state_file (the circuit breaker and what fabricmon "
                              "did to each node are kept there across restarts)")


def _readable(path: str) -> str | None:
    """None when ``path`` is a readable regular file, else the problem."""
    p = Path(path)
    if not p.exists():
        return f"no such file {path}"
    if not p.is_file():
        return f"not a regular file: {path}"
    if not os.access(p, os.R_OK):
        return f"not readable: {path}"
    return None


def state_dir_problem(directory: Path) -> str | None:
    """None when the aggregator can keep its state file in ``directory``: it exists and is writable, or
    it does not exist yet and its nearest existing parent is a writable directory (the aggregator makes
    it at start; systemd's StateDirectory= makes it only when the unit first starts, after an
    install's check-config)."""
    if directory.is_dir():
        return None if os.access(directory, os.W_OK | os.X_OK) else f"directory {directory} is not writable"
    parent = directory
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} (above {directory}) is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {directory} does not exist and {parent} is not writable to make it"
    return None


def state_file_problem(path: str) -> str | None:
    """None when ``path`` can be the state file: written by replacing it (atomic rename), so it must be
    a regular file or not exist yet, in a directory state_dir_problem accepts (issue 35: a directory
    there made every save fail)."""
    if path.endswith("/"):
        return f"{path} names a directory, not a file"
    p = Path(path)
    if p.exists() and not p.is_file():
        return f"{path} exists and is not a regular file" + (" (a directory)" if p.is_dir() else "")
    return state_dir_problem(p.parent)


def check_files(cfg: AggregatorConfig, source: str, *, parse_topology: bool = True) -> None:
    """Every file the config names exists and is readable, and the ones the aggregator parses
    parse: what ``check-config`` and the aggregator's start check alike.  A reload passes
    ``parse_topology=False``: it parses the topology itself, once, and only when it changed."""
    problem = _readable(cfg.topology)
    if problem:
        raise ConfigError(f"{source}: topology: {problem}")
    if cfg.state_file:
        problem = state_file_problem(cfg.state_file)
        if problem:
            raise ConfigError(f"{source}: state_file: {problem}")
    for name, path in cfg.auth.files():
        problem = _readable(path)
        if problem:
            raise ConfigError(f"{source}: auth.{name}: {problem}")
    from ..topology import load_topology

    load_credentials(cfg.auth, source)
    if parse_topology:
        topo = load_topology(cfg.topology)
        if cfg.shard.leaves:  # every leaf named is one of the topology's
            topo.shape.units_of_leaves(cfg.shard.leaves, f"{source}: shard.leaves")


def load_aggregator_config(path: str | Path) -> AggregatorConfig:
    """Load the YAML file; a relative topology path is relative to the config file."""
    data = load_yaml_file(path)
    cfg = build(AggregatorConfig, data, "", str(path))
    topo = Path(cfg.topology)
    if not topo.is_absolute():
        from dataclasses import replace

        cfg = replace(cfg, topology=str(Path(path).parent / topo))
    return cfg
