"""Times and durations in alert text read as a technician reads them (issue 36): RFC3339, rounded.
A page said "since t=1795847686" and "PMA symbol/rcv errors +110 in 3.00087s"."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from support.enginerig import T0, Cluster, _set_state, flaky

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def test_helpers():
    from fabricmon.aggregator.wording import at, secs

    assert at(1795847686.4) == "2026-11-28T06:34:46Z"
    assert secs(3.00087) == "3s" and secs(119.6) == "120s" and secs(0.25) == "0.2s"


def test_link_evidence_has_rfc3339_times_and_whole_seconds():
    c = Cluster(nodes=4, nodes_per_unit=4)
    for f in c.feeds.values():
        f.interval = 1.00029  # a poll a little behind its cadence: the window widens to it
        c.engine.hello(f.hello())
    c.run(5)
    c.run(8, lambda cl: (_set_state(cl, "node-001", "mlx5_6", 1, 2), flaky("node-002", "mlx5_3")(cl)))
    down = c.incidents(alertname="FabricLinkDown")[0]
    text = " ".join(down.evidence)
    assert "t=" not in text and RFC3339.search(text), text
    assert datetime.fromtimestamp(T0, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ") < RFC3339.search(text).group(0)
    errs = " ".join(c.incidents(alertname="FabricLinkErrors")[0].evidence)
    assert re.search(r"\+\d+ in \d+s", errs) and not re.search(r"\d\.\d+s", errs), errs
