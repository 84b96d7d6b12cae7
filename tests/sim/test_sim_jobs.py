"""Several jobs and software decoys in the simulator (DESIGN "Jobs, decoys and cost")."""

from __future__ import annotations

import pytest

from fabricmon.configload import ConfigError
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import scenario_from_dict

BASE = {"cluster": {"nodes": 16, "layout": "ib", "nodes_per_unit": 8, "seed": 3}, "duration": 120}


def _scn(**kw):
    return scenario_from_dict({**BASE, **kw}, "scn.yaml")


def _ranks(scn, until: float):
    sim = SimulatedCluster(scn, mode="memory")
    got = []
    sim.on_batch = lambda b: got.extend(b.ranks)
    sim.run(until)
    return sim, got


@pytest.mark.parametrize("jobs, decoys, message", [
    ([{"name": "a", "nodes": [0, 11], "pp": 5}], [], r"jobs\[0\].pp: 5 does not divide the job's 12 nodes \(job 'a'\)"),
    ([{"name": "a", "nodes": [0, 7]}, {"name": "b", "nodes": [7, 9]}], [],
     r"jobs\[1\].nodes: node-007 is already in job 'a'"),
    ([{"name": "a", "nodes": [0, 16]}], [], r"jobs\[0\].nodes: \[0, 16\] is past the 16-node cluster"),
    ([{"name": "a", "nodes": [0, "node-003"]}], [], r"jobs\[0\].nodes: give two node indexes"),
    ([{"name": "a", "nodes": ["node-099"]}], [], r"jobs\[0\].nodes\[0\]: node-099 is not in the 16-node cluster"),
    ([{"name": "a", "nodes": [0, 7]}], [{"kind": "stage_imbalance", "job": "b", "stage": 0}],
     r"decoys\[0\].job: no job named 'b'"),
    ([{"name": "a", "nodes": [0, 7], "pp": 2}], [{"kind": "stage_imbalance", "job": "a", "stage": 2}],
     r"decoys\[0\].stage: job 'a' has stages 0..1, got 2"),
    ([{"name": "a", "nodes": [0, 7]}], [{"kind": "dataloader_slow", "node": "node-012"}],
     r"decoys\[0\].node: node-012 runs no job"),
    ([{"name": "a", "nodes": [0, 7]}], [{"kind": "host_pause", "node": "node-001", "every": 5, "pause": 6}],
     r"decoys\[0\].pause: must be shorter than every"),
    ([{"name": "a", "nodes": [0, 7]}], [{"kind": "checkpoint", "job": "a", "rail": 2}],
     r"decoys\[0\].rail: does not apply to checkpoint"),
    ([{"name": "a", "nodes": [0, 7]}], [{"kind": "gc_storm", "job": "a"}], r"decoys\[0\].kind: unknown decoy kind"),
])
def test_bad_jobs_and_decoys_are_one_line_naming_file_and_key(jobs, decoys, message):
    with pytest.raises(ConfigError, match=rf"^scn.yaml: {message}") as exc:
        _scn(jobs=jobs, decoys=decoys)
    assert "\n" not in str(exc.value)


def test_background_errors_may_sit_on_an_idle_node():
    scn = _scn(jobs=[{"name": "a", "nodes": [0, 7]}],
               decoys=[{"kind": "background_errors", "node": "node-012", "rail": 2, "rate": 0.3}])
    assert scn.decoys[0].value("rate") == 0.3


def test_two_jobs_have_job_local_ranks_own_layouts_and_idle_nodes_report_nothing():
    scn = _scn(jobs=[{"name": "big", "nodes": [0, 7], "pp": 2},
                     {"name": "small", "nodes": ["node-010", "node-012"], "start": 20}])
    sim, got = _ranks(scn, 60)
    by_job: dict[str, set] = {}
    for r in got:
        by_job.setdefault(r.job, set()).add((r.node, r.rank))
    assert set(by_job) == {"big", "small"}
    assert {n for n, _ in by_job["big"]} == {f"node-00{i}" for i in range(8)}
    assert {rank for _, rank in by_job["small"]} == set(range(16))  # rank = position in the job * 8 + gpu
    assert {(n, rank) for n, rank in by_job["small"] if rank == 8} == {("node-012", 8)}
    assert not any(r.node in ("node-008", "node-009", "node-011") for r in got)  # idle
    assert [lay.job for lay in sim.layouts] == ["big", "small"]
    assert dict(sim.layouts[0].layout) == {"tp": 8, "pp": 2, "dp": 4}
    small_first = min(r.ts for r in got if r.job == "small") - sim.cluster.epoch
    assert small_first >= 20  # the job starts at its start
    truth = {j["name"]: j for j in sim.jobs_truth()}
    assert truth["small"]["gpus"] == 16 and truth["small"]["nodes"] == ["node-010", "node-012"]
    assert len(truth["big"]["step_times"]) == max(r.step for r in got if r.job == "big")


def test_job_restart_goes_silent_then_returns_at_its_checkpoint_step_on_new_nodes():
    scn = _scn(jobs=[{"name": "a", "nodes": [0, 3]}],
               decoys=[{"kind": "checkpoint", "job": "a", "every": 20, "pause": 3, "start": 10},
                       {"kind": "job_restart", "job": "a", "start": 50, "down": 20,
                        "nodes": ["node-008", "node-009", "node-010", "node-011"]}])
    sim, got = _ranks(scn, 110)
    rel = [(r.ts - sim.cluster.epoch, r.step, r.node) for r in got]
    assert not [x for x in rel if 50 < x[0] < 70]  # every rank exited for `down` seconds
    before = max(s for t, s, _ in rel if t <= 50)
    after = [(t, s, n) for t, s, n in rel if t >= 70]
    assert after and min(s for _, s, _ in after) < before  # back at the last checkpoint's step
    assert {n for _, _, n in after} == {"node-008", "node-009", "node-010", "node-011"}  # moved
    steps = sim.jobs_truth()[0]["step_times"]
    assert max(d for _, d in steps) > 3.0  # a checkpoint is one long step


def test_decoys_slow_exactly_what_they_say():
    scn = _scn(jobs=[{"name": "a", "nodes": [0, 7]}],
               decoys=[{"kind": "dataloader_slow", "node": "node-005", "magnitude": 1.3}])
    _, got = _ranks(scn, 40)
    late = {}
    for r in got:
        late.setdefault(r.node, []).append(r.step_seconds - r.comm_seconds)
    mean = {n: sum(v) / len(v) for n, v in late.items()}
    slowest = max(mean, key=mean.get)
    assert slowest == "node-005"


def test_same_draws_in_tree_and_memory_mode(tmp_path):
    scn = _scn(cluster={"nodes": 4, "layout": "ib", "nodes_per_unit": 4, "seed": 8},
               jobs=[{"name": "a", "nodes": [0, 3]}],
               decoys=[{"kind": "seqlen_imbalance", "job": "a", "magnitude": 1.3}])
    _, mem = _ranks(scn, 12)
    tree = SimulatedCluster(scn, mode="tree", base_dir=tmp_path, interval=2.0)  # another interval too
    got = []
    tree.on_batch = lambda b: got.extend(b.ranks)
    try:
        tree.run(12)
    finally:
        tree.close()
    key = sorted((r.step, r.rank, r.comm_seconds) for r in mem if r.step <= 5)
    assert key == sorted((r.step, r.rank, r.comm_seconds) for r in got if r.step <= 5)


def test_fault_impact_truth_is_each_faults_standalone_cost_per_job():
    """A leaf fault on rail 5 of unit 0 slows the job whose rings cross it and not the job outside it; a
    counter reset costs nothing.  Same draws with and without the fault, so the numbers are exact."""
    from fabricmon.sim.impact import fault_impacts

    scn = _scn(cluster={"nodes": 16, "layout": "ib", "nodes_per_unit": 8, "seed": 4},
               jobs=[{"name": "in-unit-0", "nodes": [0, 7]}, {"name": "in-unit-1", "nodes": [8, 15]}],
               faults=[{"kind": "leaf_degraded", "unit": 0, "rail": 5, "start": 30, "end": 90},
                       {"kind": "counter_reset", "node": "node-003", "start": 40}])
    leaf, reset = fault_impacts(scn)
    assert [r["job"] for r in leaf] == ["in-unit-0"]
    assert 0.05 < leaf[0]["step_slowdown"] < 1.0
    assert reset == []
