"""The stream thread's loop: one ``Session`` (stream_session.py) per connection, and between connections a
jittered exponential backoff during which queued snapshots go to the spool.

``StreamClient`` (stream.py) runs ``Reconnector.run`` on its thread and asks it for the live ``session``
(whose credentials a reload compares with the files).  Whatever fails in a session or while spooling
costs that attempt, never the thread.
"""

from __future__ import annotations

import random
import time

import structlog

from .stream_session import Session
from .stream_state import StreamState

log = structlog.get_logger("fabricmon.stream")


class Reconnector:
    def __init__(self, state: StreamState, backoff_min: float, backoff_max: float, rng: random.Random) -> None:
        self.state = state
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.rng = rng
        self.session: Session | None = None  # the newest connection's (None before the first)

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter, within [backoff_min, backoff_max]."""
        cap = min(self.backoff_max, self.backoff_min * (2 ** min(attempt, 30)))
        return max(self.backoff_min, self.rng.uniform(0.0, cap))

    def run(self) -> None:
        st = self.state
        attempt = 0
        while not st.stop.is_set():
            # Whatever fails in a session or while spooling costs that attempt, never the
            # thread: it is logged, counted, and the loop goes on after the backoff.
            try:
                self.session = Session(st)
                established = self.session.run()
            except Exception as exc:
                st.count("thread_restarts_total")
                log.error("stream_session_failed", error=f"{type(exc).__name__}: {exc}")
                established = False
            if established:
                attempt = 0
            if st.stop.is_set():
                break
            delay = self.backoff(attempt)
            attempt += 1
            try:
                self.spool_for(delay)
            except Exception as exc:
                st.count("thread_restarts_total")
                log.error("stream_spooling_failed", error=f"{type(exc).__name__}: {exc}")
                st.stop.wait(min(delay, 1.0))
        try:
            st.drain_to_spool()
        except Exception as exc:
            log.error("stream_final_spool_failed", error=f"{type(exc).__name__}: {exc}")

    def spool_for(self, seconds: float) -> None:
        st = self.state
        deadline = time.monotonic() + seconds
        while not st.stop.is_set():
            st.drain_to_spool()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            st.wake.wait(min(left, 0.5))
            st.wake.clear()
