"""Whether the periodic detection tick may be skipped: nothing it reads changed since the last one.

The runtime ticks every quarter second at the cluster clock (runtime.py).  In sample mode that clock is
the nodes' median sample time, which moves once per poll interval, and the agents of one cluster poll
together: most ticks run at the sample time of the one before, with no batch, hello, disconnect or
NCCL RAS report in between.  Such a tick would compute the same findings and change no incident (the
detectors read the engine's state and ``now`` only; ``IncidentManager.update`` at the same ``now`` with
the same findings changes nothing), so it is skipped and counted (``fabricmon_ticks_skipped_total``).

What a tick reads, as the key compared:

- ``now``;
- ``EngineState.inputs``: moved by every call that changes what a tick reads (a batch judged, a hello, a
  disconnect, a RAS report or a query taken), inside the engine lock with the change itself;
- the settings and topology objects (a reload swaps them) and the topology's NIC-map version (bindings);
- ``IncidentManager.updates`` after the last tick: an update outside a tick (a reload resolving
  incidents) runs the next one.

Never skipped: a tick with an explicit ``now`` (tests, a final tick at stop), an engine reading the other
shards' incidents (they arrive from another thread) or acting on faults (remediation's results arrive
asynchronously), and the tick after one that raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine


class TickGate:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.skipped_total = 0
        # the key of the last tick run, with the manager's updates after it
        self._last: tuple[tuple[float, int, object, object, int] | None, int] | None = None

    def _key(self, now: float) -> tuple[float, int, object, object, int] | None:
        e = self.engine
        d = e.detection
        if d.remote is not None or d.cross is not None or d.remediation is not None:
            return None
        st = e.state
        return (now, st.inputs, st.settings, st.topology, st.topology.index.version)

    def skip(self, now: float) -> bool:
        """True (and counted) when a tick at ``now`` would read what the last one read."""
        key = self._key(now)
        last = self._last
        if key is None or last is None or last[1] != self.engine.manager.updates:
            return False
        before = last[0]
        # numbers by value, the settings and topology by identity (a reload's new objects run a tick)
        same = (before is not None and key[0] == before[0] and key[1] == before[1] and key[2] is before[2]
                and key[3] is before[3] and key[4] == before[4])
        if same:
            self.skipped_total += 1
        return same

    def before(self, now: float | None) -> tuple[float, int, object, object, int] | None:
        """The key to remember for a tick about to run (read before it: a change during the tick moves
        the key and runs the next one); None for a tick that never counts as a skip's reference."""
        return self._key(now) if now is not None else None

    def ran(self, key: tuple[float, int, object, object, int] | None) -> None:
        """The tick of ``key`` ran (None: it raised or had an explicit time: the next tick runs)."""
        self._last = (key, self.engine.manager.updates) if key is not None else None
