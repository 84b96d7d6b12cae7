"""How the agent reaches the aggregator: the gRPC channel (TLS, keepalive, size limits; agent/h2_grpc.py,
not grpcio) and the bearer-token metadata."""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass
from pathlib import Path

from .h2_grpc import Channel


@dataclass(frozen=True)
class TlsFiles:
    """PEM file paths.  Client: ``ca`` verifies the aggregator, ``cert``/``key`` are the
    agent's client certificate (mTLS).  ``server_name`` overrides the name checked
    against the aggregator's certificate (tests, IP targets)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def tls_digest(tls: TlsFiles | None) -> str | None:
    """A fingerprint of the TLS material a connection opened now would use (None: no TLS files)."""
    if tls is None:
        return None
    h = hashlib.sha256()
    for path in (tls.ca, tls.cert, tls.key):
        h.update(b"\0" + (_read(path) or b""))
    return h.hexdigest()


def tls_problem(tls: TlsFiles | None) -> str | None:
    """Why the TLS files cannot be used as they are now (OpenSSL refuses them), or None: checked before a
    reload reconnects, so a certificate caught mid-write or invalid leaves the live stream as it is."""
    if tls is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if tls.ca:
            ctx.load_verify_locations(cafile=tls.ca)
        if tls.cert and tls.key:
            ctx.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        return f"stream.tls_ca/tls_cert/tls_key: {getattr(exc, 'reason', None) or exc}"
    return None


def presented_token(token: str | None, token_file: str | None) -> str | None:
    """The token to present: ``token``, or the last non-blank line of ``token_file``, read now.

    A token file may hold several tokens, one per line, the aggregator accepting any of them
    (aggregator/credentials.py): during a rotation the same Secret holds the old and then the
    new token, appended, so the last line is the newest."""
    if token_file:
        lines = [ln.strip() for ln in Path(token_file).read_text().splitlines() if ln.strip()]
        token = lines[-1] if lines else None
    return token or None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """``authorization: Bearer`` metadata for ``token`` (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def tls_context(tls: TlsFiles) -> ssl.SSLContext:
    """The client side of TLS to the aggregator: its certificate and name verified against ``ca`` (the
    system's CAs without one), the agent's certificate presented when given (mTLS), HTTP/2 by ALPN."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls.ca:
        ctx.load_verify_locations(cafile=tls.ca)
    else:
        ctx.load_default_certs()
    if tls.cert and tls.key:
        ctx.load_cert_chain(tls.cert, tls.key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


def open_channel(target: str, tls: TlsFiles | None, keepalive_ms: int, max_message_bytes: int) -> Channel:
    """A channel to the aggregator: keepalive PINGs after ``keepalive_ms`` without a frame (the aggregator's
    server lets a client ping every 10 s: aggregator/server.py), 1 MiB received messages at most."""
    return Channel(target, tls_context(tls) if tls is not None else None, tls.server_name if tls else None,
                   keepalive_ms=keepalive_ms, max_message_bytes=max_message_bytes)
