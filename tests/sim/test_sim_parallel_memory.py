"""The parallel memory simulator (sim/parallel_memory.py): the agents' end of the wire in a worker process
gives the aggregator exactly the bytes, batches and incidents one process gives."""

from __future__ import annotations

import pytest

from fabricmon.aggregator.engine import Engine
from fabricmon.sim.drive import Drive
from fabricmon.sim.parallel_memory import ParallelMemoryCluster
from fabricmon.sim.runner import ClusterSim, SimulatedCluster
from fabricmon.sim.scenario import default_scenario

pytest.importorskip("numpy")

EPOCH = 1_764_000_000.0


def _drive(sim: ClusterSim) -> tuple[list, int, int, int, list]:
    engine = Engine(sim.topology, cluster="t")
    d = Drive(sim, engine=engine, wire=True)
    try:
        d.connect()
        steps = d.run()
    finally:
        sim.close()
    assert d.wire is not None
    incidents = sorted((i.alertname, i.component, i.first_seen - EPOCH, i.resolved_at) for i in engine.incidents())
    return incidents, steps, d.wire.bytes_total, d.wire.batches_total, sim.jobs_truth()


@pytest.mark.integration
def test_the_worker_sends_the_bytes_one_process_encodes_and_the_same_incidents_follow():
    scn = default_scenario(nodes=8, duration=30, nodes_per_unit=4, seed=7)
    one = _drive(SimulatedCluster(scn, mode="memory", epoch=EPOCH, rank_intake=True))
    two = _drive(ParallelMemoryCluster(scn, epoch=EPOCH))
    assert two == one
    incidents, steps, nbytes, batches, _ = two
    assert steps == 30 and batches == 8 * 31  # the initial batches and 30 steps of 8 nodes, all over the wire
    assert {(a, c) for a, c, _, _ in incidents} >= {("FabricLinkErrors", "node-007/mlx5_3/1")}
    assert nbytes > 0


@pytest.mark.integration
def test_the_heartbeats_announce_the_parents_ras_servers():
    """The jobs' RAS servers run in the parent (the engine's queries go there): the worker's heartbeats
    carry their addresses, as the single-process simulator's do."""
    scn = default_scenario(nodes=8, duration=6, nodes_per_unit=4, seed=7)  # a heartbeat every 5 s
    sim = ParallelMemoryCluster(scn, epoch=EPOCH, nccl_ras=True)
    engine = Engine(sim.topology, cluster="t")
    d = Drive(sim, engine=engine, wire=True)
    try:
        d.connect()
        d.run()
        assert sim.ras is not None and sim.driver.jobs is not None
        servers = {job.spec.name: job.nccl_ras for job in sim.driver.jobs.jobs}
    finally:
        sim.close()
    heard = {key[0]: {rb.nccl_ras for rb in jb.ranks.values()} for key, jb in engine.heartbeats.jobs.items()}
    assert set(heard) == {"llm-70b", "vlm-13b"}
    for job, addrs in heard.items():
        assert addrs == {servers[job]} and servers[job].startswith("127.0.0.1:"), (job, addrs, servers)


def test_a_drive_without_the_wire_refuses_a_simulator_that_sends_bytes():
    scn = default_scenario(nodes=8, duration=4, nodes_per_unit=4, seed=7)
    sim = ParallelMemoryCluster(scn, epoch=EPOCH)
    try:
        with pytest.raises(ValueError, match="needs wire=True"):
            Drive(sim, engine=Engine(sim.topology, cluster="t")).connect()
    finally:
        sim.close()


def test_memory_mode_builds_every_node_or_none():
    scn = default_scenario(nodes=8, duration=4, nodes_per_unit=4, seed=7)
    with pytest.raises(ValueError, match="every node's batches or none"):
        SimulatedCluster(scn, mode="memory", nodes=[0, 1])
    state = SimulatedCluster(scn, mode="memory", nodes=[], epoch=EPOCH)  # the parallel simulator's parent
    got: list = []
    state.on_batch = got.append
    assert state.hellos() == []
    state.step()
    assert state.t == 1.0 and got == [] and state.jobs_truth()
