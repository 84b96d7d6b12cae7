"""A SIGHUP storm at 4,096 nodes does not stop detection (issue 26, "Reloads that lie").

Twenty SIGHUPs in ten seconds, each after the topology file changed (a node added, then removed
again), so every reload that runs parses all 4,096 nodes.  Reloads run off the detection thread
and the storm is coalesced: ticks go on at close to their rate, and the last file is what runs.
"""

from __future__ import annotations

import time

import pytest

from support.aggrig import Aggregator, Rig
from support.waiting import wait_until

NODES = 4096
TICK = 0.25
STORM_S = 10.0
SIGNALS = 20
QUIET_S = 3.0


def _topology(extra: bool) -> str:
    """4,096 nodes listed one by one (what a site exports), two NICs each; ``extra``: one more."""
    lines = ["cluster: storm", "layout: roce", "nodes_per_unit: 32", "nodes:"]
    for i in range(NODES + (1 if extra else 0)):
        lines.append(f"- {{name: node-{i:04d}, unit: {i // 32}, gpus: 8, nics: [{{device: mlx5_0, rail: 0, gpu: 0}}, "
                     f"{{device: mlx5_1, rail: 1, gpu: 1}}]}}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def test_twenty_sighups_in_ten_seconds_at_4096_nodes_keep_detection_ticking(tmp_path, rig):
    agg = rig(Aggregator, {"insecure": True}, topology=_topology(False), extra={"tick_seconds": TICK})
    topo = agg.topology
    assert agg.value("fabricmon_topology_nodes") == NODES
    # the tick rate this machine gives without reloads (CI machines are shared: compare like with like)
    quiet0, q0 = agg.value("fabricmon_ticks_total"), time.monotonic()
    time.sleep(QUIET_S)
    quiet_rate = (agg.value("fabricmon_ticks_total") - quiet0) / (time.monotonic() - q0)
    ticks0 = agg.value("fabricmon_ticks_total")
    t0 = time.monotonic()
    for k in range(SIGNALS):
        topo.write_text(_topology(k % 2 == 0))
        agg.reload.set()
        time.sleep(max(0.0, t0 + (k + 1) * STORM_S / SIGNALS - time.monotonic()))
    elapsed = time.monotonic() - t0
    storm_rate = (agg.value("fabricmon_ticks_total") - ticks0) / elapsed
    print(f"ticks/s quiet {quiet_rate:.2f}, during the storm {storm_rate:.2f}")
    # detection went on through the storm (a reload in the tick thread left 1 tick in 10 s)
    assert storm_rate >= 0.5 * quiet_rate, (storm_rate, quiet_rate, 1 / TICK)
    # the storm was coalesced: the last file (the extra node removed again) is what runs
    assert wait_until(lambda: not agg.reload.is_set() and agg.value("fabricmon_topology_nodes") == NODES, 60)
    assert agg.value("fabricmon_config_last_reload_successful") == 1
    runs = sum(agg.value(f'fabricmon_config_reloads_total{{result="{r}"}}') for r in ("success", "failure"))
    print(f"{SIGNALS} SIGHUPs, {runs:.0f} reloads run")
    assert 2 <= runs < SIGNALS, runs
