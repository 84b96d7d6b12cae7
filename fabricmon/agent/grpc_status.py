"""gRPC's status codes and how HTTP/2 outcomes map onto them, as data (the agent's h2 client,
agent/h2_grpc.py).

Sources: https://github.com/grpc/grpc/blob/master/doc/statuscodes.md (the 17 codes) and
https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md ("Errors": RST_STREAM codes) and
https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md (HTTP status without grpc-status).
"""

from __future__ import annotations

import enum


class StatusCode(enum.Enum):
    """The names match grpcio's ``grpc.StatusCode``: refusal accounting reads them by name."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# HTTP/2 RST_STREAM error code -> gRPC status (PROTOCOL-HTTP2.md, "Errors"); unlisted: INTERNAL.
RST_STREAM_STATUS = {
    0x0: StatusCode.INTERNAL,             # NO_ERROR
    0x1: StatusCode.INTERNAL,             # PROTOCOL_ERROR
    0x2: StatusCode.INTERNAL,             # INTERNAL_ERROR
    0x3: StatusCode.INTERNAL,             # FLOW_CONTROL_ERROR
    0x4: StatusCode.INTERNAL,             # SETTINGS_TIMEOUT
    0x6: StatusCode.INTERNAL,             # FRAME_SIZE_ERROR
    0x7: StatusCode.UNAVAILABLE,          # REFUSED_STREAM
    0x8: StatusCode.CANCELLED,            # CANCEL
    0x9: StatusCode.INTERNAL,             # COMPRESSION_ERROR
    0xA: StatusCode.INTERNAL,             # CONNECT_ERROR
    0xB: StatusCode.RESOURCE_EXHAUSTED,   # ENHANCE_YOUR_CALM
    0xC: StatusCode.PERMISSION_DENIED,    # INADEQUATE_SECURITY
}

# HTTP :status of a response without grpc-status -> gRPC status (http-grpc-status-mapping.md);
# any other: UNKNOWN.
HTTP_STATUS = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}


def status_from_number(value: str | None) -> StatusCode:
    """A ``grpc-status`` header's value; one that is not a known code is UNKNOWN."""
    try:
        return StatusCode(int(value or ""))
    except ValueError:
        return StatusCode.UNKNOWN


class RpcError(Exception):
    """How a call ended when not OK: ``code()`` and ``details()``, as grpcio's call errors read."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details
