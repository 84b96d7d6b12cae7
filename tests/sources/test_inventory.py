"""Discovery with its per-device cache sees exactly what a fresh discovery sees, across hot-unplug and re-probe."""

from __future__ import annotations

from fabricmon.sources.inventory import discover


def test_cached_discovery_equals_fresh_across_unplug_and_reprobe(make_fixture):
    root = make_fixture(layout="roce", fault="hot_unplug", snapshots=3, fault_start=1, fault_end=2)
    cache: dict = {}
    memory_cached: dict[str, str] = {}
    memory_fresh: dict[str, str] = {}
    for t in ("t0", "t0", "t1", "t2", "t2"):
        sys_root = str(root / t / "sys")
        cached = discover(sys_root, rail_memory=memory_cached, cache=cache)
        fresh = discover(sys_root, rail_memory=memory_fresh)
        assert cached.devices == fresh.devices
        assert cached.ports == fresh.ports
        assert set(cache) == {d.name for d in fresh.devices}
