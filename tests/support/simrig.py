"""Fault windows of a scenario, as the in-memory simulator injects them."""

from __future__ import annotations

from fabricmon.sim.scenario import Fault


def faults_for(layout: str) -> tuple[Fault, ...]:
    f = [Fault("flaky_cable", node="node-001", rail=3, start=2, end=6),
         Fault("link_flap", node="node-001", rail=1, start=3, end=9, period=2),
         Fault("link_degraded", node="node-001", rail=2, start=2, end=5, degrade="speed"),
         Fault("rdma_retransmits", node="node-001", rail=4, start=1, end=10),
         Fault("nvlink_errors", node="node-001", gpu=2, link=5, start=2),
         Fault("nvlink_down", node="node-001", gpu=3, link=1, start=2, end=6),
         Fault("slow_gpu", node="node-001", gpu=4, start=3),
         Fault("pfc_storm", node="node-001", start=2, end=8),
         Fault("counter_reset", node="node-001", start=7)]
    if layout == "roce":
        f += [Fault("config_drift", node="node-001", rail=6, start=2, end=5),
              Fault("ecn_congestion", unit=0, rail=7, start=3, end=8)]
    else:
        f += [Fault("leaf_degraded", unit=0, rail=7, start=3, end=8)]
    return tuple(f)
