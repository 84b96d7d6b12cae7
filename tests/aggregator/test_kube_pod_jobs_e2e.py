"""A pod's job on Kubernetes is on the fabric incident of its node, with its GPUs (DESIGN "Jobs, decoys and
cost"): real agent and aggregator processes over 127.0.0.1; the agent reads an in-process kubelet
PodResources server (real gRPC, the real v1 proto, on a unix socket) that gives the pod two GPUs by their
NVML UUIDs, and an in-process HTTPS API server that answers the pod's real-format JSON
(tests/fixtures/kubernetes/job-pod.json) to the agent's service-account token.  The job never sends a step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Fault, Scenario
from fabricmon.sim.tree import NodeTree
from support.agentrig import http_get
from support.procrig import Proc, free_port, wait_until

pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")
pytest.importorskip("cryptography", reason="tests/support/certs.py makes the test CA with cryptography")

from support.kubeapi import FakeApiServer  # noqa: E402
from support.kubelet import FakeKubelet, pod  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes" / "job-pod.json"

JOB_UID = "5b2e8f1a-3c4d-4e6f-8a9b-0c1d2e3f4a5b"  # the fixture's batch.kubernetes.io/controller-uid


def _incidents(port: int) -> list[dict]:
    code, body = http_get(f"http://127.0.0.1:{port}/api/incidents?state=open")
    return json.loads(body) if code == 200 else []


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")
def test_a_pods_job_is_on_the_fabric_incident_of_its_node(tmp_path):
    spec = ClusterSpec(2, "roce", 2, seed=7)
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump({
        "cluster": "t", "layout": spec.layout, "nodes_per_unit": spec.nodes_per_unit,
        "generate": {"nodes": spec.nodes, "gpus_per_node": NGPU, "rails": NRAILS}}))
    sim = ClusterState(Scenario(spec, 3600, faults=(Fault("link_down", 0.0, node="node-000", rail=1),)))
    sim.advance(1.0)
    tree = NodeTree(sim, 0, tmp_path / "node")
    tree.render()
    api = FakeApiServer(tmp_path / "api")
    kubelet = FakeKubelet(tmp_path / "kubelet.sock")
    obj = json.loads(FIXTURE.read_text())
    name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
    api.pods[(ns, name)] = obj
    # the NVIDIA device plugin's ids are the GPUs' NVML UUIDs (here the simulated node's fake NVML)
    kubelet.pods = [pod(ns, name, {"nvidia.com/gpu": [sim.gpus.uuid(0, 0), sim.gpus.uuid(0, 1)]})]
    g, h, m = free_port(), free_port(), free_port()
    (tmp_path / "aggregator.yaml").write_text(yaml.safe_dump({
        "topology": "topology.yaml", "grpc_listen": f"127.0.0.1:{g}", "http_listen": f"127.0.0.1:{h}",
        "tick_seconds": 0.2, "auth": {"insecure": True}}))
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump({
        "sysfs_root": str(tree.sys), "ethtool_dir": str(tree.ethtool_dir), "node_name": "node-000",
        "nvml": f"fake:{tree.nvml_file}", "listen": f"127.0.0.1:{m}", "interval": 0.2,
        "aggregator": f"127.0.0.1:{g}", "stream": {"spool_dir": str(tmp_path / "spool")},
        "sources": {"jobs": {"dir": str(tmp_path / "jobs"), "kubernetes": {
            "enabled": True, "socket": str(kubelet.socket), "api_server": api.url,
            "token_file": str(api.token_file), "ca_file": api.ca, "interval": 1.0}}},
        "intake": {"listen": None, "socket": None}, "log": {"format": "json"}}))
    procs: list[Proc] = []
    try:
        agg = Proc(["aggregator", "--config", str(tmp_path / "aggregator.yaml"), "--log-format", "json"],
                   tmp_path / "agg.log")
        procs.append(agg)
        assert agg.wait_log("aggregator_started"), agg.text()
        agent = Proc(["agent", "--config", str(tmp_path / "agent.yaml")], tmp_path / "agent.log")
        procs.append(agent)

        def link_incident() -> dict | None:
            return next((i for i in _incidents(h) if i["alertname"] == "FabricLinkDown"), None)

        def listed() -> bool:
            inc = link_incident()
            return inc is not None and any(x.get("exposed") for x in inc["impact"])

        assert wait_until(listed, 60), (link_incident(), agent.text()[-3000:])
        inc = link_incident()
        assert inc["component"] == "node-000/mlx5_1/1"
        # GPU 1 is behind mlx5_1: the job is on the incident with that GPU, not measured (it sends no step)
        assert inc["impact"] == [{"job": "etl-nightly", "job_id": JOB_UID, "step_slowdown": None, "stopped": False,
                                  "gpu_hours_per_hour": 0.0, "exposed": True, "gpus": ["node-000/gpu1"]}]
        assert api.requests and all(auth == f"Bearer {api.token}" for _, auth in api.requests)
        # the pod ends: the kubelet stops listing it, the agent says the job left its GPUs
        kubelet.pods = []
        gone = f'fabricmon_job_gpu_info{{gpu="1",hpc_job="etl-nightly",job_id="{JOB_UID}",node="node-000"}} 0.0'

        def metrics() -> str:
            return http_get(f"http://127.0.0.1:{m}/metrics")[1].decode()

        assert wait_until(lambda: gone in metrics(), 30), metrics()
        assert 'fabricmon_pod_jobs_errors_total{node="node-000",reason="kubelet"} 0.0' in metrics()
    finally:
        for p in procs:
            p.stop()
        kubelet.close()
        api.close()
