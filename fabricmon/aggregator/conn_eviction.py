"""Which gRPC connection goes when the connection limit is reached (issue 35): pure bookkeeping.

Only connections that never carried an authenticated stream are candidates; among them, the oldest
connection of the peer host holding the most of them.  A flood from one host (or a few) therefore
evicts its own connections first, and an agent's new connection, one per node, is evicted only
when its host holds as many unauthenticated connections as any other.  Within one host the oldest
goes first, so a fresh connection is kept while its TLS and HTTP/2 handshakes run: it is evicted
only after as many newer unauthenticated connections from that host arrived as the host held
before it (an age grace measured in arrivals, not seconds: a time grace would let a flood that
keeps every slot younger than the grace refuse everyone).  When every connection is
authenticated nothing is evicted and the new connection is refused.

Victim choice is O(1): per host an insertion-ordered dict of its candidates (oldest first), and
hosts bucketed by how many candidates they hold (each bucket insertion-ordered: among hosts with
equally many, the one that reached that count first).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class EvictionOrder(Generic[K]):
    """Unauthenticated connections (keys) by peer host.  ``add`` a new one, ``remove`` one that closed
    or authenticated; ``victim`` is the one to evict at the limit (None: all are authenticated)."""

    def __init__(self) -> None:
        self._by_host: dict[str, dict[K, None]] = {}  # host -> its candidates, oldest first
        self._host_of: dict[K, str] = {}
        self._buckets: dict[int, dict[str, None]] = {}  # count -> hosts holding that many
        self._max = 0

    def __len__(self) -> int:
        return len(self._host_of)

    def __contains__(self, key: object) -> bool:
        return key in self._host_of

    def _move(self, host: str, old: int, new: int) -> None:
        if old:
            bucket = self._buckets[old]
            del bucket[host]
            if not bucket:
                del self._buckets[old]
        if new:
            self._buckets.setdefault(new, {})[host] = None
        if new > self._max:
            self._max = new
        elif old == self._max and old not in self._buckets:
            # the host that left the top bucket now sits one below it (or none is left)
            self._max = new if new in self._buckets else 0

    def add(self, key: K, host: str) -> None:
        if key in self._host_of:
            return
        conns = self._by_host.setdefault(host, {})
        conns[key] = None
        self._host_of[key] = host
        self._move(host, len(conns) - 1, len(conns))

    def remove(self, key: K) -> None:
        host = self._host_of.pop(key, None)
        if host is None:
            return
        conns = self._by_host[host]
        del conns[key]
        self._move(host, len(conns) + 1, len(conns))
        if not conns:
            del self._by_host[host]

    def victim(self) -> K | None:
        if not self._max:
            return None
        host = next(iter(self._buckets[self._max]))
        return next(iter(self._by_host[host]))

    def counts(self) -> dict[str, int]:
        """Candidates per host (for tests and logs)."""
        return {h: len(c) for h, c in self._by_host.items()}
