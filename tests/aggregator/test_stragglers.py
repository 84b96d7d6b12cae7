"""Straggler scoring on hand-built rank timings: inversion, persistence, hysteresis, non-hardware patterns."""

from __future__ import annotations

import random

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.stragglers import StragglerTracker
from fabricmon.rank_timing import JobLayout, RankTiming


def feed(tr: StragglerTracker, steps: range, n: int = 32, late=lambda step, rank: 0.0, comm_slow=lambda s, r: 0.0,
         seed: int = 1, group=None) -> None:
    rng = random.Random(seed)
    for step in steps:
        comp = {r: 1.5 + late(step, r) + rng.gauss(0, 0.01) for r in range(n)}
        slowest = max(comp.values())
        for r in range(n):
            transfer = 0.5 + comm_slow(step, r) + rng.gauss(0, 0.005)
            wait = slowest - comp[r]
            g = group(r) if group else ()
            tr.add(RankTiming("j", r, r % 8, step, comp[r] + wait + transfer, wait + transfer, float(step),
                              node=f"node-{r // 8:03d}", group=g), "")
        tr.evaluate(float(step))


def test_compute_straggler_found_by_inversion_after_persistence():
    tr = StragglerTracker(DetectionSettings())
    feed(tr, range(1, 8), late=lambda s, r: 0.2 if r == 11 else 0.0)
    assert tr.evaluate(8.0).stragglers == []  # 7 steps: not yet persistent
    feed(tr, range(8, 12), late=lambda s, r: 0.2 if r == 11 else 0.0)
    st = tr.evaluate(12.0).stragglers
    assert [(x.rank, x.kind, x.node, x.gpu) for x in st] == [(11, "compute", "node-001", 3)]
    assert st[0].late_frac > 0.05
    # hysteresis: cleared only after the flags fall below the clear bar
    feed(tr, range(12, 16))
    assert [x.rank for x in tr.evaluate(16.0).stragglers] == [11]
    feed(tr, range(16, 24))
    assert tr.evaluate(24.0).stragglers == []


def test_small_lateness_below_impact_is_ignored():
    tr = StragglerTracker(DetectionSettings())
    feed(tr, range(1, 20), late=lambda s, r: 0.03 if r == 5 else 0.0)  # 1.5% of a 2 s step
    assert tr.evaluate(20.0).stragglers == []


def test_comm_slow_rank():
    tr = StragglerTracker(DetectionSettings())
    feed(tr, range(1, 15), comm_slow=lambda s, r: 0.3 if r == 20 else 0.0)
    st = tr.evaluate(15.0).stragglers
    assert [(x.rank, x.kind) for x in st] == [(20, "comm")]


def test_random_rank_each_step_and_periodic_pause_are_not_stragglers():
    rng = random.Random(4)
    picks = {s: rng.randrange(32) for s in range(1, 60)}
    tr = StragglerTracker(DetectionSettings())
    feed(tr, range(1, 60), late=lambda s, r: 0.4 if picks[s] == r else 0.0)
    rep = tr.evaluate(60.0)
    assert rep.stragglers == [] and rep.stages == []
    tr = StragglerTracker(DetectionSettings())
    feed(tr, range(1, 60), late=lambda s, r: 0.6 if r // 8 == 2 and s % 4 == 0 else 0.0)
    rep = tr.evaluate(60.0)
    assert rep.stragglers == [] and rep.stages == []


def test_stage_imbalance_with_layout_is_a_stage_not_ranks():
    tr = StragglerTracker(DetectionSettings())
    tr.layout(JobLayout("j", (("tp", 8), ("pp", 4), ("dp", 1))))
    feed(tr, range(1, 15), late=lambda s, r: 0.3 if r >= 24 else 0.0)  # last stage (ranks 24..31) slower
    rep = tr.evaluate(15.0)
    assert rep.stragglers == []
    assert [(x.job, x.stage) for x in rep.stages] == [("j", 3)]
    assert rep.stages[0].ranks == tuple(range(24, 32))


def test_mad_floor_keeps_quiet_groups_from_dividing_by_zero():
    tr = StragglerTracker(DetectionSettings())
    # perfectly identical timings (MAD 0) and a 1% wobble on one rank: no flag
    for step in range(1, 20):
        for r in range(16):
            extra = 0.02 if r == 3 else 0.0
            tr.add(RankTiming("q", r, r % 8, step, 2.0, 0.5 - extra, float(step), node="n"), "")
    rep = tr.evaluate(20.0)
    assert rep.stragglers == []
    assert all(score < 4.0 for _, _, _, score in tr.lateness_by_job())


def test_report_is_reused_between_scored_steps_and_rebuilt_after_one():
    tr = StragglerTracker(DetectionSettings())
    feed(tr, range(1, 12), late=lambda s, r: 0.2 if r == 11 else 0.0)
    a = tr.evaluate(12.0)
    assert tr.evaluate(12.25) is a and tr.evaluate(12.5) is a  # ticks with no new step scored
    assert [x.rank for x in a.stragglers] == [11]
    feed(tr, range(12, 24))  # rank 11 recovers: each scored step gives a new report
    b = tr.evaluate(24.0)
    assert b is not a and b.stragglers == [] and [x.rank for x in a.stragglers] == [11]
    # a job gone quiet for 10 minutes is dropped: the report says so on the next tick
    assert tr.evaluate(24.0 + 601.0).slowish == {} and "j" not in tr.jobs


def test_two_jobs_of_one_name_are_grouped_apart_and_their_findings_carry_the_job_id():
    """Two runs of one job name (a scheduler's ids slurm-1 and slurm-2) on their own nodes: a late rank
    in the first (StragglerRank), a late host in the second (SoftwareStraggler, its dataloader).  Each
    finding names its job by name and scheduler id; neither mixes the other's ranks."""
    from fabricmon.aggregator.correlator import Evidence, localize_stragglers
    from fabricmon.topology import generate_topology

    topo = generate_topology(16, nodes_per_unit=8, gpus_per_node=8)
    s = DetectionSettings()
    tr = StragglerTracker(s)
    rng = random.Random(3)
    for step in range(1, 15):
        for jid, first_node, late in (("slurm-1", 0, lambda r: r == 11), ("slurm-2", 8, lambda r: r // 8 == 2)):
            comp = {r: 1.5 + (0.3 if late(r) else 0.0) + rng.gauss(0, 0.01) for r in range(64)}
            slowest = max(comp.values())
            for r in range(64):
                wait = slowest - comp[r]
                tr.add(RankTiming("j", r, r % 8, step, comp[r] + wait + 0.5, wait + 0.5, float(step),
                                  node=f"node-{first_node + r // 8:03d}", job_id=jid), "")
        tr.evaluate(float(step))
    rep = tr.evaluate(15.0)
    assert sorted((x.job_id, x.rank) for x in rep.stragglers) == [("slurm-1", 11)] + [
        ("slurm-2", r) for r in range(16, 24)]
    findings, shared = localize_stragglers(topo, s, rep, {}, Evidence({}, {}, {}), set(topo.nodes), "t")
    assert not shared
    got = sorted((f.alertname, f.component.id, f.labels["hpc_job"], f.labels.get("job_id"), f.ranks)
                 for f in findings)
    assert got == [("SoftwareStraggler", "node-010", "j", "slurm-2", tuple(range(16, 24))),
                   ("StragglerRank", "node-001/gpu3", "j", "slurm-1", (11,))]


def test_slow_gpu_on_the_rail_of_a_degraded_link_is_a_compute_straggler_measured_against_its_ring():
    # the simulator's step (fabricmon/sim/job.py): ring g over the GPU-g ranks starts when the slowest node
    # is done; a degraded link on node 5 rail 7 doubles ring 7's transfer; the step waits for ring 7, so
    # every rank of rails 0-6 waits R7 - R at the step's end, which ``step - comm`` counts as compute
    rng = random.Random(3)
    tr = StragglerTracker(DetectionSettings())
    nodes, tp, r = 8, 0.06, 0.4
    for step in range(1, 16):
        comp = {(n, g): 1.2 * (1.3 if (n, g) == (2, 7) else 1.0) * (1 + rng.gauss(0, 0.01))
                for n in range(nodes) for g in range(8)}
        start = max(comp.values()) + tp
        ring = {g: r * (2.0 if g == 7 else 1.0) for g in range(8)}
        end = start + max(ring.values())
        for (n, g), c in comp.items():
            tr.add(RankTiming("j", n * 8 + g, g, step, end, start + ring[g] - c, float(step),
                              node=f"node-{n:03d}"), "")
        tr.evaluate(float(step))
    rep = tr.evaluate(16.0)
    late = [(x.node, x.gpu, x.kind) for x in rep.stragglers if x.kind == "compute"]
    assert late == [("node-002", 7, "compute")]
    st = next(x for x in rep.stragglers if x.kind == "compute")
    # its late compute (0.36 s of a 2.06 s step), not that less the other rails' wait (0.4 s)
    assert abs(st.late_frac * (start + 0.8) - 0.36) < 0.05
