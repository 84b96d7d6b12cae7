"""The aggregator's ``remediation:`` section: what fabricmon may do to a node a fault is on, and its rails.

Off unless the section is present; present without ``mode`` it is a dry run (``dry_run``): every decision is
logged, counted and put on the incident, nothing is changed.  ``mode: act`` acts.  Durations are seconds of
sample time (DESIGN "Time"), like every window of the aggregator.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field

from ...configload import ConfigError

MODES = ("dry_run", "act")
ACTIONS = ("slurm_drain", "k8s_taint", "webhook")

# Node-local hardware faults acted on unless ``alerts`` says otherwise (DESIGN "Acting on faults").
DEFAULT_ALERTS = ("FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded", "GPUXidFatal",
                  "NVLinkDown")
# Never acted on, whatever the config says: software, straggler, hang, cable-prediction, config and job
# findings (a slow dataloader or a predicted cable is no reason to take a node out of service).
NEVER_ALERTS = frozenset({"SoftwareStraggler", "StageImbalance", "StragglerRank", "SlowRanksSharedComponent",
                          "JobHung", "FabricCableDegrading", "FabricConfigDrift", "FabricmonAgentDown",
                          "FabricmonUnknownNodes", "FabricCongestion", "FabricPFCStorm", "RDMARetransmits"})
# Fabric-wide faults: a decision is logged for them (``not_node_local``), never an action.
WIDE_ALERTS = frozenset({"FabricLeafDegraded", "FabricSpineDegraded"})

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_NODE_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!-]+")


def _err(source: str, path: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}: {path}: {problem}")


@dataclass(frozen=True)
class SlurmSettings:
    """slurm_drain: ``scontrol update NodeName=<node> State=DRAIN Reason="fabricmon: ..."`` (RESUME to undo)."""

    scontrol: str = "scontrol"  # the binary (PATH lookup) or its path
    timeout_s: float = 10.0  # one scontrol call


@dataclass(frozen=True)
class KubernetesSettings:
    """k8s_taint: taint fabricmon.io/fabric-fault=<alertname>:NoSchedule and condition FabricHealthy=False."""

    # in-cluster credentials (the ServiceAccount's mounted token and CA); api_url "" reads
    # KUBERNETES_SERVICE_HOST/PORT as client-go's rest.InClusterConfig does
    api_url: str = ""
    token_file: str = f"{SERVICE_ACCOUNT}/token"  # the ServiceAccount token (bearer)
    ca_file: str = f"{SERVICE_ACCOUNT}/ca.crt"  # the CA the API server's certificate is checked against
    timeout_s: float = 10.0  # one API request


@dataclass(frozen=True)
class WebhookSettings:
    """webhook: POST {"event": "remediate"|"undo", "node", "reason", "incident"} as JSON."""

    url: str = ""  # http(s) URL; required when an alert's actions include webhook
    timeout_s: float = 10.0  # one POST


@dataclass(frozen=True)
class RemediationSettings:
    mode: str = "dry_run"  # dry_run (log, count and annotate what it would do) or act
    actions: tuple[str, ...] = ("slurm_drain",)  # slurm_drain, k8s_taint, webhook: for each default alert
    # alert -> the actions for it (default: ``actions`` for each of DEFAULT_ALERTS); an alert not listed
    # is never acted on
    alerts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    max_nodes: int = 2  # the breaker's floor: nodes acted on per window, cluster-wide
    max_nodes_percent: float = 5.0  # of the topology's nodes
    window: float = 600.0  # seconds the breaker counts actions over
    cooldown: float = 3600.0  # seconds after an action on a node before the next one there
    undo_after: float = 1800.0  # seconds a node stays clean after its incident resolved before the undo
    undo: bool = True  # resume/untaint fabricmon's own actions after undo_after (false: leave them to a human)
    exclude: tuple[str, ...] = ()  # node names or shell patterns (node-00[0-3], gpu-*)
    retries: int = 3  # after the first attempt
    retry_backoff_s: float = 5.0  # doubled each retry (wall seconds)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)  # slurm_drain's scontrol
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)  # k8s_taint's API access
    webhook: WebhookSettings = field(default_factory=WebhookSettings)  # webhook's receiver

    def validate(self, path: str, source: str) -> None:
        p = path or "remediation"
        if self.mode not in MODES:
            raise _err(source, f"{p}.mode", f"must be dry_run or act, got {self.mode!r}")
        for name in ("max_nodes_percent", "window", "cooldown", "undo_after", "retry_backoff_s",
                     "slurm.timeout_s", "kubernetes.timeout_s", "webhook.timeout_s"):
            obj: object = self
            for part in name.split("."):
                obj = getattr(obj, part)
            v = float(obj)  # type: ignore[arg-type]
            if not math.isfinite(v) or v < 0:
                raise _err(source, f"{p}.{name}", f"must be a finite number >= 0, got {obj}")
        for name in ("window", "slurm.timeout_s", "kubernetes.timeout_s", "webhook.timeout_s"):
            obj = self
            for part in name.split("."):
                obj = getattr(obj, part)
            if not float(obj) > 0:  # type: ignore[arg-type]
                raise _err(source, f"{p}.{name}", f"must be > 0, got {obj}")
        if self.max_nodes_percent > 100:
            raise _err(source, f"{p}.max_nodes_percent", f"a percentage (0-100), got {self.max_nodes_percent}")
        if self.max_nodes < 0 or self.retries < 0:
            bad = "max_nodes" if self.max_nodes < 0 else "retries"
            raise _err(source, f"{p}.{bad}", f"must be >= 0, got {getattr(self, bad)}")
        if self.retries > 10:
            raise _err(source, f"{p}.retries", f"at most 10, got {self.retries}")
        self._check_actions(self.actions, f"{p}.actions", source)
        for alert, acts in self.alerts.items():
            if alert in NEVER_ALERTS or alert in WIDE_ALERTS:
                raise _err(source, f"{p}.alerts.{alert}", "never acted on: only node-local hardware faults "
                           "(software, straggler, hang, prediction, config and fabric-wide faults are for a human)")
            self._check_actions(acts, f"{p}.alerts.{alert}", source)
        for i, pat in enumerate(self.exclude):
            if not _NODE_PATTERN.fullmatch(pat):
                raise _err(source, f"{p}.exclude[{i}]", f"a node name or shell pattern, got {pat!r}")
        used = {a for acts in self.alert_actions().values() for a in acts}
        if "webhook" in used and not self.webhook.url.startswith(("http://", "https://")):
            raise _err(source, f"{p}.webhook.url", f"an http(s) URL is required for the webhook action, "
                       f"got {self.webhook.url!r}")
        if self.kubernetes.api_url and not self.kubernetes.api_url.startswith("https://"):
            raise _err(source, f"{p}.kubernetes.api_url", f"an https URL, got {self.kubernetes.api_url!r}")

    @staticmethod
    def _check_actions(acts: tuple[str, ...], path: str, source: str) -> None:
        if not acts:
            raise _err(source, path, f"at least one of {', '.join(ACTIONS)}")
        for i, a in enumerate(acts):
            if a not in ACTIONS:
                raise _err(source, f"{path}[{i}]", f"unknown action {a!r} (known: {', '.join(ACTIONS)})")
        if len(set(acts)) != len(acts):
            raise _err(source, path, "an action is listed twice")

    def alert_actions(self) -> dict[str, tuple[str, ...]]:
        """Alert -> its actions: ``alerts`` when given, else ``actions`` for each default alert."""
        return dict(self.alerts) if self.alerts else dict.fromkeys(DEFAULT_ALERTS, self.actions)

    def excluded(self, node: str) -> bool:
        return any(fnmatch.fnmatchcase(node, pat) for pat in self.exclude)

    def limit(self, topology_nodes: int) -> int:
        """The breaker's limit: max(max_nodes, ceil(max_nodes_percent % of the topology's nodes))."""
        return max(self.max_nodes, math.ceil(self.max_nodes_percent / 100.0 * topology_nodes - 1e-9))
