"""The aggregator's ``auth:`` section: who may speak for a node.

Its own module so that credentials.py (which loads the files it names) and config.py (which holds it in
``AggregatorConfig`` and checks the files at start) each import it, and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..configload import ConfigError


@dataclass(frozen=True)
class AuthSettings:
    """Who may speak for a node.  Strongest first: mTLS (``tls_client_ca``; the client
    certificate's CN or a DNS SAN must be the node), per-node tokens (``node_tokens_file``,
    a YAML mapping node -> token or list of tokens; a token speaks only for its node), shared
    tokens (``token_file``, one per line; any holder may speak for any node: the weaker mode).
    Both files are re-read at SIGHUP (credentials.py): rotation and revocation need no restart.  Without any of
    them the aggregator runs only with ``insecure: true`` and warns at start."""

    token_file: str | None = None
    node_tokens_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    insecure: bool = False
    # nodes whose streams may carry switch-side series (the ib_switches sweep); from any other node those
    # series are ignored: a stream speaks only for its own node
    switch_sources: tuple[str, ...] = ()

    @property
    def authenticated(self) -> bool:
        return bool(self.token_file or self.node_tokens_file or self.tls_client_ca)

    def validate(self, path: str, source: str) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(f"{source}: {path}.tls_key: tls_cert and tls_key must be given together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError(f"{source}: {path}.tls_client_ca: needs tls_cert and tls_key")
        if not self.authenticated and not self.insecure:
            raise ConfigError(f"{source}: {path}: no agent authentication: set tls_client_ca (mTLS), "
                              f"node_tokens_file or token_file, or insecure: true to accept any peer")

    def files(self) -> list[tuple[str, str]]:
        """(field, path) of every file this section names."""
        return [(name, getattr(self, name)) for name in
                ("token_file", "node_tokens_file", "tls_cert", "tls_key", "tls_client_ca") if getattr(self, name)]
