"""Spool replay on a new connection: the spooled batches above the aggregator's
high-water mark, oldest first, sent verbatim (they are self-contained)."""

from __future__ import annotations

from ..proto.codec import agent_message_from_batch_bytes
from .spool import MemorySpool


class SpoolReplay:
    """A cursor over the spool.  Entries stay in the spool until acked, so ``next()``
    only moves past them; batches spooled meanwhile (behind the replay) are reached too."""

    def __init__(self, spool: MemorySpool, after: int) -> None:
        self._spool = spool
        self._cursor = after
        self.done = False

    def next(self) -> tuple[int, bytes] | None:
        """(seq, serialized AgentMessage) of the next spooled batch; None, and ``done``, at the end."""
        nxt = self._spool.next_after(self._cursor)
        if nxt is None:
            self.done = True
            return None
        seq, payload = nxt
        self._cursor = seq
        return seq, agent_message_from_batch_bytes(payload)
