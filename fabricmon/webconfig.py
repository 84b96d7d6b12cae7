"""``--web.config.file``: TLS and basic auth for the HTTP listeners, in the Prometheus exporter-toolkit format.

The same file node_exporter and dcgm-exporter read (exporter-toolkit docs/web-configuration.md)::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # default NoClientCert
      client_ca_file: ca.crt
      min_version: TLS12                              # TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Relative paths are relative to the web config file, as in exporter-toolkit.
Keys the toolkit has and fabricmon does not implement (``http_server_config``,
cipher suites) are refused by name rather than ignored: a security setting
that silently does nothing is worse than a start that fails.
"""

from __future__ import annotations

import base64
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .configload import ConfigError, load_yaml_file

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
TOP_KEYS = {"tls_server_config", "basic_auth_users"}
# Successful (user, password) checks remembered so a scrape every second does not pay bcrypt's cost each time.
_CACHE_MAX = 256
# bcrypt checks that may run at once (each ~50 ms of CPU at cost 10): beyond them a request is
# answered 429 rather than queued, so a flood of wrong passwords cannot occupy every CPU.  A
# remembered success needs no check, so a configured scraper is not throttled by the flood.
MAX_CONCURRENT_CHECKS = 4


@dataclass
class WebConfig:
    source: str
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    max_concurrent_checks: int = MAX_CONCURRENT_CHECKS
    _ok: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _dummy: bytes | None = None
    _slots: threading.BoundedSemaphore | None = None

    def authorized(self, header: str | None) -> bool:
        """True when no users are configured, or ``header`` is Basic credentials one of them matches."""
        return self.check(header) == "ok"

    def check(self, header: str | None) -> str:
        """``ok``, ``denied`` (no, malformed or wrong credentials) or ``busy`` (the check could not
        run now: ``max_concurrent_checks`` bcrypt checks are running).

        An unknown user is checked against a dummy hash of the configured users' cost, so the
        time an answer takes does not tell which user names exist."""
        if not self.users:
            return "ok"
        if not header or not header.startswith("Basic "):
            return "denied"
        try:
            user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return "denied"
        hashed = self.users.get(user)
        known = hashed is not None
        if hashed is None:
            hashed = self._dummy_hash()
        key = hmac.new(hashed, password.encode(), "sha256").digest()
        with self._lock:
            if known and key in self._ok:
                return "ok"
            if self._slots is None:
                self._slots = threading.BoundedSemaphore(self.max_concurrent_checks)
            slots = self._slots
        if not slots.acquire(blocking=False):
            return "busy"
        try:
            import bcrypt

            try:
                good = bcrypt.checkpw(password.encode(), hashed) and known
            except ValueError:
                return "denied"
        finally:
            slots.release()
        if good:
            with self._lock:
                if len(self._ok) >= _CACHE_MAX:
                    self._ok.clear()
                self._ok.add(key)
        return "ok" if good else "denied"

    def _dummy_hash(self) -> bytes:
        """A hash of a random password at the cost of the first configured user's (made once)."""
        with self._lock:
            if self._dummy is None:
                import secrets

                import bcrypt

                first = next(iter(self.users.values()))
                try:
                    cost = int(first.split(b"$")[2])
                except (IndexError, ValueError):
                    cost = 10
                self._dummy = bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(rounds=cost))
            return self._dummy


def _path(base: Path, value, key: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: {key}: must be a file path")
    p = Path(value)
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise ConfigError(f"{source}: {key}: no such file {p}")
    return str(p)


def _tls(base: Path, tls, source: str) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise ConfigError(f"{source}: tls_server_config: must be a mapping")
    unknown = sorted(set(tls) - TLS_KEYS)
    if unknown:
        raise ConfigError(f"{source}: tls_server_config.{unknown[0]}: not supported by fabricmon "
                          f"(supported: {', '.join(sorted(TLS_KEYS))})")
    if "cert_file" not in tls or "key_file" not in tls:
        raise ConfigError(f"{source}: tls_server_config: cert_file and key_file are both required")
    cert = _path(base, tls["cert_file"], "tls_server_config.cert_file", source)
    key = _path(base, tls["key_file"], "tls_server_config.key_file", source)
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"{source}: tls_server_config.client_auth_type: must be one of "
                          f"{', '.join(CLIENT_AUTH)}, got {auth!r}")
    version = tls.get("min_version", "TLS12")
    if version not in TLS_VERSIONS:
        raise ConfigError(f"{source}: tls_server_config.min_version: must be TLS12 or TLS13, got {version!r}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[version]
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{source}: tls_server_config: cannot load {cert} / {key}: {exc}") from None
    ctx.verify_mode = CLIENT_AUTH[auth]
    ca = tls.get("client_ca_file")
    if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
        raise ConfigError(f"{source}: tls_server_config.client_ca_file: required with client_auth_type {auth}")
    if auth in ("RequestClientCert", "RequireAnyClientCert"):
        # Python's ssl cannot ask for a certificate without verifying it: say so instead of pretending.
        raise ConfigError(f"{source}: tls_server_config.client_auth_type: {auth} is not supported; "
                          "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file")
    if ca:
        try:
            ctx.load_verify_locations(_path(base, ca, "tls_server_config.client_ca_file", source))
        except ssl.SSLError as exc:
            raise ConfigError(f"{source}: tls_server_config.client_ca_file: {exc}") from None
    return ctx


def _users(users, source: str) -> dict[str, bytes]:
    if not isinstance(users, dict) or not users:
        raise ConfigError(f"{source}: basic_auth_users: must be a non-empty mapping of user to bcrypt hash")
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        raise ConfigError(f"{source}: basic_auth_users: needs the 'bcrypt' Python package "
                          "(pip install bcrypt)") from None
    out = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or ":" in user or not user:
            raise ConfigError(f"{source}: basic_auth_users: bad user name {user!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"{source}: basic_auth_users.{user}: must be a bcrypt hash ($2y$...), "
                              "not a plain password")
        out[user] = hashed.encode()
    return out


def load_web_config(path: str | None) -> WebConfig | None:
    """None without a file (plain HTTP, no auth, as node_exporter without --web.config.file)."""
    if not path:
        return None
    data = load_yaml_file(path)
    source = str(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must be a mapping")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: {unknown[0]}: not supported by fabricmon (supported: "
                          f"{', '.join(sorted(TOP_KEYS))})")
    base = Path(path).resolve().parent
    cfg = WebConfig(source)
    if data.get("tls_server_config") is not None:
        cfg.ssl_context = _tls(base, data["tls_server_config"], source)
    if data.get("basic_auth_users") is not None:
        cfg.users = _users(data["basic_auth_users"], source)
        if cfg.users:
            cfg._dummy_hash()  # made now, so the first unknown user's answer costs no more than the next
        if cfg.ssl_context is None:
            # Same stance as exporter-toolkit's docs: basic auth over plain HTTP sends the password in clear.
            import structlog

            structlog.get_logger("fabricmon.http").warning("basic_auth_without_tls", web_config=source)
    return cfg
