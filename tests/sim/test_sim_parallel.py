"""Worker processes render and poll their share of the nodes and produce exactly the batches one process would."""

from __future__ import annotations

import pytest

from fabricmon.sim.parallel import ParallelTreeCluster
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import ClusterSpec, Scenario

EPOCH = 1_700_000_000.0


def _key(b):
    return (b.node, b.seq, b.ts, tuple(sorted(b.deltas, key=lambda d: (d.family, d.labels))),
            tuple(sorted(b.gauges, key=lambda g: (g.family, g.labels))), b.ranks)


@pytest.mark.integration
def test_parallel_workers_equal_one_process(tmp_path):
    scn = Scenario(ClusterSpec(nodes=4, layout="roce", nodes_per_unit=2, seed=3), 6.0).with_fault(
        "flaky_cable", node="node-001", rail=2, start=2, end=5)
    one: list = []
    single = SimulatedCluster(scn, mode="tree", interval=1.0, base_dir=tmp_path / "one", epoch=EPOCH,
                              on_batch=one.append)
    par: list = []
    parallel = ParallelTreeCluster(scn, interval=1.0, base_dir=str(tmp_path / "par"), epoch=EPOCH, workers=2,
                                   on_batch=par.append)
    try:
        single.start()
        parallel.start()
        assert sorted(h.node for h in parallel.hellos()) == sorted(h.node for h in single.hellos())
        for _ in range(4):
            single.step()
            parallel.step()
            assert parallel.t == single.t and parallel.now() == single.now()
    finally:
        single.close()
        parallel.close()
    assert len(one) == len(par) == 4 * 5  # the initial poll and four steps, four nodes
    assert sorted(map(_key, one)) == sorted(map(_key, par))
    # the fault really is in there: the flaky port's symbol errors moved
    assert any(d.family == "fabricmon_ib_port_errors_total" and ("device", "mlx5_2") in d.labels and d.delta > 0
               for b in par if b.node == "node-001" for d in b.deltas)
