"""A restarted aggregator or shard pages nobody for nodes that are only reconnecting (issue 25):
every node gets ``max(60 s, 5 intervals)`` of sample time from the aggregator's first tick before
FabricmonAgentDown, while its agent reconnects and replays a spool older than the cluster clock."""

from __future__ import annotations

import pytest

from fabricmon.aggregator.agents_down import restart_grace
from fabricmon.aggregator.config import DetectionSettings
from support.enginerig import T0, Cluster


def test_grace_is_max_of_60s_and_5_intervals():
    s = DetectionSettings()
    assert restart_grace(s, 1.0) == 60.0 and restart_grace(s, 10.0) == 60.0 and restart_grace(s, 30.0) == 150.0


@pytest.mark.parametrize("interval", [1.0, 30.0])
def test_a_node_replaying_its_spool_after_a_restart_is_not_down_within_the_grace(interval):
    c = Cluster(nodes=4, nodes_per_unit=4)
    for f in c.feeds.values():
        f.interval = interval
        c.engine.hello(f.hello())
    late = c.feeds.pop("node-002")
    # The aggregator's first tick: node-002's agent delivers only its spool, minutes old.
    c.engine.ingest(late.batch(T0 - 300.0, first=True))
    grace = restart_grace(DetectionSettings(), interval)
    c.run(int(grace) - 1)
    assert c.incidents(alertname="FabricmonAgentDown") == []
    # Still nothing fresh once the grace is over: now it is down, and said once.
    c.run(3)
    assert [i.component for i in c.incidents(alertname="FabricmonAgentDown")] == ["node-002"]
    # It catches up: resolved.
    c.feeds["node-002"] = late
    c.run(5)
    assert [i.component for i in c.incidents(alertname="FabricmonAgentDown") if i.open] == []
