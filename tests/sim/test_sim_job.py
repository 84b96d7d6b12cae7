"""The synthetic job: slow links slow exactly their rings; a slow GPU's rank has the shortest comm time."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from fabricmon.rank_timing import RankTiming, parse_line
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.job import JobSpec, SyntheticJob, layout_line, timing_lines
from fabricmon.sim.scenario import ClusterSpec, Scenario

SPEC = JobSpec()  # frozen: one shared default


def one_step(scn: Scenario, spec: JobSpec = SPEC, t: float = 5.0) -> list[RankTiming]:
    c = ClusterState(scn)
    job = SyntheticJob(c.names, spec, seed=scn.cluster.seed, epoch=c.epoch, start=t)
    out = job.advance_to(t + 10, c.effects(t))
    step1 = [r for r in out if r.step == 1]
    assert len(step1) == scn.cluster.nodes * 8
    return step1


def comm(timings) -> dict[int, float]:
    return {r.rank: r.comm_seconds for r in timings}


def test_degraded_link_slows_exactly_the_ranks_whose_ring_traverses_it():
    base = Scenario(ClusterSpec(16, "ib", 8, seed=1), 60)
    spec = JobSpec(pp=2)  # two stages of 8 nodes: the ring of rail 3 in stage 1 holds nodes 8..15
    clean = comm(one_step(base, spec))
    slow_t = one_step(base.with_fault("link_degraded", node="node-010", rail=3, start=0), spec)
    slow = comm(slow_t)
    ring = {n * 8 + 3 for n in range(8, 16)}
    stage0 = set(range(0, 64))  # nodes 0..7: done early, they wait for stage 1 in their p2p receives
    up = {r for r in slow if slow[r] - clean[r] > 0.1}
    assert up == ring | stage0
    for r in set(slow) - ring - stage0:
        assert abs(slow[r] - clean[r]) < 0.05  # the other rails of its stage: comm time unchanged ...
    assert len({t.step_seconds for t in slow_t}) == 1  # ... but everyone's step waits (synchronous)
    assert slow_t[0].step_seconds > one_step(base, spec)[0].step_seconds + 0.1


def test_leaf_fault_slows_every_ring_of_that_rail_through_the_unit():
    base = Scenario(ClusterSpec(32, "ib", 8, seed=2), 60)
    spec = JobSpec(pp=4)  # stage s = unit s here (8 nodes each)
    clean = comm(one_step(base, spec))
    slow = comm(one_step(base.with_fault("leaf_degraded", unit=2, rail=5, start=0), spec))
    up = {r for r in slow if slow[r] - clean[r] > 0.1}
    others = {r for r in slow if not 128 <= r < 192}  # stages 0, 1, 3 wait for stage 2 in p2p
    assert up == {n * 8 + 5 for n in range(16, 24)} | others


def test_slow_gpu_rank_has_the_shortest_comm_in_its_groups():
    scn = Scenario(ClusterSpec(8, "roce", 8, seed=3), 60).with_fault("slow_gpu", node="node-005", gpu=6, start=0)
    t = one_step(scn)
    by_rank = {r.rank: r for r in t}
    slow = 5 * 8 + 6
    tp_group = [by_rank[5 * 8 + g] for g in range(8)]
    ring = [by_rank[n * 8 + 6] for n in range(8)]
    for group in (tp_group, ring):
        shortest = min(group, key=lambda r: r.comm_seconds)
        assert shortest.rank == slow
        others = sorted(r.comm_seconds for r in group if r.rank != slow)
        assert others[0] - by_rank[slow].comm_seconds > 0.2  # the wait shows on every peer
    # compute (step - comm) is what is late: the straggler is findable by lateness
    late = max(t, key=lambda r: r.step_seconds - r.comm_seconds)
    assert late.rank == slow


def test_nominal_job_has_no_straggler_and_plausible_times():
    t = one_step(Scenario(ClusterSpec(16, "ib", 16, seed=4), 60))
    cs = np.array([r.comm_seconds for r in t])
    assert 0.3 < cs.mean() < 0.7 and cs.std() < 0.05
    assert 1.5 < t[0].step_seconds < 2.0
    assert {r.group for r in t if r.rank == 17} == {(("tp", 1), ("pp", 0), ("dp", 2))}


def test_timings_are_lines_the_intake_parses():
    c = ClusterState(Scenario(ClusterSpec(2, "ib", 2), 60))
    job = SyntheticJob(c.names, JobSpec(), epoch=c.epoch)
    timings = job.advance_to(4.0, c.effects())
    assert timings and all(r.ts <= c.epoch + 4.0 for r in timings)
    assert sorted({r.step for r in timings}) == [1, 2]
    for line, r in zip(timing_lines(timings), timings, strict=True):
        back = parse_line(line, node=r.node)
        assert back == r
    assert parse_line(layout_line(job)).layout == (("tp", 8), ("pp", 1), ("dp", 2))


def test_job_steps_end_at_sample_time():
    c = ClusterState(Scenario(ClusterSpec(4, "ib", 4), 60))
    job = SyntheticJob(c.names, JobSpec(), epoch=c.epoch)
    got = []
    for t in range(1, 11):
        got += job.advance_to(float(t), c.effects())
    ends = sorted({r.ts for r in got})
    assert all(b > a for a, b in pairwise(ends))
    assert ends[-1] <= c.epoch + 10.0 and len(ends) == job.step


def test_late_pipeline_stage_shows_as_the_other_stages_p2p_wait():
    """stage_imbalance: the late stage's compute is longer; the other stages wait in their p2p receives
    (communication), so the late stage is the one whose step - comm stands out."""
    from fabricmon.sim.workload import Decoy

    scn = Scenario(ClusterSpec(16, "ib", 16, seed=6), 60)
    c = ClusterState(scn)
    job = SyntheticJob(c.names, JobSpec(pp=4), seed=6, epoch=c.epoch,
                       decoys=[Decoy("stage_imbalance", job="llm-7b", stage=2, magnitude=1.2)])
    t = [r for r in job.advance_to(10.0, c.effects()) if r.step == 1]
    compute = {}
    for r in t:
        compute.setdefault(r.rank // 32, []).append(r.step_seconds - r.comm_seconds)
    med = {s: float(np.median(v)) for s, v in compute.items()}
    assert max(med, key=med.get) == 2
    assert med[2] - max(v for s, v in med.items() if s != 2) > 0.15


def test_draws_are_keyed_by_step_not_by_how_often_a_step_was_simulated():
    scn = Scenario(ClusterSpec(8, "ib", 8, seed=9), 60)
    c = ClusterState(scn)
    coarse = SyntheticJob(c.names, JobSpec(), seed=9, epoch=c.epoch).advance_to(30.0, c.effects())
    fine_job = SyntheticJob(c.names, JobSpec(), seed=9, epoch=c.epoch)
    fine = []
    for k in range(1, 301):  # 0.1 s intervals: each step is simulated ~15 times before it ends
        fine += fine_job.advance_to(k * 0.1, c.effects())
    assert [(r.rank, r.step, r.comm_seconds) for r in coarse] == [(r.rank, r.step, r.comm_seconds) for r in fine]
