from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JSON: _ClassVar[Encoding]
    BYTES: _ClassVar[Encoding]
    PROTO: _ClassVar[Encoding]
    ASCII: _ClassVar[Encoding]
    JSON_IETF: _ClassVar[Encoding]

class SubscriptionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_DEFINED: _ClassVar[SubscriptionMode]
    ON_CHANGE: _ClassVar[SubscriptionMode]
    SAMPLE: _ClassVar[SubscriptionMode]
JSON: Encoding
BYTES: Encoding
PROTO: Encoding
ASCII: Encoding
JSON_IETF: Encoding
TARGET_DEFINED: SubscriptionMode
ON_CHANGE: SubscriptionMode
SAMPLE: SubscriptionMode

class Notification(_message.Message):
    __slots__ = ("timestamp", "prefix", "update", "delete", "atomic")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    ATOMIC_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    prefix: Path
    update: _containers.RepeatedCompositeFieldContainer[Update]
    delete: _containers.RepeatedCompositeFieldContainer[Path]
    atomic: bool
    def __init__(self, timestamp: _Optional[int] = ..., prefix: _Optional[_Union[Path, _Mapping]] = ..., update: _Optional[_Iterable[_Union[Update, _Mapping]]] = ..., delete: _Optional[_Iterable[_Union[Path, _Mapping]]] = ..., atomic: _Optional[bool] = ...) -> None: ...

class Update(_message.Message):
    __slots__ = ("path", "val", "duplicates")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VAL_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    path: Path
    val: TypedValue
    duplicates: int
    def __init__(self, path: _Optional[_Union[Path, _Mapping]] = ..., val: _Optional[_Union[TypedValue, _Mapping]] = ..., duplicates: _Optional[int] = ...) -> None: ...

class TypedValue(_message.Message):
    __slots__ = ("string_val", "int_val", "uint_val", "bool_val", "bytes_val", "float_val", "decimal_val", "leaflist_val", "json_val", "json_ietf_val", "ascii_val", "proto_bytes", "double_val")
    STRING_VAL_FIELD_NUMBER: _ClassVar[int]
    INT_VAL_FIELD_NUMBER: _ClassVar[int]
    UINT_VAL_FIELD_NUMBER: _ClassVar[int]
    BOOL_VAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_VAL_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VAL_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_VAL_FIELD_NUMBER: _ClassVar[int]
    LEAFLIST_VAL_FIELD_NUMBER: _ClassVar[int]
    JSON_VAL_FIELD_NUMBER: _ClassVar[int]
    JSON_IETF_VAL_FIELD_NUMBER: _ClassVar[int]
    ASCII_VAL_FIELD_NUMBER: _ClassVar[int]
    PROTO_BYTES_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VAL_FIELD_NUMBER: _ClassVar[int]
    string_val: str
    int_val: int
    uint_val: int
    bool_val: bool
    bytes_val: bytes
    float_val: float
    decimal_val: Decimal64
    leaflist_val: ScalarArray
    json_val: bytes
    json_ietf_val: bytes
    ascii_val: str
    proto_bytes: bytes
    double_val: float
    def __init__(self, string_val: _Optional[str] = ..., int_val: _Optional[int] = ..., uint_val: _Optional[int] = ..., bool_val: _Optional[bool] = ..., bytes_val: _Optional[bytes] = ..., float_val: _Optional[float] = ..., decimal_val: _Optional[_Union[Decimal64, _Mapping]] = ..., leaflist_val: _Optional[_Union[ScalarArray, _Mapping]] = ..., json_val: _Optional[bytes] = ..., json_ietf_val: _Optional[bytes] = ..., ascii_val: _Optional[str] = ..., proto_bytes: _Optional[bytes] = ..., double_val: _Optional[float] = ...) -> None: ...

class Path(_message.Message):
    __slots__ = ("origin", "elem", "target")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ELEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    origin: str
    elem: _containers.RepeatedCompositeFieldContainer[PathElem]
    target: str
    def __init__(self, origin: _Optional[str] = ..., elem: _Optional[_Iterable[_Union[PathElem, _Mapping]]] = ..., target: _Optional[str] = ...) -> None: ...

class PathElem(_message.Message):
    __slots__ = ("name", "key")
    class KeyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., key: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Decimal64(_message.Message):
    __slots__ = ("digits", "precision")
    DIGITS_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    digits: int
    precision: int
    def __init__(self, digits: _Optional[int] = ..., precision: _Optional[int] = ...) -> None: ...

class ScalarArray(_message.Message):
    __slots__ = ("element",)
    ELEMENT_FIELD_NUMBER: _ClassVar[int]
    element: _containers.RepeatedCompositeFieldContainer[TypedValue]
    def __init__(self, element: _Optional[_Iterable[_Union[TypedValue, _Mapping]]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("subscribe", "poll")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    subscribe: SubscriptionList
    poll: Poll
    def __init__(self, subscribe: _Optional[_Union[SubscriptionList, _Mapping]] = ..., poll: _Optional[_Union[Poll, _Mapping]] = ...) -> None: ...

class Poll(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("update", "sync_response")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    SYNC_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    update: Notification
    sync_response: bool
    def __init__(self, update: _Optional[_Union[Notification, _Mapping]] = ..., sync_response: _Optional[bool] = ...) -> None: ...

class SubscriptionList(_message.Message):
    __slots__ = ("prefix", "subscription", "use_aliases", "mode", "allow_aggregation", "encoding", "updates_only")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STREAM: _ClassVar[SubscriptionList.Mode]
        ONCE: _ClassVar[SubscriptionList.Mode]
        POLL: _ClassVar[SubscriptionList.Mode]
    STREAM: SubscriptionList.Mode
    ONCE: SubscriptionList.Mode
    POLL: SubscriptionList.Mode
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    USE_ALIASES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    UPDATES_ONLY_FIELD_NUMBER: _ClassVar[int]
    prefix: Path
    subscription: _containers.RepeatedCompositeFieldContainer[Subscription]
    use_aliases: bool
    mode: SubscriptionList.Mode
    allow_aggregation: bool
    encoding: Encoding
    updates_only: bool
    def __init__(self, prefix: _Optional[_Union[Path, _Mapping]] = ..., subscription: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., use_aliases: _Optional[bool] = ..., mode: _Optional[_Union[SubscriptionList.Mode, str]] = ..., allow_aggregation: _Optional[bool] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., updates_only: _Optional[bool] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("path", "mode", "sample_interval", "suppress_redundant", "heartbeat_interval")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SUPPRESS_REDUNDANT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    path: Path
    mode: SubscriptionMode
    sample_interval: int
    suppress_redundant: bool
    heartbeat_interval: int
    def __init__(self, path: _Optional[_Union[Path, _Mapping]] = ..., mode: _Optional[_Union[SubscriptionMode, str]] = ..., sample_interval: _Optional[int] = ..., suppress_redundant: _Optional[bool] = ..., heartbeat_interval: _Optional[int] = ...) -> None: ...
