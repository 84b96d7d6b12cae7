"""Python's cyclic garbage collector over a long simulation: paused while the state is built, then
kept off the long-lived heap.

Connecting 4,096 simulated nodes defines about four million series on both sides of the codec
(encoder ids, decoder keys, the decoder's zero deltas): while that heap grows, each full collection
rescans all of it, and they come often because the heap keeps growing (a 1,024-node demo's first
step spent more time collecting than working).  None of it is garbage, so the collector waits
until the build-up (the hellos and the first batches) is over; then one collection, and what
survives is frozen (``gc.freeze``: never scanned again), and young objects are collected less
often.  Nothing is skipped and nothing changes but when the collector runs; ``restore`` puts the
process's settings back (the demo also runs inside test processes).
"""

from __future__ import annotations

import gc

# young objects per collection: a step allocates hundreds of thousands of short-lived ones
YOUNG_THRESHOLD = 100_000
THRESHOLDS = (YOUNG_THRESHOLD, 20, 100)


def settle() -> None:
    """Collect once, freeze what survives, collect young objects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


class LongRunCollector:
    """``pause()`` before the build-up, ``settle()`` after it (collector enabled again), ``restore()`` at the end."""

    def __init__(self) -> None:
        self._was_enabled = gc.isenabled()
        self._thresholds = gc.get_threshold()
        self.settled = False

    def pause(self) -> None:
        gc.disable()

    def settle(self) -> None:
        if self.settled:
            return
        self.settled = True
        settle()
        if self._was_enabled:
            gc.enable()

    def restore(self) -> None:
        gc.unfreeze()
        gc.set_threshold(*self._thresholds)
        if self._was_enabled:
            gc.enable()
