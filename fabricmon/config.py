"""The agent's typed configuration (YAML file, then command-line flags on top)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .configload import ConfigError, build, check_hostport, check_range, check_regexes, load_yaml_file
from .textcheck import node_name_problem, valid_ifname

__all__ = ["AgentConfig", "ConfigError", "load_agent_config"]

# Documented ranges of the agent's numeric settings (README "Configuration").
# Every bound is finite: NaN and infinities are refused already when the YAML
# value is converted, and a command-line value is checked against these again.
INTERVAL_RANGE = (0.01, 3600.0)  # seconds; .inf would poll once and look ready forever
LINK_WATCH_RANGE = (0.1, 3600.0)  # seconds; 0 disables the link watch
TIMEOUT_RANGE = (0.001, 600.0)  # seconds, per source poll
SPOOL_BYTES_RANGE = (4096, 1 << 40)
MTU_RANGE = (68, 65535)
RATE_GBPS_RANGE = (0.001, 10_000.0)  # 12X XDR is 2400 Gb/s
RAIL_RANGE = (0, 1023)
EXPECTED_PORTS_RANGE = (0, 4096)


def _positive(value: float, path: str, source: str) -> None:
    """> 0 and finite (NaN fails every comparison, so ``value <= 0`` alone lets it through)."""
    if not math.isfinite(value):
        raise ConfigError(f"{source}: {path}: must be a finite number, got {value}")
    if value <= 0:
        raise ConfigError(f"{source}: {path}: must be > 0, got {value}")


def _timeout(value: float, path: str, source: str) -> None:
    _positive(value, path, source)
    check_range(value, *TIMEOUT_RANGE, path, source, "s")


@dataclass(frozen=True)
class InfinibandConfig:
    enabled: bool = True
    include: tuple[str, ...] = ()  # device-name regexes; empty means all
    exclude: tuple[str, ...] = ()  # filtered before any read: reads cost firmware commands
    timeout: float = 0.5
    # RDMA ports this node must have.  None: at least one, since the source is
    # enabled; 0: none expected (a node without RDMA, no warning).  Fewer found
    # is logged and exposed as Inventory.expected_but_missing.
    expected_ports: int | None = None

    @property
    def min_ports(self) -> int:
        return 1 if self.expected_ports is None else self.expected_ports

    def validate(self, path: str, source: str) -> None:
        check_regexes(self.include, f"{path}.include", source)
        check_regexes(self.exclude, f"{path}.exclude", source)
        if self.expected_ports is not None:
            check_range(self.expected_ports, *EXPECTED_PORTS_RANGE, f"{path}.expected_ports", source)
        _timeout(self.timeout, f"{path}.timeout", source)


@dataclass(frozen=True)
class EthtoolConfig:
    enabled: bool = True
    interfaces: tuple[str, ...] = ()  # extra netdevs beyond those backing RDMA ports
    allow: tuple[str, ...] = ()  # regexes of extra stat names exported as fabricmon_ethtool_stat
    timeout: float = 0.5

    def validate(self, path: str, source: str) -> None:
        check_regexes(self.allow, f"{path}.allow", source)
        for i, name in enumerate(self.interfaces):
            if not valid_ifname(name):
                raise ConfigError(f"{source}: {path}.interfaces[{i}]: not a netdev name "
                                  f"(1-15 characters, no '/', ':' or spaces), got {name!r}")
        _timeout(self.timeout, f"{path}.timeout", source)


@dataclass(frozen=True)
class NvmlConfig:
    timeout: float = 2.0

    def validate(self, path: str, source: str) -> None:
        _timeout(self.timeout, f"{path}.timeout", source)


@dataclass(frozen=True)
class HostConfig:
    enabled: bool = True
    timeout: float = 0.5

    def validate(self, path: str, source: str) -> None:
        _timeout(self.timeout, f"{path}.timeout", source)


@dataclass(frozen=True)
class FabricConfigConfig:
    enabled: bool = True
    timeout: float = 0.5

    def validate(self, path: str, source: str) -> None:
        _timeout(self.timeout, f"{path}.timeout", source)


@dataclass(frozen=True)
class TransceiverConfig:
    """Module EEPROM readings (temperature, Vcc, per-lane power and bias, alarm flags).  Off by default:
    the module EEPROM ioctl needs CAP_NET_ADMIN, and each read is a slow I2C transaction, so it runs
    on its own thread every ``interval`` seconds and the 1 s poll serves the last readings."""

    enabled: bool = False
    interval: float = 60.0

    def validate(self, path: str, source: str) -> None:
        if not 10.0 <= self.interval <= 3600.0:
            raise ConfigError(f"{source}: {path}.interval: must be 10..3600 seconds, got {self.interval}")


@dataclass(frozen=True)
class IbSwitchesConfig:
    """The in-band sweep of every switch port (DESIGN.md "The switch side of the fabric").  Off by default:
    enabled on one node per subnet or plane, it reads the switches' PMAs from this node's HCA with
    infiniband-diags on its own thread; the poll serves the last complete sweep."""

    enabled: bool = False
    ca: str | None = None  # -C: the HCA to sweep from (default: the tools' own choice, the first LinkUp port)
    ca_port: int | None = None  # -P
    concurrency: int = 4  # tool processes (queries) in flight
    timeout_ms: int = 1000  # per MAD (-t); a query's deadline is four of them (libibmad retries 3 times) + 2 s
    retries: int = 1  # a failed query is run again this many times before the switch counts as unreachable
    exclude: tuple[str, ...] = ()  # switch names or GUIDs (0x...) never queried
    rediscover_interval: float = 300.0  # ibnetdiscover --cache: the map, never per sweep
    health_interval: float = 10.0  # AllPortSelect probe per switch, PortInfo of switch-to-switch cables
    full_interval: float = 60.0  # every port's counters (perfquery -x -l, one process per switch) and PortInfo
    node_name_map: str | None = None  # OpenSM's node-name-map, as `fabricmon topology import` takes it
    # tools: the real sweep (infiniband-diags on its own thread); fake:FILE: the last sweep from a JSON file the
    # simulator writes (sources/ib_switches/backend_fake.py), as nvml: fake:FILE
    backend: str = "tools"
    # how each health sweep reads every cabled switch port's PortInfo: `walk`, one `iblinkinfo` process (a
    # discovery walk: ~2.7 SMPs per switch port, CAs included); `smpquery`, one process per port (fewer
    # MADs, thousands of processes: switch-to-switch cables between full reads, every port on full reads)
    port_state: str = "walk"

    @property
    def fake_file(self) -> str | None:
        return self.backend[5:] if self.backend.startswith("fake:") else None

    def validate(self, path: str, source: str) -> None:
        if not (self.backend == "tools" or (self.backend.startswith("fake:") and len(self.backend) > 5)):
            raise ConfigError(f"{source}: {path}.backend: must be tools or fake:FILE, got {self.backend!r}")
        if self.port_state not in ("walk", "smpquery"):
            raise ConfigError(f"{source}: {path}.port_state: must be walk or smpquery, got {self.port_state!r}")
        check_range(self.concurrency, 1, 64, f"{path}.concurrency", source)
        check_range(self.timeout_ms, 10, 60_000, f"{path}.timeout_ms", source, "ms")
        check_range(self.retries, 0, 10, f"{path}.retries", source)
        if self.ca_port is not None:
            check_range(self.ca_port, 1, 254, f"{path}.ca_port", source)
        if self.ca is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.ca):
            raise ConfigError(f"{source}: {path}.ca: not an RDMA device name: {self.ca!r}")
        check_range(self.health_interval, 1.0, 3600.0, f"{path}.health_interval", source, "s")
        check_range(self.full_interval, self.health_interval, 86400.0, f"{path}.full_interval", source,
                    "s (at least health_interval)")
        check_range(self.rediscover_interval, self.health_interval, 86400.0, f"{path}.rediscover_interval",
                    source, "s (at least health_interval)")
        for i, item in enumerate(self.exclude):
            if not item.strip():
                raise ConfigError(f"{source}: {path}.exclude[{i}]: empty switch name")


# Where a service account's credentials are mounted in every pod (Kubernetes "Accessing the API
# from a pod"); the API server's address comes from KUBERNETES_SERVICE_HOST/PORT.
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# Kubernetes label keys and values (apimachinery's validation): an optional DNS-subdomain prefix and "/",
# then a name of 1-63 characters.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class PodResourcesConfig:
    """Jobs of the pods the kubelet gave this node's GPUs: the kubelet's PodResources ``List`` on
    ``socket`` (GPU device ids of ``resources`` to pods), each pod's job from the first of
    ``job_labels`` it carries, read from the API server with the agent's service account (``get`` on
    pods).  ``enabled`` unset: on where ``socket`` exists and the agent runs in a pod
    (KUBERNETES_SERVICE_HOST) or ``api_server`` is given."""

    enabled: bool | None = None
    socket: str = PODRESOURCES_SOCKET
    # the NVIDIA device plugin's resources: whole GPUs (MIG devices too under its mig strategy "single"), and
    # MIG devices under "mixed" (nvidia.com/mig-1g.10gb ...); a name ending in "*" is a prefix
    resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")
    job_labels: tuple[str, ...] = ("fabricmon.io/job", "batch.kubernetes.io/job-name", "job-name")
    # the job's identity across its pods and nodes; else "<namespace>:<job>"
    job_id_labels: tuple[str, ...] = ("fabricmon.io/job-id", "batch.kubernetes.io/controller-uid", "controller-uid")
    unlabelled: bool = True  # a GPU pod with none of job_labels is listed as job "<namespace>/<pod>"
    api_server: str = ""  # empty: in-cluster, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    token_file: str = f"{SA_DIR}/token"
    ca_file: str = f"{SA_DIR}/ca.crt"
    interval: float = 10.0  # seconds between reads (in the background: a hung kubelet never holds a poll)
    timeout: float = 5.0  # per kubelet or API server call
    label_ttl: float = 300.0  # seconds a pod's labels are kept before they are read again

    def validate(self, path: str, source: str) -> None:
        if not self.socket.startswith("/"):
            raise ConfigError(f"{source}: {path}.socket: need an absolute path, got {self.socket!r}")
        if not self.resources:
            raise ConfigError(f"{source}: {path}.resources: need at least one resource name (nvidia.com/gpu)")
        for i, r in enumerate(self.resources):
            if not _RESOURCE_NAME.match(r.removesuffix("-*").removesuffix("*")):
                raise ConfigError(f"{source}: {path}.resources[{i}]: not an extended resource name "
                                  f"(vendor/name, e.g. nvidia.com/gpu), got {r!r}")
        for name, keys in (("job_labels", self.job_labels), ("job_id_labels", self.job_id_labels)):
            for i, k in enumerate(keys):
                if not _LABEL_KEY.match(k):
                    raise ConfigError(f"{source}: {path}.{name}[{i}]: not a Kubernetes label key, got {k!r}")
        if not self.job_labels and not self.unlabelled:
            raise ConfigError(f"{source}: {path}: job_labels is empty and unlabelled is false: no pod would be listed")
        if self.api_server and not self.api_server.startswith("https://"):
            raise ConfigError(f"{source}: {path}.api_server: must be an https:// URL, got {self.api_server!r}")
        check_range(self.interval, 1.0, 3600.0, f"{path}.interval", source, "s")
        _timeout(self.timeout, f"{path}.timeout", source)
        check_range(self.label_ttl, 0.0, 86400.0, f"{path}.label_ttl", source, "s")


GNMI_PROFILES = ("openconfig", "sonic")  # sources/gnmi_switches/profiles.py: what each subscribes
_SWITCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


@dataclass(frozen=True)
class GnmiTargetConfig:
    """One switch: its name as the topology names it (the leaf or spine), where its gNMI server listens,
    how it is trusted, and which data model it speaks."""

    name: str = ""  # the switch's name as the topology names it (its leaf or spine name): the switch label
    address: str = ""  # HOST:PORT of the switch's gNMI server (SONiC telemetry 8080, Cumulus 9339, EOS 6030)
    profile: str = "openconfig"  # openconfig | sonic: which paths are subscribed and how they read
    tls_ca: str | None = None  # PEM bundle that signed the switch's certificate (TLS unless insecure)
    tls_server_name: str | None = None  # the name the switch's certificate carries, when not the address's host
    username_file: str | None = None  # gNMI username and password (metadata), read at connect and SIGHUP
    password_file: str | None = None  # (its trailing newline is not part of the password)
    insecure: bool = False  # plaintext gRPC: labs and tests only

    def validate(self, path: str, source: str) -> None:
        if not _SWITCH_NAME.fullmatch(self.name):
            raise ConfigError(f"{source}: {path}.name: a switch name (letters, digits, _.:-), got {self.name!r}")
        if not self.address:
            raise ConfigError(f"{source}: {path}.address: required (HOST:PORT of the switch's gNMI server)")
        check_hostport(self.address, f"{path}.address", source)
        if self.profile not in GNMI_PROFILES:
            raise ConfigError(f"{source}: {path}.profile: must be one of {', '.join(GNMI_PROFILES)}, "
                              f"got {self.profile!r}")
        if not self.insecure and not self.tls_ca:
            raise ConfigError(f"{source}: {path}.tls_ca: required unless insecure: true (gNMI carries "
                              f"credentials: never in plaintext by accident)")
        if self.insecure and self.tls_ca:
            raise ConfigError(f"{source}: {path}: give tls_ca or insecure: true, not both")
        if bool(self.username_file) != bool(self.password_file):
            raise ConfigError(f"{source}: {path}: username_file and password_file go together")


@dataclass(frozen=True)
class GnmiSwitchesConfig:
    """gNMI Subscribe (STREAM, SAMPLE every ``interval``) to Ethernet switches.  Off by default: enabled on
    one node per fabric, it keeps one connection per switch on a thread of its own; the poll serves the
    last values.  A switch that is unreachable, stalls, sends garbage or oversized updates costs its own
    series and is counted by reason (``fabricmon_switch_gnmi_failures_total``)."""

    enabled: bool = False  # on one node per fabric (flag: none; set it in the file)
    targets: tuple[GnmiTargetConfig, ...] = ()  # the switches, each one connection
    interval: float = 10.0  # SAMPLE interval asked of every switch
    max_series: int = 20000  # per switch: series beyond it are refused and counted (series_limit)
    max_message_bytes: int = 4 * 1024 * 1024  # a larger update ends that switch's stream (oversize)
    stall_intervals: float = 3.0  # no message for this many intervals: the stream is stalled, reconnect
    connect_timeout: float = 10.0  # seconds for the channel to become ready
    backoff_min: float = 1.0  # first reconnect delay; doubles per failure (jittered) up to backoff_max
    backoff_max: float = 120.0  # the longest reconnect delay

    def validate(self, path: str, source: str) -> None:
        check_range(self.interval, 1.0, 3600.0, f"{path}.interval", source, "s")
        check_range(self.max_series, 100, 1_000_000, f"{path}.max_series", source)
        check_range(self.max_message_bytes, 64 * 1024, 256 * 1024 * 1024, f"{path}.max_message_bytes", source,
                    "bytes")
        check_range(self.stall_intervals, 1.5, 100.0, f"{path}.stall_intervals", source)
        check_range(self.connect_timeout, 0.1, 300.0, f"{path}.connect_timeout", source, "s")
        check_range(self.backoff_min, 0.01, 3600.0, f"{path}.backoff_min", source, "s")
        check_range(self.backoff_max, self.backoff_min, 3600.0, f"{path}.backoff_max", source,
                    "s (at least backoff_min)")
        check_range(len(self.targets), 0, 4096, f"{path}.targets", source, "switches")
        seen: dict[str, int] = {}
        for i, t in enumerate(self.targets):
            if t.name in seen:
                raise ConfigError(f"{source}: {path}.targets[{i}].name: {t.name!r} already names "
                                  f"targets[{seen[t.name]}]")
            seen[t.name] = i
        if self.enabled and not self.targets:
            raise ConfigError(f"{source}: {path}.targets: enabled with no switch to subscribe to")


@dataclass(frozen=True)
class JobsConfig:
    """Which job holds which GPUs, for jobs that never report a step: the Slurm prolog's job files in
    ``dir`` (``fabricmon slurm-prolog``; under ``host_root``) and, on Kubernetes, the kubelet's
    PodResources (``kubernetes``)."""

    enabled: bool = True
    dir: str = "/run/fabricmon/jobs"
    released_keep: float = 300.0  # seconds a released job stays exported at 0, so the aggregator sees it go
    timeout: float = 1.0
    kubernetes: PodResourcesConfig = field(default_factory=PodResourcesConfig)

    def validate(self, path: str, source: str) -> None:
        _timeout(self.timeout, f"{path}.timeout", source)
        if not self.dir:
            raise ConfigError(f"{source}: {path}.dir: must not be empty")
        if not 0.0 <= self.released_keep <= 86400.0:
            raise ConfigError(f"{source}: {path}.released_keep: must be 0..86400 seconds, got {self.released_keep}")


@dataclass(frozen=True)
class SourcesConfig:
    infiniband: InfinibandConfig = field(default_factory=InfinibandConfig)
    ethtool: EthtoolConfig = field(default_factory=EthtoolConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    host: HostConfig = field(default_factory=HostConfig)
    fabric_config: FabricConfigConfig = field(default_factory=FabricConfigConfig)
    transceiver: TransceiverConfig = field(default_factory=TransceiverConfig)
    ib_switches: IbSwitchesConfig = field(default_factory=IbSwitchesConfig)
    gnmi_switches: GnmiSwitchesConfig = field(default_factory=GnmiSwitchesConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)


@dataclass(frozen=True)
class ProfileConfig:
    """The lossless-fabric profile rail NICs are checked against."""

    roce_priority: int = 3
    trust: str = "dscp"
    pfc_priorities: tuple[int, ...] = (3,)
    mtu: int = 9000
    rate_gbps: float = 400.0
    width: int = 4

    def validate(self, path: str, source: str) -> None:
        if not 0 <= self.roce_priority <= 7:
            raise ConfigError(f"{source}: {path}.roce_priority: must be 0..7, got {self.roce_priority}")
        for i, p in enumerate(self.pfc_priorities):
            if not 0 <= p <= 7:
                raise ConfigError(f"{source}: {path}.pfc_priorities[{i}]: must be 0..7, got {p}")
        if self.trust not in ("dscp", "pcp"):
            raise ConfigError(f"{source}: {path}.trust: must be dscp or pcp, got {self.trust!r}")
        if self.width not in (1, 2, 4, 8, 12):
            raise ConfigError(f"{source}: {path}.width: must be 1, 2, 4, 8 or 12, got {self.width}")
        _positive(self.rate_gbps, f"{path}.rate_gbps", source)
        check_range(self.rate_gbps, *RATE_GBPS_RANGE, f"{path}.rate_gbps", source, "Gb/s")
        check_range(self.mtu, *MTU_RANGE, f"{path}.mtu", source, "bytes")


@dataclass(frozen=True)
class StreamConfig:
    """Agent -> aggregator stream settings."""

    token_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    spool_dir: str = "/var/lib/fabricmon/spool"
    spool_max_bytes: int = 64 * 1024 * 1024

    def validate(self, path: str, source: str) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(f"{source}: {path}.tls_key: tls_cert and tls_key must be given together")
        check_range(self.spool_max_bytes, *SPOOL_BYTES_RANGE, f"{path}.spool_max_bytes", source, "bytes")


@dataclass(frozen=True)
class IntakeConfig:
    """Rank-timing intake on the node (loopback and a Unix socket only)."""

    listen: str | None = "127.0.0.1:9723"
    socket: str | None = "/run/fabricmon/ranks.sock"
    # Bounds on what clients and NCCL Inspector files can make the agent hold (series drops are counted).
    max_jobs: int = 64
    max_series: int = 4096            # (job, rank) series
    series_ttl: float = 600.0         # seconds of silence before a series or job is forgotten
    max_connections: int = 64         # per listener (Unix socket, HTTP)
    idle_timeout: float = 300.0       # seconds without a byte before a Unix socket client is cut off
    nccl_max_series: int = 2048       # (rank, comm, collective) series
    nccl_series_ttl: float = 3600.0
    # Unix socket permissions.  0666: training jobs of every user on the node reach it, the same
    # reach the loopback HTTP listener gives every local user; 0660 limits it to the agent's group
    # (under systemd's DynamicUser no job shares that group: they fall back to HTTP, or fail without it).
    socket_mode: int = 0o666

    def validate(self, path: str, source: str) -> None:
        if type(self.socket_mode) is not int or not 0 <= self.socket_mode <= 0o777:
            raise ConfigError(f"{source}: {path}.socket_mode: must be an octal file mode 0000..0777 "
                              f"(write it unquoted: 0666), got {self.socket_mode!r}")
        for key in ("max_jobs", "max_series", "series_ttl", "max_connections", "idle_timeout", "nccl_max_series",
                    "nccl_series_ttl"):
            _positive(getattr(self, key), f"{path}.{key}", source)
        check_hostport(self.listen, f"{path}.listen", source)
        if self.listen is not None:
            host = self.listen.rpartition(":")[0].strip("[]")
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise ConfigError(f"{source}: {path}.listen: rank intake must listen on loopback, got {host!r}")


@dataclass(frozen=True)
class LogConfig:
    format: str = "auto"  # auto: console on a TTY, JSON otherwise
    level: str = "info"

    def validate(self, path: str, source: str) -> None:
        if self.format not in ("auto", "json", "console"):
            raise ConfigError(f"{source}: {path}.format: must be auto, json or console, got {self.format!r}")
        if self.level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"{source}: {path}.level: must be debug, info, warning or error, got {self.level!r}")


UNIT_RANGE = (0, 1 << 20)


@dataclass(frozen=True)
class KubernetesShardsConfig:
    """Aggregator replicas are a StatefulSet behind a headless Service: replica k owns units
    k*units_per_shard .. (k+1)*units_per_shard - 1 (shardmap.kubernetes_aggregator)."""

    units_per_shard: int = 0
    namespace: str = "fabricmon"
    port: int = 9721

    def validate(self, path: str, source: str) -> None:
        if self.units_per_shard < 1:
            raise ConfigError(f"{source}: {path}.units_per_shard: required, an integer >= 1, "
                              f"got {self.units_per_shard}")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.namespace):
            raise ConfigError(f"{source}: {path}.namespace: not a Kubernetes namespace name "
                              f"(lower-case DNS label), got {self.namespace!r}")
        check_range(self.port, 1, 65535, f"{path}.port", source)


@dataclass(frozen=True)
class NodeLabelConfig:
    """Read this node's unit from a label on its Kubernetes Node object (GET /api/v1/nodes/NAME
    with the pod's service-account token; the agent's ClusterRole needs get on nodes)."""

    key: str = "fabricmon.io/unit"
    api_server: str = ""  # empty: in-cluster, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    token_file: str = f"{SA_DIR}/token"
    ca_file: str = f"{SA_DIR}/ca.crt"
    timeout: float = 5.0

    def validate(self, path: str, source: str) -> None:
        if not self.key or " " in self.key:
            raise ConfigError(f"{source}: {path}.key: a node label key (e.g. fabricmon.io/unit), got {self.key!r}")
        if self.api_server and not self.api_server.startswith("https://"):
            raise ConfigError(f"{source}: {path}.api_server: must be an https:// URL, got {self.api_server!r}")
        _timeout(self.timeout, f"{path}.timeout", source)


@dataclass(frozen=True)
class ShardConfig:
    """Sharded aggregators: the agent streams to the replica owning its scalable unit.

    Replicas from ``map`` (a static shard map, bare metal) or ``kubernetes`` (StatefulSet names);
    the unit from, first that answers: ``unit`` (or --unit, or $FABRICMON_UNIT), the node's entry
    in ``topology``, the node's label (``node_label``, read from the API server at run time)."""

    map: str | None = None
    kubernetes: KubernetesShardsConfig | None = None
    unit: int | None = None
    topology: str | None = None
    node_label: NodeLabelConfig | None = None
    # the replica (its position in ``map``, or its StatefulSet ordinal) that takes nodes missing from
    # ``topology``: they are monitored there without rail or leaf (DESIGN "Topology from the fabric")
    unknown_owner: int = 0

    def validate(self, path: str, source: str) -> None:
        if (self.map is None) == (self.kubernetes is None):
            raise ConfigError(f"{source}: {path}: give exactly one of map (a shard map file) or kubernetes "
                              f"(StatefulSet replicas)")
        if self.map == "":
            raise ConfigError(f"{source}: {path}.map: empty path")
        if self.unit is None and not self.topology and self.node_label is None:
            raise ConfigError(f"{source}: {path}: the node's unit is unknown: give unit, topology or node_label")
        if self.unit is not None:
            check_range(self.unit, *UNIT_RANGE, f"{path}.unit", source)
        check_range(self.unknown_owner, *UNIT_RANGE, f"{path}.unknown_owner", source)


@dataclass(frozen=True)
class AgentConfig:
    sysfs_root: str = "/sys"
    # Where the host's / is seen (like node_exporter's --path.rootfs): the host source reads
    # HOST_ROOT/proc.  In a container that is a hostPath mount of / (e.g. /host).
    host_root: str = "/"
    ethtool_dir: str | None = None
    node_name: str | None = None
    listen: str = "0.0.0.0:9720"
    interval: float = 1.0
    # true: polls fall on the multiples of interval of the wall clock, so a cluster's agents poll at the
    # same instants (clocks under NTP) and the aggregator takes their batches together, which costs it far
    # less CPU than batches spread over the interval (agent/poller.py); false: every interval from the start.
    align_polls: bool = True
    link_watch_interval: float = 1.0
    nvml: str = "auto"
    aggregator: str | None = None
    nccl_inspector_dir: str | None = None
    rails: dict[str, int] = field(default_factory=dict)  # device -> rail; default: device order
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    intake: IntakeConfig = field(default_factory=IntakeConfig)
    log: LogConfig = field(default_factory=LogConfig)
    shard: ShardConfig | None = None  # instead of aggregator: the replica that owns this node's unit

    def validate(self, path: str, source: str) -> None:
        check_hostport(self.listen, "listen", source)
        check_hostport(self.aggregator, "aggregator", source)
        if self.aggregator and self.shard is not None:
            raise ConfigError(f"{source}: shard: give aggregator (one address) or shard (the replica owning "
                              f"this node's unit), not both")
        _positive(self.interval, "interval", source)
        check_range(self.interval, *INTERVAL_RANGE, "interval", source, "s")
        if not math.isfinite(self.link_watch_interval):
            raise ConfigError(f"{source}: link_watch_interval: must be a finite number, got {self.link_watch_interval}")
        if self.link_watch_interval != 0:
            check_range(self.link_watch_interval, *LINK_WATCH_RANGE, "link_watch_interval", source,
                        "s (or 0 to disable)")
        if not self.host_root or not self.host_root.startswith("/"):
            raise ConfigError(f"{source}: host_root: must be an absolute path, got {self.host_root!r}")
        if not (self.nvml in ("auto", "off") or (self.nvml.startswith("fake:") and len(self.nvml) > 5)):
            raise ConfigError(f"{source}: nvml: must be auto, off or fake:FILE, got {self.nvml!r}")
        for dev, rail in self.rails.items():
            check_range(rail, *RAIL_RANGE, f"rails.{dev}", source)
        if self.node_name is not None:
            why = node_name_problem(self.node_name)
            if why is not None:
                raise ConfigError(f"{source}: {path}node_name: {why}")

    @property
    def nvml_fake_file(self) -> str | None:
        return self.nvml[5:] if self.nvml.startswith("fake:") else None


def parse_unit(text: str, where: str) -> int:
    """A unit number given as text ($FABRICMON_UNIT, a node label): an integer in UNIT_RANGE."""
    value = text.strip()
    if not value.isdigit() or not UNIT_RANGE[0] <= int(value) <= UNIT_RANGE[1]:
        raise ConfigError(f"{where}: expected a unit number (integer {UNIT_RANGE[0]}..{UNIT_RANGE[1]}), got {text!r}")
    return int(value)


def with_unit(cfg: AgentConfig, unit: int, where: str) -> AgentConfig:
    """``shard.unit`` set from outside the file (``where``: --unit, $FABRICMON_UNIT): it wins over the file's."""
    if cfg.shard is None:
        raise ConfigError(f"command line: {where}: only with a shard: section in the agent config")
    check_range(unit, *UNIT_RANGE, where, "command line")
    return replace(cfg, shard=replace(cfg.shard, unit=unit))


def with_ib_switches(cfg: AgentConfig) -> AgentConfig:
    """``--ib-switches``: the file's ``sources.ib_switches`` section, enabled."""
    section = replace(cfg.sources.ib_switches, enabled=True)
    return replace(cfg, sources=replace(cfg.sources, ib_switches=section))


def _relative_to(path: str | None, config: str | Path | None) -> str | None:
    if not path or config is None or Path(path).is_absolute():
        return path
    return str(Path(config).parent / path)


def load_agent_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Load ``path`` (or defaults), then apply flag ``overrides`` (None values ignored).

    The shard section's relative paths are relative to the config file, as the aggregator's
    topology is."""
    data: dict = load_yaml_file(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    cfg = build(AgentConfig, data, "", source)
    if cfg.shard is not None:
        cfg = replace(cfg, shard=replace(cfg.shard, map=_relative_to(cfg.shard.map, path),
                                         topology=_relative_to(cfg.shard.topology, path)))
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        cfg = replace(cfg, **flags)
        cfg.validate("", "command line")
    return cfg
