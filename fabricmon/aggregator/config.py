"""The aggregator's typed configuration and the detection thresholds.

Every threshold the detectors, the straggler scorer and the correlator use
lives in ``DetectionSettings`` with a default, so a benchmark or a site can
tune it from the ``detection:`` section of the YAML file without code.
All durations are seconds of *sample time* (see DESIGN.md "Time").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..configload import ConfigError, build, check_hostport, load_yaml_file

__all__ = ["AggregatorConfig", "AlertmanagerSettings", "AuthSettings", "ConfigError", "DetectionSettings",
           "ShardSettings", "load_aggregator_config"]


def _positive(value: float, path: str, source: str) -> None:
    if value <= 0:
        raise ConfigError(f"{source}: {path}: must be > 0, got {value}")


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
    link_errors_min: float = 10.0  # symbol + port_rcv (+ other PMA) errors in one window
    link_recovery_min: float = 1.0  # link_error_recovery in one window
    phy_errors_min: float = 10.0  # rx_crc/pcs/symbol/lane phy errors in one window
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
    retries_min: float = 50.0  # transport retry/sequence errors in one window
    # --- config drift ---
    config_checks: tuple[str, ...] = ("pfc", "trust", "ecn_np", "ecn_rp", "mtu")
    config_persist_s: float = 2.0
    # --- GPU / NVLink ---
    nvlink_errors_min: float = 10.0  # replay + crc in one window
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
    # --- stragglers ---
    straggler_z: float = 4.0
    straggler_mad_floor: float = 0.015  # MAD floor as a share of the median step time
    straggler_min_impact: float = 0.03  # lateness as a share of the median step time
    straggler_window: int = 10
    straggler_persist: int = 8
    straggler_clear: int = 3  # persistent ranks clear when fewer flags than this remain in the window
    straggler_mass_ratio: float = 0.25  # more late ranks than this share of a group: not an individual straggler
    straggler_hold_s: float = 20.0
    # --- correlator ---
    medium_evidence: float = 2.5  # log-odds sum at which a component explains slow ranks
    prior_log_odds: float = -4.0

    def validate(self, path: str, source: str) -> None:
        for name in ("window_s", "hold_s", "state_hold_s", "history_s", "flap_window_s", "pfc_pause_ratio"):
            _positive(getattr(self, name), f"{path}.{name}", source)
        if not 1 <= self.persist_windows <= self.of_windows <= 16:
            raise ConfigError(f"{source}: {path}.persist_windows: need 1 <= persist_windows <= of_windows <= 16")
        if not 1 <= self.congestion_persist_windows <= self.congestion_of_windows <= 16:
            raise ConfigError(f"{source}: {path}.congestion_persist_windows: need 1 <= persist <= of <= 16")
        if not 1 <= self.straggler_persist <= self.straggler_window <= 64:
            raise ConfigError(f"{source}: {path}.straggler_persist: need 1 <= persist <= window <= 64")


@dataclass(frozen=True)
class AlertmanagerSettings:
    urls: tuple[str, ...] = ()
    resend_seconds: float = 30.0
    timeout: float = 5.0
    queue_max: int = 10000
    generator_url: str = ""  # base URL of this aggregator's HTTP API, for generatorURL
    runbook_base: str = "https://github.com/fabricmon/fabricmon/blob/main/docs/runbooks.md#"

    def validate(self, path: str, source: str) -> None:
        _positive(self.resend_seconds, f"{path}.resend_seconds", source)
        _positive(self.timeout, f"{path}.timeout", source)
        _positive(self.queue_max, f"{path}.queue_max", source)
        for i, u in enumerate(self.urls):
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"{source}: {path}.urls[{i}]: expected an http(s) URL, got {u!r}")


@dataclass(frozen=True)
class AuthSettings:
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None

    def validate(self, path: str, source: str) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(f"{source}: {path}.tls_key: tls_cert and tls_key must be given together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError(f"{source}: {path}.tls_client_ca: needs tls_cert and tls_key")


@dataclass(frozen=True)
class ShardSettings:
    """The scalable units (leaf groups) this replica owns; empty: all of them."""

    units: tuple[int, ...] = ()


@dataclass(frozen=True)
class AggregatorConfig:
    topology: str = ""
    cluster: str = ""  # default: the topology's cluster name
    grpc_listen: str = "0.0.0.0:9721"
    http_listen: str = "0.0.0.0:9722"
    tick_seconds: float = 0.25  # wall seconds between ticks
    alertmanager: AlertmanagerSettings = field(default_factory=AlertmanagerSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    shard: ShardSettings = field(default_factory=ShardSettings)

    def validate(self, path: str, source: str) -> None:
        if not self.topology:
            raise ConfigError(f"{source}: topology: required (path to the topology YAML)")
        check_hostport(self.grpc_listen, "grpc_listen", source)
        check_hostport(self.http_listen, "http_listen", source)
        _positive(self.tick_seconds, "tick_seconds", source)


def load_aggregator_config(path: str | Path) -> AggregatorConfig:
    """Load the YAML file; a relative topology path is relative to the config file."""
    data = load_yaml_file(path)
    cfg = build(AggregatorConfig, data, "", str(path))
    topo = Path(cfg.topology)
    if not topo.is_absolute():
        from dataclasses import replace

        cfg = replace(cfg, topology=str(Path(path).parent / topo))
    return cfg
