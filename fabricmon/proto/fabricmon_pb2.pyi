from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SeriesKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERIES_KIND_UNSPECIFIED: _ClassVar[SeriesKind]
    SERIES_KIND_COUNTER: _ClassVar[SeriesKind]
    SERIES_KIND_GAUGE: _ClassVar[SeriesKind]
SERIES_KIND_UNSPECIFIED: SeriesKind
SERIES_KIND_COUNTER: SeriesKind
SERIES_KIND_GAUGE: SeriesKind

class AgentMessage(_message.Message):
    __slots__ = ("hello", "batch", "ras_report")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RAS_REPORT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: Batch
    ras_report: RasReport
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., ras_report: _Optional[_Union[RasReport, _Mapping]] = ...) -> None: ...

class Nic(_message.Message):
    __slots__ = ("device", "port", "rail", "link_layer", "netdev", "rate_gbps", "width", "gpu", "node_guid")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    NODE_GUID_FIELD_NUMBER: _ClassVar[int]
    device: str
    port: str
    rail: str
    link_layer: str
    netdev: str
    rate_gbps: float
    width: int
    gpu: int
    node_guid: str
    def __init__(self, device: _Optional[str] = ..., port: _Optional[str] = ..., rail: _Optional[str] = ..., link_layer: _Optional[str] = ..., netdev: _Optional[str] = ..., rate_gbps: _Optional[float] = ..., width: _Optional[int] = ..., gpu: _Optional[int] = ..., node_guid: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "agent_version", "interval_seconds", "nics", "gpus", "boot_id", "protocol_version", "boot_time_seconds")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BOOT_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node: str
    agent_version: str
    interval_seconds: float
    nics: _containers.RepeatedCompositeFieldContainer[Nic]
    gpus: int
    boot_id: str
    protocol_version: int
    boot_time_seconds: float
    def __init__(self, node: _Optional[str] = ..., agent_version: _Optional[str] = ..., interval_seconds: _Optional[float] = ..., nics: _Optional[_Iterable[_Union[Nic, _Mapping]]] = ..., gpus: _Optional[int] = ..., boot_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., boot_time_seconds: _Optional[float] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SeriesDef(_message.Message):
    __slots__ = ("id", "family", "labels", "kind")
    ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    id: int
    family: str
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    kind: SeriesKind
    def __init__(self, id: _Optional[int] = ..., family: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., kind: _Optional[_Union[SeriesKind, str]] = ...) -> None: ...

class IntPair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class RankTiming(_message.Message):
    __slots__ = ("job", "rank", "local_rank", "step", "step_seconds", "comm_seconds", "ts", "gpu", "group", "job_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    local_rank: int
    step: int
    step_seconds: float
    comm_seconds: float
    ts: float
    gpu: int
    group: _containers.RepeatedCompositeFieldContainer[IntPair]
    job_id: str
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., step: _Optional[int] = ..., step_seconds: _Optional[float] = ..., comm_seconds: _Optional[float] = ..., ts: _Optional[float] = ..., gpu: _Optional[int] = ..., group: _Optional[_Iterable[_Union[IntPair, _Mapping]]] = ..., job_id: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("job", "rank", "step", "coll_sn", "in_collective", "ts", "job_id", "nccl_ras")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    COLL_SN_FIELD_NUMBER: _ClassVar[int]
    IN_COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NCCL_RAS_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    step: int
    coll_sn: int
    in_collective: bool
    ts: float
    job_id: str
    nccl_ras: str
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., coll_sn: _Optional[int] = ..., in_collective: _Optional[bool] = ..., ts: _Optional[float] = ..., job_id: _Optional[str] = ..., nccl_ras: _Optional[str] = ...) -> None: ...

class JobLayout(_message.Message):
    __slots__ = ("job", "layout")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    job: str
    layout: _containers.RepeatedCompositeFieldContainer[IntPair]
    def __init__(self, job: _Optional[str] = ..., layout: _Optional[_Iterable[_Union[IntPair, _Mapping]]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("seq", "ts", "interval_seconds", "new_series", "delta_ids", "delta_values", "saturated_ids", "reset_ids", "gauge_ids", "gauge_values", "ranks", "layouts", "self_contained", "heartbeats")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NEW_SERIES_FIELD_NUMBER: _ClassVar[int]
    DELTA_IDS_FIELD_NUMBER: _ClassVar[int]
    DELTA_VALUES_FIELD_NUMBER: _ClassVar[int]
    SATURATED_IDS_FIELD_NUMBER: _ClassVar[int]
    RESET_IDS_FIELD_NUMBER: _ClassVar[int]
    GAUGE_IDS_FIELD_NUMBER: _ClassVar[int]
    GAUGE_VALUES_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    SELF_CONTAINED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ts: float
    interval_seconds: float
    new_series: _containers.RepeatedCompositeFieldContainer[SeriesDef]
    delta_ids: _containers.RepeatedScalarFieldContainer[int]
    delta_values: _containers.RepeatedScalarFieldContainer[float]
    saturated_ids: _containers.RepeatedScalarFieldContainer[int]
    reset_ids: _containers.RepeatedScalarFieldContainer[int]
    gauge_ids: _containers.RepeatedScalarFieldContainer[int]
    gauge_values: _containers.RepeatedScalarFieldContainer[float]
    ranks: _containers.RepeatedCompositeFieldContainer[RankTiming]
    layouts: _containers.RepeatedCompositeFieldContainer[JobLayout]
    self_contained: bool
    heartbeats: _containers.RepeatedCompositeFieldContainer[Heartbeat]
    def __init__(self, seq: _Optional[int] = ..., ts: _Optional[float] = ..., interval_seconds: _Optional[float] = ..., new_series: _Optional[_Iterable[_Union[SeriesDef, _Mapping]]] = ..., delta_ids: _Optional[_Iterable[int]] = ..., delta_values: _Optional[_Iterable[float]] = ..., saturated_ids: _Optional[_Iterable[int]] = ..., reset_ids: _Optional[_Iterable[int]] = ..., gauge_ids: _Optional[_Iterable[int]] = ..., gauge_values: _Optional[_Iterable[float]] = ..., ranks: _Optional[_Iterable[_Union[RankTiming, _Mapping]]] = ..., layouts: _Optional[_Iterable[_Union[JobLayout, _Mapping]]] = ..., self_contained: _Optional[bool] = ..., heartbeats: _Optional[_Iterable[_Union[Heartbeat, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "dropped_reason")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REASON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    dropped_reason: str
    def __init__(self, seq: _Optional[int] = ..., dropped_reason: _Optional[str] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("reason", "seq")
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    reason: str
    seq: int
    def __init__(self, reason: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("delta_families", "gauge_families")
    DELTA_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    GAUGE_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    delta_families: _containers.RepeatedScalarFieldContainer[str]
    gauge_families: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, delta_families: _Optional[_Iterable[str]] = ..., gauge_families: _Optional[_Iterable[str]] = ...) -> None: ...

class RasQuery(_message.Message):
    __slots__ = ("id", "job", "job_id", "addr", "timeout_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    job: str
    job_id: str
    addr: str
    timeout_seconds: int
    def __init__(self, id: _Optional[int] = ..., job: _Optional[str] = ..., job_id: _Optional[str] = ..., addr: _Optional[str] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class RasRank(_message.Message):
    __slots__ = ("comm", "comm_size", "rank", "host", "pid", "cuda_dev", "dead", "unresponsive", "op", "count", "peers", "init_state", "async_error")
    COMM_FIELD_NUMBER: _ClassVar[int]
    COMM_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEV_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    UNRESPONSIVE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    INIT_STATE_FIELD_NUMBER: _ClassVar[int]
    ASYNC_ERROR_FIELD_NUMBER: _ClassVar[int]
    comm: str
    comm_size: int
    rank: int
    host: str
    pid: int
    cuda_dev: int
    dead: bool
    unresponsive: bool
    op: str
    count: int
    peers: int
    init_state: int
    async_error: int
    def __init__(self, comm: _Optional[str] = ..., comm_size: _Optional[int] = ..., rank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., cuda_dev: _Optional[int] = ..., dead: _Optional[bool] = ..., unresponsive: _Optional[bool] = ..., op: _Optional[str] = ..., count: _Optional[int] = ..., peers: _Optional[int] = ..., init_state: _Optional[int] = ..., async_error: _Optional[int] = ...) -> None: ...

class RasReport(_message.Message):
    __slots__ = ("id", "job", "job_id", "outcome", "detail", "seconds", "nccl_version", "communicators", "world_size", "missing", "behind", "errors", "missing_total", "behind_total", "errors_total", "timeouts", "repaired")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    NCCL_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATORS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    MISSING_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BEHIND_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    id: int
    job: str
    job_id: str
    outcome: str
    detail: str
    seconds: float
    nccl_version: str
    communicators: int
    world_size: int
    missing: _containers.RepeatedCompositeFieldContainer[RasRank]
    behind: _containers.RepeatedCompositeFieldContainer[RasRank]
    errors: _containers.RepeatedCompositeFieldContainer[RasRank]
    missing_total: int
    behind_total: int
    errors_total: int
    timeouts: int
    repaired: str
    def __init__(self, id: _Optional[int] = ..., job: _Optional[str] = ..., job_id: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ..., seconds: _Optional[float] = ..., nccl_version: _Optional[str] = ..., communicators: _Optional[int] = ..., world_size: _Optional[int] = ..., missing: _Optional[_Iterable[_Union[RasRank, _Mapping]]] = ..., behind: _Optional[_Iterable[_Union[RasRank, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[RasRank, _Mapping]]] = ..., missing_total: _Optional[int] = ..., behind_total: _Optional[int] = ..., errors_total: _Optional[int] = ..., timeouts: _Optional[int] = ..., repaired: _Optional[str] = ...) -> None: ...

class AggregatorMessage(_message.Message):
    __slots__ = ("ack", "reject", "subscription", "ras_query")
    ACK_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    RAS_QUERY_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    reject: Reject
    subscription: Subscription
    ras_query: RasQuery
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ..., subscription: _Optional[_Union[Subscription, _Mapping]] = ..., ras_query: _Optional[_Union[RasQuery, _Mapping]] = ...) -> None: ...
