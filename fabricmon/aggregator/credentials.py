"""The bearer tokens agent streams may present, read from the files the config names.

Both files are read for their contents at start and again at every SIGHUP, so a token is
rotated or revoked without a restart (service.py applies what changed and cuts the live
streams whose token is no longer accepted):

* ``auth.token_file`` (shared): one token per line, any of them accepted, any holder may
  speak for any node.  Rotation: add the new token as a new line, SIGHUP, roll the agents
  (an agent presents the *last* line of its own file), remove the old line, SIGHUP.
* ``auth.node_tokens_file`` (per node): a YAML mapping node -> token, or node -> list of
  tokens (the same rotation, per node).  A token speaks only for its node, and no token
  may belong to two nodes.

Tokens are kept as bytes for ``hmac.compare_digest``; ``fingerprint`` names one in logs
without writing it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..configload import ConfigError, load_yaml_file
from ..secretfiles import token_lines_problem
from .auth_settings import AuthSettings


@dataclass(frozen=True)
class StreamCredentials:
    shared: frozenset[bytes] = frozenset()
    per_node: tuple[tuple[str, frozenset[bytes]], ...] = ()  # (node, its tokens), sorted by node
    _nodes: dict[str, frozenset[bytes]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._nodes.update(self.per_node)

    @property
    def required(self) -> bool:
        return bool(self.shared or self.per_node)

    def node_tokens(self, node: str) -> frozenset[bytes]:
        return self._nodes.get(node, frozenset())

    def accepts(self, token: bytes, node: str) -> bool:
        """Would ``token`` be let speak for ``node`` now (whether a live stream may go on)."""
        return token in self.shared or token in self._nodes.get(node, frozenset())

    def changes(self, new: StreamCredentials) -> list[str]:
        """Which parts differ, for the reload's log line (never the tokens themselves)."""
        out = []
        if self.shared != new.shared:
            out.append(f"auth.token_file (+{len(new.shared - self.shared)} -{len(self.shared - new.shared)} tokens)")
        if self.per_node != new.per_node:
            old_n, new_n = dict(self.per_node), dict(new.per_node)
            touched = sorted(n for n in old_n.keys() | new_n.keys() if old_n.get(n) != new_n.get(n))
            out.append(f"auth.node_tokens_file ({len(touched)} nodes: {', '.join(touched[:5])}"
                       f"{', ...' if len(touched) > 5 else ''})")
        return out


def fingerprint(token: bytes) -> str:
    """A short name for a token in logs: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(token).hexdigest()[:8]


def read_token_lines(path: str, where: str) -> frozenset[bytes]:
    """A shared token file: one token per line, blank lines ignored; at least one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: {path}: not UTF-8 text") from None
    problem = token_lines_problem(text)
    if problem == "is empty":
        raise ConfigError(f"{where}: {path} is empty")
    if problem:
        raise ConfigError(f"{where}: {path}: {problem}")
    return frozenset(ln.strip().encode() for ln in text.splitlines() if ln.strip())


def load_node_tokens(path: str, source: str) -> dict[str, frozenset[str]]:
    """The per-node token file: node -> token or list of tokens; no token shared by two nodes."""
    where = f"{source}: auth.node_tokens_file"
    try:
        data = load_yaml_file(path)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    out: dict[str, frozenset[str]] = {}
    owner: dict[str, str] = {}
    for node, value in data.items():
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(f"{where}: {path}: {node}: empty list of tokens")
        tokens = set()
        for token in values:
            if not isinstance(token, str) or not token.strip():
                raise ConfigError(f"{where}: {path}: {node}: token must be a non-empty string")
            token = token.strip()
            if owner.setdefault(token, str(node)) != str(node):
                raise ConfigError(f"{where}: {path}: {node}: token also used by another node")
            tokens.add(token)
        out[str(node)] = frozenset(tokens)
    if not out:
        raise ConfigError(f"{where}: {path}: no node tokens")
    return out


def load_credentials(auth: AuthSettings, source: str) -> StreamCredentials:
    """Read both token files (whichever the config names); ConfigError naming the file and why."""
    shared = read_token_lines(auth.token_file, f"{source}: auth.token_file") if auth.token_file else frozenset()
    per_node: tuple[tuple[str, frozenset[bytes]], ...] = ()
    if auth.node_tokens_file:
        nodes = load_node_tokens(auth.node_tokens_file, source)
        per_node = tuple(sorted((n, frozenset(t.encode() for t in ts)) for n, ts in nodes.items()))
    return StreamCredentials(shared, per_node)
