"""Alertmanager URLs expanded to every address their host name resolves to.

An Alertmanager HA cluster on Kubernetes is reached through a headless Service: its name resolves
to one address per replica, and an HTTP client connects to one of them.  Each replica must get every
alert (they gossip silences and notification state, not alerts), so, as Prometheus does with its
DNS service discovery for Alertmanagers, a configured URL whose host is a name is expanded to one
URL per address, and the name is resolved again periodically (replicas move when pods restart).

Kept as configured: an IP literal, ``localhost`` (it names this host, whichever family answers), and
``https`` URLs (certificate verification needs the name the certificate was issued for; list the
replicas one by one, or front them with a Service that has a cluster IP).  A name that does not
resolve keeps the addresses it had (none yet: the URL as configured, so the sender's errors and
backoff say it fails).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import structlog

log = structlog.get_logger("fabricmon.aggregator.am_peers")

Resolver = Callable[[str, int], Sequence[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to for a TCP connection, IPv4 and IPv6."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def expandable(url: str) -> bool:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return parts.scheme == "http" and bool(host) and host != "localhost" and not _is_literal(host)


def expand(url: str, resolve: Resolver = system_resolver) -> tuple[str, ...]:
    """One URL per address of ``url``'s host (sorted, without duplicates), or ``(url,)`` when it is kept.

    Raises OSError when the name does not resolve (the caller keeps what it had)."""
    if not expandable(url):
        return (url,)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 80
    addresses = sorted(set(resolve(host, port)), key=lambda a: (":" in a, a))
    if not addresses:
        raise OSError(f"{host}: no address")
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    out = []
    for addr in addresses:
        shown = f"[{addr}]" if ":" in addr else addr
        out.append(urlunsplit((parts.scheme, f"{userinfo}{shown}:{port}", parts.path, parts.query, parts.fragment)))
    return tuple(out)


class PeerSet:
    """The configured URLs and what each expands to now; ``refresh`` re-resolves them."""

    def __init__(self, configured: Sequence[str], resolve: Resolver = system_resolver) -> None:
        self.configured = tuple(configured)
        self._resolve = resolve
        self.expanded: dict[str, tuple[str, ...]] = {u: (u,) for u in self.configured}
        self.failures = 0  # resolutions that failed (the previous addresses were kept)

    def refresh(self) -> bool:
        """Resolve every configured name again; True when any expansion changed."""
        changed = False
        for url in self.configured:
            if not expandable(url):
                continue
            try:
                now = expand(url, self._resolve)
            except (OSError, UnicodeError) as exc:
                self.failures += 1
                log.warning("alertmanager_resolve_failed", url=url, error=str(exc),
                            kept=len(self.expanded[url]))
                continue
            if now != self.expanded[url]:
                log.info("alertmanager_peers_changed", url=url, before=len(self.expanded[url]), after=len(now))
                self.expanded[url] = now
                changed = True
        return changed

    def urls(self) -> list[str]:
        """Every URL to deliver to, each once (two configured names may share a replica)."""
        out: list[str] = []
        for url in self.configured:
            for u in self.expanded[url]:
                if u not in out:
                    out.append(u)
        return out

    def counts(self) -> dict[str, int]:
        return {url: len(self.expanded[url]) for url in self.configured}
