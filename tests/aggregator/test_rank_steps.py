"""Rank steps at the aggregator's straggler intake (issue 26, "Blind spots"): a step of 2^53 or far
ahead refused, a restart from a checkpoint starts a new run instead of being ignored, a rank that
reports from another node or GPU has moved there, ``job_id`` keeps same-named jobs apart."""

from __future__ import annotations

import random

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.stragglers import MAX_STEP_AHEAD, MOVE_QUORUM, StragglerTracker
from fabricmon.batch import NodeBatch
from fabricmon.rank_timing import RankTiming
from fabricmon.topology import generate_topology

N = 32  # ranks: 4 nodes of 8 GPUs


def feed(tr, steps, *, t0: float, late=frozenset(), node_of=lambda r: f"node-{r // 8:03d}", job_id: str = "",
         job: str = "j", ranks=range(N), seed: int = 1, evaluate: bool = True) -> float:
    """One line per rank and step, 2 s apart from ``t0``; ranks in ``late`` 0.2 s late. The last ts."""
    rng = random.Random(seed)
    ts = t0
    for i, step in enumerate(steps):
        ts = t0 + 2.0 * i
        comp = {r: 1.5 + (0.2 if r in late else 0.0) + rng.gauss(0, 0.01) for r in ranks}
        slowest = max(comp.values())
        for r in ranks:
            comm = slowest - comp[r] + 0.5
            extra = {"job_id": job_id} if job_id else {}
            tr.add(RankTiming(job, r, r % 8, step, comp[r] + comm, comm, ts, node=node_of(r), **extra), "")
        if evaluate:
            tr.evaluate(ts)
    return ts


def where(tr, ts) -> list[tuple[int, str, int]]:
    return [(s.rank, s.node, s.gpu) for s in tr.evaluate(ts).stragglers]


def test_step_of_2_53_refused_and_scoring_goes_on():
    tr = StragglerTracker(DetectionSettings())
    ts = feed(tr, range(1, 5), t0=0.0)
    why = [tr.add(RankTiming("j", 0, 0, 2**53, 1.0, 0.1, ts + 1, node="node-000"), ""),
           tr.add(RankTiming("j", 0, 0, 4 + MAX_STEP_AHEAD + 1, 1.0, 0.1, ts + 1, node="node-000"), "")]
    ts = feed(tr, range(5, 17), t0=ts + 2, late={11})
    assert where(tr, ts) == [(11, "node-001", 3)]  # detection was off for 10 minutes on 270f287
    assert why == ["step_range", "step_ahead"] and tr.refused == {"step_range": 1, "step_ahead": 1,
                                                                       "move_pending": 0}
    # a step just within the bound is taken
    assert tr.add(RankTiming("j", 0, 0, 16 + MAX_STEP_AHEAD, 1.0, 0.1, ts + 1, node="node-000"), "") is None


def test_restart_from_a_checkpoint_is_a_new_run_not_ignored():
    tr = StragglerTracker(DetectionSettings())
    ts = feed(tr, range(1, 101), t0=0.0)
    # the job dies, is down 90 s, and comes back at its checkpoint, 80 steps back; rank 11 now slow
    ts = feed(tr, range(20, 33), t0=ts + 90.0, late={11})
    assert where(tr, ts) == [(11, "node-001", 3)]  # within 13 steps of the restart (never, until step 140, before)
    assert tr.restarts_total == 1


def test_old_steps_with_old_times_are_a_replay_not_a_restart():
    tr = StragglerTracker(DetectionSettings())
    ts = feed(tr, range(1, 61), t0=0.0)
    # node-001's agent reconnects and replays its spool: steps 10..30 with their own (old) times
    feed(tr, range(10, 31), t0=18.0, ranks=range(8, 16), evaluate=False)
    # and one rank alone going back with a fresh time is not a restart either
    tr.add(RankTiming("j", 3, 3, 5, 2.0, 0.5, ts + 1.0, node="node-000"), "")
    assert tr.restarts_total == 0
    ts = feed(tr, range(61, 73), t0=ts + 2, late={20})
    assert where(tr, ts) == [(20, "node-002", 4)]


def test_rank_that_reports_from_another_node_has_moved_there():
    tr = StragglerTracker(DetectionSettings())
    ts = feed(tr, range(1, 13), t0=0.0, late={11})
    assert where(tr, ts) == [(11, "node-001", 3)]
    # the job is restarted on other nodes under the same name (same steps go on): rank 11 is now on node-005
    moved = lambda r: f"node-{r // 8 + 4:03d}"  # noqa: E731
    # the move needs the new place's own history: MOVE_QUORUM steps from there while the old place is silent
    ts = feed(tr, range(13, 13 + MOVE_QUORUM), t0=ts + 2, node_of=moved)
    assert all(s.node != "node-001" for s in tr.evaluate(ts).stragglers)  # never blamed on the node it left
    ts = feed(tr, range(13 + MOVE_QUORUM, 28), t0=ts + 2, node_of=moved, late={11})
    assert where(tr, ts) == [(11, "node-005", 3)]
    assert tr.moves_total == N


def test_one_line_naming_another_gpu_never_erases_a_rank_history():
    """Issue 35 item 3: someone posts a line for rank 11 of another job with another ``gpu`` once per step;
    the persistent straggler stays named (and pages) on its own GPU, and every such line is counted."""
    tr = StragglerTracker(DetectionSettings())
    ts = feed(tr, range(1, 13), t0=0.0, late={11})
    assert where(tr, ts) == [(11, "node-001", 3)]
    for step in range(13, 40):
        ts = feed(tr, [step], t0=ts + 2, late={11})
        # one spoofed line between two real steps (and a second one, to be sure a few are not a quorum)
        for k in (0.5, 1.0):
            tr.add(RankTiming("j", 11, 3, step, 1.0, 0.1, ts + k, node="node-001", gpu=6), "")
        assert where(tr, ts + 1.0) == [(11, "node-001", 3)]
    assert tr.moves_total == 0 and tr.refused["move_pending"] == 2 * 27


def test_job_id_keeps_same_named_jobs_apart():
    tr = StragglerTracker(DetectionSettings())
    ts = 0.0
    for k, step in enumerate(range(1, 13)):
        feed(tr, [step], t0=2.0 * k, job="train", job_id="slurm-1", late={11})
        ts = feed(tr, [step], t0=2.0 * k, job="train", job_id="slurm-2", node_of=lambda r: f"node-{r // 8 + 10:03d}")
    st = tr.evaluate(ts).stragglers
    assert [(s.job, s.rank, s.node, s.gpu) for s in st] == [("train", 11, "node-001", 3)]
    assert len(tr.jobs) == 2


def test_engine_counts_step_refusals():
    topo = generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test")
    eng = Engine(topo, DetectionSettings())
    rt = RankTiming("j", 0, 0, 2**53, 1.0, 0.1, 100.0, node="node-000")
    eng.ingest(NodeBatch("node-000", 1, 100.0, 1.0, ranks=(rt,)))
    assert eng.admission.rank_admission_snapshot().get("step_range") == 1
