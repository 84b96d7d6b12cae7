"""Incident cost per job (aggregator/cost.py): median step slowdown against a clean baseline."""

from __future__ import annotations

import pytest

from fabricmon.aggregator.cost import JobImpact, StepLog, impact_sentence


def _feed(log: StepLog, job: str, times: list[float], t0: float = 1000.0, first_step: int = 1, gpus: int = 64):
    t = t0
    for k, s in enumerate(times):
        t += s
        for _rank in range(3):  # every rank reports the same step: logged once
            log.record(job, first_step + k, t, s, gpus=gpus)
    return t


def test_slowdown_is_median_during_over_median_of_last_20_clean_steps():
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 40)
    opened = t
    t = _feed(log, "llm", [2.5] * 10, t0=t, first_step=41)
    imp = log.impact("llm", opened, t)
    assert imp.step_slowdown == pytest.approx(0.25) and not imp.stopped
    assert imp.gpu_hours_per_hour == pytest.approx(64 * (1 - 1 / 1.25))


def test_baseline_skips_steps_under_another_open_incident():
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 30)
    other = (t, None)
    t = _feed(log, "llm", [4.0] * 30, t0=t, first_step=31)  # another incident's slowdown
    opened = t
    t = _feed(log, "llm", [3.0] * 10, t0=t, first_step=61)
    assert log.impact("llm", opened, t).step_slowdown == 0.0  # against the other incident's 4.0 s steps
    imp = log.impact("llm", opened, t, other_open=[(other[0], opened)])
    assert imp.step_slowdown == pytest.approx(0.5)


def test_no_baseline_is_null_and_no_step_while_open_is_stopped():
    log = StepLog()
    t = _feed(log, "new", [2.0] * 5)
    assert log.impact("new", 900.0, t).step_slowdown is None  # started during the fault
    opened = t + 1
    assert not log.impact("new", opened, opened + 5).stopped  # a step or two late is not stopped
    imp = log.impact("new", opened, opened + 60)
    assert imp.stopped and imp.step_slowdown is None and imp.gpu_hours_per_hour == 64


def test_restart_from_a_checkpoint_is_logged_and_late_ranks_are_not():
    log = StepLog()
    t = _feed(log, "j", [2.0] * 10)
    log.record("j", 4, t - 10, 2.0)  # a late rank of an old step
    assert len(log.jobs["j"].starts) == 10
    _feed(log, "j", [2.0] * 3, t0=t + 60, first_step=5)  # back at step 5 after a restart
    assert len(log.jobs["j"].starts) == 13


def test_impact_sentence_orders_by_cost_and_folds_the_rest():
    imps = [JobImpact("a", "", 0.03, False, 4.2), JobImpact("b", "", 0.14, False, 31.0),
            JobImpact("c", "", None, True, 8.0), JobImpact("d", "", 0.02, False, 1.0),
            JobImpact("idle", "", 0.0, False, 0.0)]
    assert impact_sentence(imps) == ("b 14% slower (31 GPU-hours/hour); c stopped (8 GPU-hours/hour); "
                                     "a 3% slower (4 GPU-hours/hour); +1 more")
    assert impact_sentence([]) == ""


def test_a_later_incident_on_the_job_does_not_add_its_slowdown_to_an_earlier_one():
    """The default demo: a flaky cable (8% slower) opens, then the job's leaf degrades (15%) while the
    cable's incident is still open.  The cable keeps its own 8%; the leaf, opened second, has no steps of
    its own and takes them all."""
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 30)
    cable = t
    t = _feed(log, "llm", [2.16] * 12, t0=t, first_step=31)
    leaf = t
    t = _feed(log, "llm", [2.3] * 20, t0=t, first_step=43)
    mixed = log.impact("llm", cable, t)  # not knowing the leaf: most steps are the leaf's
    assert mixed.step_slowdown == pytest.approx(0.15)
    own = log.impact("llm", cable, t, other_open=[(leaf, t)])
    assert own.step_slowdown == pytest.approx(0.08)
    assert log.impact("llm", leaf, t, other_open=[(cable, t)]).step_slowdown == pytest.approx(0.15)
    # fewer than OWN_STEPS steps before the later incident: all the steps, as before
    short = StepLog()
    t = _feed(short, "llm", [2.0] * 30)
    cable = t
    leaf = t = _feed(short, "llm", [2.16] * 2, t0=t, first_step=31)
    t = _feed(short, "llm", [2.3] * 20, t0=t, first_step=33)
    assert short.impact("llm", cable, t, other_open=[(leaf, t)]).step_slowdown == pytest.approx(0.15)


def test_a_lone_straggler_is_costed_against_the_steps_before_it_began():
    """The issue's gloo run: steps 0.42 s, then one rank 74% slower; StragglerRank opens only after 8 of
    the last 10 steps were late, so the 20 steps before first_seen are already slow.  The baseline ends
    2 x straggler_window steps before first_seen (the first late step is at most a window back)."""
    log = StepLog()
    t = _feed(log, "gloo", [0.42] * 60)
    t = _feed(log, "gloo", [0.73] * 12, t0=t, first_step=61)  # late steps before the incident opened
    opened = t
    t = _feed(log, "gloo", [0.73] * 20, t0=t, first_step=73)
    assert log.impact("gloo", opened, t).step_slowdown == 0.0  # the 20 steps before first_seen: the old rule
    imp = log.impact("gloo", opened, t, skip_steps=20)
    assert imp.step_slowdown == pytest.approx(0.73 / 0.42 - 1)
    assert imp.gpu_hours_per_hour == pytest.approx(64 * (1 - 0.42 / 0.73))


def test_a_counter_incident_baseline_ends_its_detection_lead_before_it_opened():
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 30)
    began = t
    t = _feed(log, "llm", [3.0] * 4, t0=t, first_step=31)  # 12 s of evidence before the incident opened
    opened = t
    t = _feed(log, "llm", [3.0] * 10, t0=t, first_step=35)
    assert log.impact("llm", opened, t, baseline_end=opened - 15.0).step_slowdown == pytest.approx(0.5)
    assert began >= opened - 15.0


def test_overlapping_incidents_share_the_slowdown_by_time_slices():
    """A slow GPU (compute, +30%) opens inside a bad NIC's window (comm, +20%) and closes inside it: the NIC
    measures its own slices (before and after the GPU); the GPU, with no slice of its own, takes the joint
    slowdown less the NIC's (different phases of a step add).  Two faults of one phase (a link under a
    degrading leaf): the joint slowdown is the larger one's and stands."""
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 40)
    nic = t
    t = _feed(log, "llm", [2.4] * 15, t0=t, first_step=41)
    gpu = t
    t = _feed(log, "llm", [3.0] * 15, t0=t, first_step=56)  # 2.0 x (1 + 0.2 + 0.3)
    gpu_end = t
    t = _feed(log, "llm", [2.4] * 15, t0=t, first_step=71)
    assert log.impact("llm", nic, t, [(gpu, gpu_end)], other_adds=[True]).step_slowdown == pytest.approx(0.2)
    assert log.impact("llm", gpu, gpu_end, [(nic, t)], other_adds=[True]).step_slowdown == pytest.approx(0.3)
    # the old rule gave the inner one the joint 0.5; one phase: the joint stands
    assert log.impact("llm", gpu, gpu_end, [(nic, t)], other_adds=[False]).step_slowdown == pytest.approx(0.5)
    # opened together, neither with a slice of its own: the joint split between them
    both = StepLog()
    t = _feed(both, "llm", [2.0] * 40)
    opened = t
    t = _feed(both, "llm", [3.0] * 15, t0=t, first_step=41)
    assert both.impact("llm", opened, t, [(opened, t)], other_adds=[True]).step_slowdown == pytest.approx(0.25)


def test_a_hung_job_is_stopped_with_all_its_gpus_from_the_moment_it_fires():
    log = StepLog()
    t = _feed(log, "j", [2.0] * 30)
    imp = log.impact("j", t + 1, t + 1, stopped=True)
    assert imp.stopped and imp.step_slowdown is None and imp.gpu_hours_per_hour == 64
    assert not log.impact("j", t + 1, t + 1).stopped  # unknown cause: a few steps' grace


def test_a_leaf_degrading_over_its_flaky_cable_is_not_charged_the_compound():
    """At 1,024 nodes: a flaky cable (+8%) under a leaf that then degrades (+16% alone): on one path the two
    slow the same transfers one on top of the other (+28% together).  The leaf, with no slice of its own,
    was charged the compound; the cable's own measure is divided out."""
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 40)
    cable = t
    t = _feed(log, "llm", [2.16] * 20, t0=t, first_step=41)
    leaf = t
    t = _feed(log, "llm", [2.0 * 1.08 * 1.16 * 1.025] * 20, t0=t, first_step=61)
    compound = log.impact("llm", leaf, t, [(cable, t)], other_adds=[False])
    assert compound.step_slowdown == pytest.approx(0.284, abs=0.001)  # the rule for parallel rings
    imp = log.impact("llm", leaf, t, [(cable, t)], other_adds=[False], others_nested=[True])
    assert imp.step_slowdown == pytest.approx(1.16 * 1.025 - 1, abs=0.001)


def test_a_leaf_over_a_degraded_link_is_divided_out_of_the_transfer_part_of_the_step():
    """Seed 5201 of ``bench_detection --overlap``, in the simulator's terms (sim/job.py): a 1.66 s step of
    1.26 s compute and 0.4 s ring transfer (0.46 s in collectives); a link at half rate (+0.24 alone) and,
    inside it, its leaf at 0.61 of its rate (+0.154 alone): rates multiply on one path, so together the
    transfer takes 0.4 / (0.5 x 0.61) s (+0.55).  Dividing whole steps charged the leaf +0.25; divided out
    of the part in collectives it is its own +0.154."""
    log = StepLog()
    compute, transfer, tp = 1.2, 0.4, 0.06

    def feed(n: int, rate: float, t0: float, first: int) -> float:
        t = t0
        for k in range(n):
            s = compute + tp + transfer / rate
            t += s
            log.record("llm", first + k, t, s, gpus=64, comm=tp + transfer / rate)
        return t

    t = feed(40, 1.0, 1000.0, 1)
    link = t
    t = feed(20, 0.5, t, 41)
    leaf = t
    t = feed(20, 0.5 * 0.61, t, 61)
    leaf_end = t
    t = feed(20, 0.5, t, 81)
    alone = (transfer / 0.61 - transfer) / (compute + tp + transfer)
    imp = log.impact("llm", leaf, leaf_end, [(link, t)], other_adds=[False], others_nested=[True])
    assert imp.step_slowdown == pytest.approx(alone, rel=0.15)
    # the link measures its own slices (before and after the leaf)
    assert log.impact("llm", link, t, [(leaf, leaf_end)], other_adds=[False], others_nested=[True]).step_slowdown \
        == pytest.approx(0.4 / 1.66, rel=0.01)


def test_a_nic_inside_a_slow_gpus_incident_takes_off_what_the_gpu_measured_alone():
    """A slow GPU (+30% alone, 20 steps before the NIC) with a bad NIC on its own rail opening and closing inside
    it (joint +35%): the NIC takes the joint less what the GPU measured alone, 0.05.  The GPU's direct measure
    (its late compute over the median GPU) reads high, by the jitter the baseline step already waited for at
    the slowest GPU (bench_detection overlap seed 5200: the NIC 0.018 for 0.041); it stands only for a GPU
    with no slice of its own."""
    log = StepLog()
    t = _feed(log, "llm", [2.0] * 40)
    gpu = t
    t = _feed(log, "llm", [2.6] * 20, t0=t, first_step=41)
    nic = t
    t = _feed(log, "llm", [2.7] * 20, t0=t, first_step=61)
    nic_end = t
    t = _feed(log, "llm", [2.6] * 5, t0=t, first_step=81)
    direct = 0.66  # the GPU's late compute over the median GPU, s: 0.33 of the 2.0 s baseline
    imp = log.impact("llm", nic, nic_end, [(gpu, t)], other_adds=[True], others_direct_s=[direct])
    assert imp.step_slowdown == pytest.approx(0.05)
    # a GPU that opened with the NIC (no slice of its own): its direct measure is all there is
    both = StepLog()
    t = _feed(both, "llm", [2.0] * 40)
    opened = t
    t = _feed(both, "llm", [2.7] * 20, t0=t, first_step=41)
    imp = both.impact("llm", opened, t, [(opened, t)], other_adds=[True], others_direct_s=[0.6])
    assert imp.step_slowdown == pytest.approx(0.05)
