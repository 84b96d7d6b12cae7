"""The RAS client protocol as NCCL's own ``ncclras`` speaks it (src/ras/client.cc, client_support.cc).

Text lines, each ended by ``\\n``, the server matching commands case-insensitively:

    -> CLIENT PROTOCOL 2          <- SERVER PROTOCOL 2     (a different number: ncclras warns, goes on)
    -> TIMEOUT 5                  <- OK                    (RAS's own per-leg collective timeout, seconds)
    -> SET FORMAT json            <- OK                    (2.28.7 and later; older: "ERROR: Unknown command ...")
    -> STATUS                     <- the status document, then the server closes the connection

The server keeps a 1,024-byte receive buffer per client and gives up on a longer line; replies to
anything it does not know start with ``ERROR:``.
"""

from __future__ import annotations

import re

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT (ras_internal.h); NCCL_RAS_ADDR overrides it per job
CLIENT_PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL, unchanged from 2.24 through 2.29
# RAS_COLLECTIVE_LEG_TIMEOUT_SEC and RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC (ras_internal.h): a collective
# RAS runs for a query gives up after leg + extra; ncclras waits 1 s more than that for the answer
LEG_TIMEOUT_S = 5
EXTRA_TIMEOUT_S = 5
CLIENT_SLACK_S = 1  # client.cc TIMEOUT_INCREMENT
MAX_COMMAND_BYTES = 1024  # struct rasClient recvBuffer

HELLO = f"CLIENT PROTOCOL {CLIENT_PROTOCOL}\n".encode()
SET_JSON = b"SET FORMAT json\n"
STATUS = b"STATUS\n"
SERVER_PREFIX = "server protocol "
OK = "ok"
ERROR_PREFIX = "error"
# What the first bytes of a text-format status say (client_support.cc rasClientRunInit): a server
# that ignored SET FORMAT
TEXT_STATUS_START = ("NCCL version", "Job summary")

_ADDR = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.\-]+)):(?P<port>[0-9]{1,5})$")
MAX_ADDR_CHARS = 128


def timeout_command(seconds: int) -> bytes:
    return f"TIMEOUT {int(seconds)}\n".encode()


def client_deadline_s(ras_timeout_s: int) -> float:
    """How long the whole exchange may take: what ncclras allows (client.cc: 1 s + the timeout + the
    extra), so a live RAS that is slow to gather is never cut off before it would give up itself."""
    return CLIENT_SLACK_S + (ras_timeout_s if ras_timeout_s > 0 else LEG_TIMEOUT_S) + EXTRA_TIMEOUT_S


class BadAddress(ValueError):
    pass


def parse_addr(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as NCCL_RAS_ADDR takes it (env.rst); (host, port)."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_ADDR_CHARS:
        raise BadAddress(f"must be HOST:PORT, 1 to {MAX_ADDR_CHARS} characters")
    m = _ADDR.match(text)
    if m is None:
        raise BadAddress(f"{text!r} is not HOST:PORT (an IPv6 address in brackets)")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise BadAddress(f"port {port} out of range")
    return (m["v6"] or m["host"]), port


def server_protocol(line: str) -> int | None:
    """The version a ``SERVER PROTOCOL n`` reply names; None for any other reply."""
    if not line.lower().startswith(SERVER_PREFIX):
        return None
    rest = line[len(SERVER_PREFIX):].strip()
    return int(rest) if rest.isdigit() else -1


def is_ok(line: str) -> bool:
    return line.strip().lower() == OK


def is_error(line: str) -> bool:
    return line.lower().startswith(ERROR_PREFIX)
