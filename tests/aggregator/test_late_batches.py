"""Windows and holds scale with the agents' interval: a node polled every 10 s whose batches reach the
aggregator up to 3 intervals late (a restarted shard's CPU burst, a reconnect) keeps one incident,
fired once and resolved once, instead of resolved between batches and fired again (issue 25)."""

from __future__ import annotations

import pytest

from fabricmon import components
from fabricmon.aggregator.incidents import Finding
from fabricmon.aggregator.lateness import HOLD_INTERVALS, node_time, scale_holds
from support.enginerig import T0, Cluster, flaky


def test_node_time_and_hold_floor():
    assert node_time(100.0, 70.0, 10.0) == 70.0      # 3 intervals behind: its own time
    assert node_time(100.0, 69.0, 10.0) == 100.0     # later than that: the cluster's
    assert node_time(100.0, float("-inf"), 1.0) == 100.0
    fs = [Finding("FabricLinkErrors", components.link("n", "mlx5_0"), {"node": "n"}, []),
          Finding("FabricmonAgentDown", components.node("n"), {"node": "n"}, [], hold_s=0.0),
          Finding("FabricLeafDegraded", components.leaf("leaf-u0-r0"), {"leaf": "leaf-u0-r0"}, [], hold_s=15.0)]
    scale_holds(fs, lambda node: 10.0 if node else 30.0, 15.0)
    assert [f.hold_s for f in fs] == [HOLD_INTERVALS * 10.0, 0.0, HOLD_INTERVALS * 30.0]


@pytest.mark.parametrize("late", [0.0, 15.0, 30.0])
def test_a_slow_node_late_by_up_to_3_intervals_fires_once_and_resolves_once(late):
    c = Cluster()
    for f in c.feeds.values():
        f.interval = 10.0
        c.engine.hello(f.hello())
    sick_node = "node-003"
    sick = flaky(sick_node, "mlx5_3")
    t_stop = T0 + 200.0
    pending: list = []  # the sick node's batches, delivered ``late`` seconds after their sample time
    for k in range(1, 40):
        ts = T0 + 10.0 * k
        if ts <= t_stop:
            sick(c)
        for name, f in c.feeds.items():
            b = f.batch(ts, first=(k == 1))
            if name == sick_node:
                pending.append(b)
            else:
                c.engine.ingest(b)
        for tick in range(10):
            now = ts + tick
            while pending and pending[0].ts + late <= now:
                c.engine.ingest(pending.pop(0))
            for inc in c.engine.tick(now):
                c.reported.append((now, inc.alertname, inc.component, inc.open))
    link = [(t, o) for t, a, comp, o in c.reported if a == "FabricLinkErrors"]
    assert [o for _, o in link] == [True, False], c.reported
    assert {comp for _, a, comp, _ in c.reported} == {"node-003/mlx5_3/1"}, c.reported
