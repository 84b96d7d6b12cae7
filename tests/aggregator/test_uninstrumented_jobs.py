"""Jobs that never report a step are still on their incidents (DESIGN "Jobs, decoys and cost").

The scheduler tells the node's agent which job holds which GPUs (``fabricmon slurm-prolog`` writes the
job's file, the agent's ``jobs`` source exports ``fabricmon_job_gpu_info``), the aggregator lists every
job on a faulty component: ``exposed: true`` with its GPUs where no step times measure it.  The end-to-end
test runs a real ``slurmd`` whose ``Prolog=`` is the fabricmon prolog, a job that sends nothing, and real
agent and aggregator processes over 127.0.0.1 with a link down on the job's node.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from fabricmon.aggregator.cost import JobImpact, impact_sentence
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.incidents import Finding, IncidentManager
from fabricmon.batch import NodeBatch
from fabricmon.config import JobsConfig
from fabricmon.jobmap import store
from fabricmon.jobmap.assignment import AssignmentError, JobAssignment, from_slurm_env
from fabricmon.jobmap.slurm_hooks import epilog, prolog
from fabricmon.model import Sample
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Fault, Scenario
from fabricmon.sim.tree import NodeTree
from fabricmon.sources.jobs import JobsSource
from fabricmon.topology import generate_topology
from support.agentrig import http_get
from support.procrig import Proc, free_port, wait_until

pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")


def test_prolog_reads_what_slurmd_hands_it_and_the_epilog_removes_it(tmp_path):
    env = {"SLURM_JOB_ID": "81723", "SLURM_JOB_NAME": "train", "SLURM_JOB_GPUS": "3,1",
           "CUDA_VISIBLE_DEVICES": "0", "SLURM_NODELIST": "node-[000-003]"}
    prolog(str(tmp_path), env)
    (a,), bad = store.read_all(tmp_path)
    assert bad == [] and a == JobAssignment("train", "81723", (1, 3), "node-[000-003]", "slurm")
    # no GRES list: CUDA_VISIBLE_DEVICES; neither: the whole node; no name (slurmd 22.05): asked, else the id
    assert from_slurm_env({"SLURM_JOB_ID": "5", "CUDA_VISIBLE_DEVICES": "2"}).gpus == (2,)
    assert from_slurm_env({"SLURM_JOB_ID": "5"}, lambda _id: "").job == "5"
    assert from_slurm_env({"SLURM_JOB_ID": "5"}, lambda _id: "asked").job == "asked"
    assert from_slurm_env({"SLURM_JOB_ID": "5"}).gpus is None
    epilog(str(tmp_path), {"SLURM_JOB_ID": "81723"})
    assert store.read_all(tmp_path) == ([], [])
    with pytest.raises(AssignmentError, match="CUDA_VISIBLE_DEVICES: 'GPU-1a2b' is not a GPU index"):
        from_slurm_env({"SLURM_JOB_ID": "5", "CUDA_VISIBLE_DEVICES": "GPU-1a2b"})
    with pytest.raises(AssignmentError, match="SLURM_JOB_ID: job id '../x'"):
        from_slurm_env({"SLURM_JOB_ID": "../x"})


def test_cli_prolog_never_fails_a_job_unless_strict(tmp_path, capsys):
    from fabricmon.cli import main

    assert main(["slurm-prolog", "--dir", str(tmp_path)]) == 0  # no SLURM_JOB_ID: one line, exit 0
    assert "fabricmon slurm-prolog: error: SLURM_JOB_ID: not set" in capsys.readouterr().err
    assert main(["slurm-prolog", "--dir", str(tmp_path), "--strict"]) == 1


def test_jobs_source_exports_held_gpus_and_keeps_a_released_job_at_zero(tmp_path):
    clock = [0.0]
    src = JobsSource(JobsConfig(dir=str(tmp_path), released_keep=60.0), clock=lambda: clock[0])
    store.write(tmp_path, JobAssignment("train", "7", (0, 1), "", "slurm"))
    store.write(tmp_path, JobAssignment("whole", "8", None, "", "slurm"))
    (tmp_path / "9.json").write_text("{not json")

    def series():
        res = src.poll(None)
        return sorted((dict(r.labels)["hpc_job"], dict(r.labels)["gpu"], r.value) for r in res.readings), res

    got, res = series()
    assert got == [("train", "0", 1.0), ("train", "1", 1.0), ("whole", "all", 1.0)]
    assert res.errors == 1 and "9.json: not JSON" in res.messages[0]
    store.remove(tmp_path, "7")
    clock[0] = 30.0
    assert series()[0] == [("train", "0", 0.0), ("train", "1", 0.0), ("whole", "all", 1.0)]
    clock[0] = 100.0
    assert series()[0] == [("whole", "all", 1.0)]


def _gauge_batch(node: str, seq: int, ts: float, samples) -> NodeBatch:
    return NodeBatch(node=node, seq=seq, ts=ts, interval_seconds=1.0, gauges=tuple(samples))


def test_an_incident_lists_every_job_on_its_component_measured_or_exposed():
    """A link down under a job that reports nothing: before, ``impact: []``; now the job, exposed, with
    its GPUs behind that link.  A released job leaves the list."""
    topo = generate_topology(2, nodes_per_unit=2, gpus_per_node=NGPU)
    eng = Engine(topo, cluster="t")
    held = [Sample("fabricmon_job_gpu_info", (("hpc_job", "etl"), ("job_id", "99"), ("gpu", g)), 1.0)
            for g in ("0", "1")]
    eng.ingest(_gauge_batch("node-000", 1, 1000.0, held))
    nic = topo.nic_for_gpu("node-000", 1)
    link = topo.link("node-000", nic)
    found = eng.cost.exposed(link, ())
    assert [(i.job, i.job_id, i.exposed, i.gpus) for i in found] == [("etl", "99", True, ("node-000/gpu1",))]
    assert found[0].to_dict()["exposed"] is True and found[0].to_dict()["gpus"] == ["node-000/gpu1"]
    assert impact_sentence(found) == "etl exposed (1 GPU, not measured)"
    # a job measured from its step times is not listed twice
    assert eng.cost.exposed(link, (JobImpact("etl", "99", 0.1, False, 0.2),)) == []
    eng.ingest(_gauge_batch("node-000", 2, 1001.0, [Sample(s.family, s.labels, 0.0) for s in held]))
    assert eng.cost.exposed(link, ()) == []


def test_a_job_that_leaves_leaves_the_open_incident():
    """The epilog releases the only job on a link that stays down: the open incident's impact empties (and
    the change is visible, so Alertmanager's annotation loses the job).  Before, an empty impact was never
    applied and the departed job stayed listed for the incident's life."""
    topo = generate_topology(2, nodes_per_unit=2, gpus_per_node=NGPU)
    eng = Engine(topo, cluster="t")
    held = [Sample("fabricmon_job_gpu_info", (("hpc_job", "etl"), ("job_id", "99"), ("gpu", "1")), 1.0)]
    eng.ingest(_gauge_batch("node-000", 1, 1000.0, held))
    link = topo.link("node-000", topo.nic_for_gpu("node-000", 1))
    manager = IncidentManager()

    def tick(now: float) -> list:
        findings = [Finding("FabricLinkDown", link, {}, ["link down"])]
        eng.cost.annotate(findings, manager, now, eng.stragglers)
        return manager.update(findings, now)

    (inc,) = tick(1000.0)
    assert [(i.job, i.exposed) for i in inc.impact] == [("etl", True)]
    eng.ingest(_gauge_batch("node-000", 2, 1001.0, [Sample(s.family, s.labels, 0.0) for s in held]))
    version = inc.version
    assert tick(1001.0) == [inc] and inc.open
    assert inc.impact == [] and inc.version == version + 1
    # a finding the cost stage did not see (a restart's hold, an info finding) leaves the impact as it was
    inc.impact = [JobImpact("etl", "99", 0.1, False, 0.2)]
    manager.update([Finding("FabricLinkDown", link, {}, ["link down"])], 1002.0)
    assert [i.job for i in inc.impact] == ["etl"]


def _incidents(port: int) -> list[dict]:
    code, body = http_get(f"http://127.0.0.1:{port}/api/incidents?state=open")
    return json.loads(body) if code == 200 else []


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")
def test_a_job_started_by_a_real_slurmd_is_on_the_fabric_incident_of_its_node(tmp_path):
    from support.slurmrig import Slurm, require_slurm

    require_slurm()
    spec = ClusterSpec(2, "roce", 2, seed=7)
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump({
        "cluster": "t", "layout": spec.layout, "nodes_per_unit": spec.nodes_per_unit,
        "generate": {"nodes": spec.nodes, "gpus_per_node": NGPU, "rails": NRAILS}}))
    sim = ClusterState(Scenario(spec, 3600, faults=(Fault("link_down", 0.0, node="node-000", rail=1),)))
    sim.advance(1.0)
    tree = NodeTree(sim, 0, tmp_path / "node")
    tree.render()
    jobs_dir = tmp_path / "jobs"
    hooks = {}
    for which in ("prolog", "epilog"):  # slurmd runs Prolog= without arguments: a site's wrapper script
        hooks[which] = tmp_path / f"{which}.sh"
        hooks[which].write_text(f"#!/bin/sh\nexec {sys.executable} -m fabricmon slurm-{which} --dir {jobs_dir}\n")
        hooks[which].chmod(0o755)
    g, h = free_port(), free_port()
    (tmp_path / "aggregator.yaml").write_text(yaml.safe_dump({
        "topology": "topology.yaml", "grpc_listen": f"127.0.0.1:{g}", "http_listen": f"127.0.0.1:{h}",
        "tick_seconds": 0.2, "auth": {"insecure": True}}))
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump({
        "sysfs_root": str(tree.sys), "ethtool_dir": str(tree.ethtool_dir), "node_name": "node-000",
        "nvml": f"fake:{tree.nvml_file}", "listen": f"127.0.0.1:{free_port()}", "interval": 0.2,
        "aggregator": f"127.0.0.1:{g}", "stream": {"spool_dir": str(tmp_path / "spool")},
        "sources": {"jobs": {"dir": str(jobs_dir)}},
        "intake": {"listen": None, "socket": None}, "log": {"format": "json"}}))
    slurm = Slurm(tmp_path / "slurm", "node-000", prolog=hooks["prolog"], epilog=hooks["epilog"])
    procs: list[Proc] = []
    try:
        slurm.start()
        agg = Proc(["aggregator", "--config", str(tmp_path / "aggregator.yaml"), "--log-format", "json"],
                   tmp_path / "agg.log")
        procs.append(agg)
        assert agg.wait_log("aggregator_started"), agg.text()
        procs.append(Proc(["agent", "--config", str(tmp_path / "agent.yaml")], tmp_path / "agent.log"))
        # a job that never imports fabricmon.client, on GPUs 0 and 1 (GPU 1 is behind mlx5_1)
        job_id = slurm.run("sbatch", "--parsable", "-J", "etl-nightly", "-w", "node-000", "--gres=gpu:2",
                           "--wrap", "sleep 120").strip()

        def link_incident() -> dict | None:
            return next((i for i in _incidents(h) if i["alertname"] == "FabricLinkDown"), None)

        def listed() -> bool:
            inc = link_incident()
            return inc is not None and any(x.get("exposed") for x in inc["impact"])

        assert wait_until(listed, 60), (link_incident(), slurm.text("slurmd"), list(jobs_dir.glob("*")))
        inc = link_incident()
        assert inc["component"] == "node-000/mlx5_1/1"
        assert inc["impact"] == [{"job": "etl-nightly", "job_id": job_id, "step_slowdown": None, "stopped": False,
                                  "gpu_hours_per_hour": 0.0, "exposed": True, "gpus": ["node-000/gpu1"]}]
        slurm.run("scancel", job_id)
        assert wait_until(lambda: not list(jobs_dir.glob("*.json")), 30), slurm.text("slurmd")  # the epilog
    finally:
        for p in procs:
            p.stop()
        slurm.stop()
