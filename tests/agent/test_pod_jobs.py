"""The agent's ``jobs`` source on Kubernetes: the kubelet's PodResources (real gRPC on a unix socket, the
real v1 proto) maps GPU device ids to pods, the API server (real HTTPS, real-format Pod JSON) names each
pod's job; every failure is counted by reason and none stops the agent (DESIGN "Jobs, decoys and cost")."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from fabricmon.config import JobsConfig, PodResourcesConfig
from fabricmon.configload import ConfigError, build
from fabricmon.jobmap.assignment import JobAssignment
from fabricmon.jobmap.podresources import PodJobs, device_gpu, pods_with_devices
from fabricmon.sources.jobs import JobsSource

pytest.importorskip("cryptography", reason="tests/support/certs.py makes the test CA with cryptography")

from support.kubeapi import FakeApiServer  # noqa: E402
from support.kubelet import FakeKubelet, pod  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes" / "job-pod.json"
UUIDS = {f"GPU-4f2a9c3e-7d1b-4e0a-9b6c-00000000000{i}": i for i in range(8)}
U = list(UUIDS)
JOB_UID = "5b2e8f1a-3c4d-4e6f-8a9b-0c1d2e3f4a5b"


@pytest.fixture
def rig(tmp_path):
    api = FakeApiServer(tmp_path / "api")
    kubelet = FakeKubelet(tmp_path / "kubelet.sock")
    yield api, kubelet, tmp_path
    kubelet.close()
    api.close()


def _cfg(api: FakeApiServer, sock: Path, **kw) -> PodResourcesConfig:
    return PodResourcesConfig(enabled=True, socket=str(sock), api_server=api.url, token_file=str(api.token_file),
                              ca_file=api.ca, timeout=2.0, **kw)


def _pod_object(namespace: str, name: str, labels: dict[str, str] | None = None) -> dict:
    obj = json.loads(FIXTURE.read_text())
    obj["metadata"].update(namespace=namespace, name=name)
    if labels is not None:
        obj["metadata"]["labels"] = labels
    return obj


def _errors(pj: PodJobs) -> dict[str, float]:
    return {dict(r.labels)["reason"]: r.value for r in pj.readings() if r.family == "fabricmon_pod_jobs_errors_total"}


def test_device_ids_of_the_nvidia_device_plugin():
    assert device_gpu(U[3], UUIDS) == 3
    assert device_gpu(f"{U[3]}::2", UUIDS) == 3  # time-slicing replica 2 of GPU 3
    assert device_gpu("5", UUIDS) == 5  # DEVICE_ID_STRATEGY=index
    assert device_gpu("MIG-1a2b3c4d-0000-0000-0000-000000000000", UUIDS) is None  # not one NVML lists here
    assert device_gpu("GPU-not-on-this-node", UUIDS) is None
    assert device_gpu("999", UUIDS) is None


# The formats of a MIG device: `nvidia-smi -L` on a MIG-enabled A100 (NVIDIA MIG User Guide, "Getting Started
# with MIG"; R470+ drivers) lists, under "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-<uuid>)",
# "  MIG 1g.5gb     Device  0: (UUID: MIG-<uuid>)"; NVML gives the same string (nvmlDeviceGetUUID on the MIG
# device handle), which the NVIDIA k8s-device-plugin hands the kubelet as the device id under the mig
# strategies (internal/rm/nvml_devices.go: nvmlMigDevice.GetUUID), or "<gpu>:<mig>" with
# DEVICE_ID_STRATEGY=index (newMigDevice); drivers before R470 named it MIG-GPU-<gpu uuid>/<gi>/<ci> (CUDA
# programming guide, CUDA_VISIBLE_DEVICES).  The UUIDs below are made up in that format.
MIG_UUIDS = ["MIG-0b6f9e2c-5a1d-5c3e-9f47-2d8a6b1c0e35", None, "MIG-7c2e4d91-3b8a-5f06-a1d2-9e5b7c3f4a68"]


def test_a_mig_device_counts_for_its_parent_gpu():
    """A pod holding a MIG slice holds (part of) its parent GPU: mapped through the MIG UUIDs the agent's NVML
    source reads (here pynvml's own types over stubbed entry points), never counted as an unmapped device."""
    from fabricmon.sources.nvml.backend_pynvml import PynvmlBackend
    from fabricmon.sources.nvml.source import NvmlSource
    from support.nvmlstub import StubPynvml, no_inventory

    nv = StubPynvml(gpus=2)
    nv.mig[1] = MIG_UUIDS  # slot 1 empty (NVML_ERROR_NOT_FOUND); GPU 0 has MIG off
    src = NvmlSource(PynvmlBackend(module=nv), timeout=5.0)
    try:
        res = src.poll(no_inventory())
        uuids = src.gpu_uuids()
    finally:
        src.close()
    assert res.up and res.errors == 0, res.messages
    assert uuids == {"GPU-stub-0": 0, "GPU-stub-1": 1, MIG_UUIDS[0]: 1, MIG_UUIDS[2]: 1}
    assert device_gpu(MIG_UUIDS[2], uuids) == 1
    assert device_gpu(f"{MIG_UUIDS[0]}::1", uuids) == 1  # time-sliced MIG device, replica 1
    assert device_gpu("1:2", uuids) == 1  # DEVICE_ID_STRATEGY=index: MIG device 2 of GPU 1
    assert device_gpu("MIG-GPU-stub-1/3/0", uuids) == 1  # before R470: parent/gi/ci
    assert device_gpu("MIG-GPU-stub-7/3/0", uuids) is None
    # the mig strategy "mixed" names a resource per profile (nvidia.com/mig-1g.10gb): taken by default
    answer = SimpleNamespace(pod_resources=[pod("infer", "chat-0", {"nvidia.com/mig-1g.10gb": [MIG_UUIDS[0]]}),
                                            pod("kube-system", "nic", {"openshift.io/mlnxnics": ["0000:5e:00.2"]})])
    found = pods_with_devices(answer, PodResourcesConfig().resources)
    assert [(p.name, p.device_ids) for p in found] == [("chat-0", (MIG_UUIDS[0],))]
    assert pods_with_devices(answer, ("nvidia.com/gpu",)) == []


def test_pods_gpus_and_jobs_through_the_real_kubelet_api(rig):
    api, kubelet, tmp = rig
    kubelet.pods = [
        pod("research", "etl-nightly-0-x7k2p", {"nvidia.com/gpu": [U[1], U[0]]}),
        pod("research", "etl-nightly-1-q9w8e", {"nvidia.com/gpu": ["2"]}),  # same Job, an index id
        pod("infer", "chat-7f9c", {"nvidia.com/gpu": [f"{U[5]}::0", f"{U[5]}::1"]}),  # unlabelled, time-sliced
        pod("kube-system", "sriov-agent", {"openshift.io/mlnxnics": ["0000:5e:00.2"]}),  # no GPU: not asked about
    ]
    api.pods[("research", "etl-nightly-0-x7k2p")] = _pod_object("research", "etl-nightly-0-x7k2p")
    api.pods[("research", "etl-nightly-1-q9w8e")] = _pod_object("research", "etl-nightly-1-q9w8e")
    api.pods[("infer", "chat-7f9c")] = _pod_object("infer", "chat-7f9c", {"app": "chat"})
    pj = PodJobs(_cfg(api, kubelet.socket), lambda: UUIDS, env={})
    pj.refresh()
    found, msgs = pj()
    assert msgs == []
    assert found == [JobAssignment("etl-nightly", JOB_UID, (0, 1, 2), "", "kubernetes"),
                     JobAssignment("infer/chat-7f9c", "infer:chat-7f9c", (5,), "", "kubernetes")]
    assert sorted(api.paths()) == ["/api/v1/namespaces/infer/pods/chat-7f9c",
                                   "/api/v1/namespaces/research/pods/etl-nightly-0-x7k2p",
                                   "/api/v1/namespaces/research/pods/etl-nightly-1-q9w8e"]
    assert {r.family: r.value for r in pj.readings()}["fabricmon_pod_jobs_up"] == 1.0
    assert set(_errors(pj).values()) == {0.0}
    # labels are kept (label_ttl): a second read asks the kubelet, not the API server again
    pj.refresh()
    assert len(api.paths()) == 3 and kubelet.calls == 2


def test_configured_label_keys_and_no_unlabelled_pods(rig):
    api, kubelet, tmp = rig
    kubelet.pods = [pod("research", "a", {"nvidia.com/gpu": ["0"]}), pod("research", "b", {"nvidia.com/gpu": ["1"]})]
    api.pods[("research", "a")] = _pod_object("research", "a", {"team.example.com/run": "sweep-17"})
    api.pods[("research", "b")] = _pod_object("research", "b", {"app": "notebook"})
    pj = PodJobs(_cfg(api, kubelet.socket, job_labels=("team.example.com/run",), unlabelled=False), lambda: UUIDS,
                 env={})
    pj.refresh()
    found, msgs = pj()
    assert found == [JobAssignment("sweep-17", "research:sweep-17", (0,), "", "kubernetes")]
    assert msgs == ["podresources: pod research/b: none of the labels team.example.com/run"]


def test_every_failure_is_counted_and_none_raises(rig):
    api, kubelet, tmp = rig
    kubelet.pods = [pod("research", "etl-nightly-0-x7k2p", {"nvidia.com/gpu": [U[1], "MIG-1a2b"]})]
    api.pods[("research", "etl-nightly-0-x7k2p")] = _pod_object("research", "etl-nightly-0-x7k2p")
    pj = PodJobs(_cfg(api, kubelet.socket), lambda: UUIDS, env={})
    pj.refresh()
    assert pj()[0] == [JobAssignment("etl-nightly", JOB_UID, (1,), "", "kubernetes")]
    assert _errors(pj)["device"] == 1  # the MIG slice names no whole GPU

    # the kubelet refuses: the last answer stands, counted
    kubelet.status = grpc.StatusCode.UNAVAILABLE
    pj.refresh()
    found, msgs = pj()
    assert found == [JobAssignment("etl-nightly", JOB_UID, (1,), "", "kubernetes")]
    assert _errors(pj)["kubelet"] == 1 and "UNAVAILABLE" in msgs[-1]
    assert {r.family: r.value for r in pj.readings()}["fabricmon_pod_jobs_up"] == 0.0
    kubelet.status = None

    # the API server refuses (403) for a pod not seen before: listed by its pod name, counted, with the fix
    kubelet.pods.append(pod("research", "new-pod", {"nvidia.com/gpu": ["3"]}))
    api.status = 403
    pj.refresh()
    found, msgs = pj()
    assert JobAssignment("research/new-pod", "research:new-pod", (3,), "", "kubernetes") in found
    assert _errors(pj)["api"] == 1 and "needs get on pods" in msgs[-1]
    api.status = None

    # an answer that is not the pod asked for
    pj.cfg = _cfg(api, kubelet.socket, label_ttl=0.0)
    api.pods[("research", "new-pod")] = {"kind": "Node", "metadata": {"name": "new-pod"}}
    pj.refresh()
    assert _errors(pj)["answer"] == 1

    # the API server away altogether: cached labels stand
    api.close()
    pj.refresh()
    assert JobAssignment("etl-nightly", JOB_UID, (1,), "", "kubernetes") in pj()[0]
    assert _errors(pj)["api"] == 3  # one per pod whose labels were due (label_ttl 0)

    # the socket gone (kubelet restarting), then a socket nobody serves
    kubelet.close()
    kubelet.socket.unlink(missing_ok=True)
    pj.refresh()
    assert _errors(pj)["socket"] == 1 and "no kubelet PodResources socket" in pj()[1][-1]
    kubelet.socket.write_text("")
    pj.refresh()
    assert _errors(pj)["kubelet"] == 2


def test_auto_runs_only_where_the_socket_and_an_api_server_are(tmp_path):
    sock = tmp_path / "kubelet.sock"
    pj = PodJobs(PodResourcesConfig(socket=str(sock)), lambda: UUIDS, env={})
    pj.refresh()
    assert pj.readings() == [] and pj() == ([], [])  # bare metal: no series at all
    in_pod = PodJobs(PodResourcesConfig(socket=str(sock)), lambda: UUIDS, env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert in_pod.api_server == "https://10.96.0.1:443" and not in_pod.wanted()
    sock.write_text("")
    assert in_pod.wanted()


def test_uuids_before_nvml_answered_wait_without_an_error(rig):
    api, kubelet, tmp = rig
    kubelet.pods = [pod("research", "etl-nightly-0-x7k2p", {"nvidia.com/gpu": [U[1]]})]
    api.pods[("research", "etl-nightly-0-x7k2p")] = _pod_object("research", "etl-nightly-0-x7k2p")
    known: list[dict | None] = [None]
    pj = PodJobs(_cfg(api, kubelet.socket), lambda: known[0], env={})
    pj.refresh()
    assert pj.pending and pj()[0] == [] and set(_errors(pj).values()) == {0.0}
    known[0] = UUIDS
    pj.refresh()
    assert not pj.pending and pj()[0] == [JobAssignment("etl-nightly", JOB_UID, (1,), "", "kubernetes")]


def test_the_jobs_source_exports_pod_jobs_beside_slurm_jobs(rig):
    api, kubelet, tmp = rig
    kubelet.pods = [pod("research", "etl-nightly-0-x7k2p", {"nvidia.com/gpu": [U[0]]})]
    api.pods[("research", "etl-nightly-0-x7k2p")] = _pod_object("research", "etl-nightly-0-x7k2p")
    pj = PodJobs(_cfg(api, kubelet.socket), lambda: UUIDS, env={})
    src = JobsSource(JobsConfig(dir=str(tmp / "jobs")), pods=pj)
    pj.refresh()
    res = src.poll(None)
    got = {(r.family, r.labels, r.value) for r in res.readings}
    assert ("fabricmon_job_gpu_info", (("hpc_job", "etl-nightly"), ("job_id", JOB_UID), ("gpu", "0")), 1.0) in got
    assert ("fabricmon_pod_jobs_up", (), 1.0) in got
    src.close()


def test_config_errors_name_the_field():
    def load(section: dict) -> None:
        build(JobsConfig, {"kubernetes": section}, "sources.jobs", "agent.yaml")

    bad = [({"resources": ["gpu"]}, "sources.jobs.kubernetes.resources[0]: not an extended resource name"),
           ({"job_labels": ["bad key!"]}, "sources.jobs.kubernetes.job_labels[0]: not a Kubernetes label key"),
           ({"socket": "kubelet.sock"}, "sources.jobs.kubernetes.socket: need an absolute path"),
           ({"api_server": "http://x"}, "sources.jobs.kubernetes.api_server: must be an https:// URL"),
           ({"interval": 0.1}, "sources.jobs.kubernetes.interval: must be >= 1"),
           ({"enabled": "yes"}, "sources.jobs.kubernetes.enabled: expected true or false"),
           ({"job_labels": [], "unlabelled": False}, "no pod would be listed")]
    for section, message in bad:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load(copy.deepcopy(section))
