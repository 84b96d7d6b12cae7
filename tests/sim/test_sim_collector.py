"""The long-run collector plan: paused, then settled (frozen, fewer young collections), then restored."""

from __future__ import annotations

import gc

from fabricmon.sim.collector import THRESHOLDS, LongRunCollector


def test_pause_settle_restore_gives_the_process_its_settings_back():
    before = gc.get_threshold()
    assert gc.isenabled()
    c = LongRunCollector()
    try:
        c.pause()
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]  # long-lived state built while paused
        c.settle()
        assert gc.isenabled() and gc.get_threshold() == THRESHOLDS
        assert gc.get_freeze_count() >= len(kept)
        c.settle()  # once only: a second call changes nothing
        assert gc.get_threshold() == THRESHOLDS
    finally:
        c.restore()
    assert gc.isenabled() and gc.get_threshold() == before and gc.get_freeze_count() == 0
