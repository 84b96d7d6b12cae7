"""Which pod's job holds which GPUs of this node, from the kubelet (Kubernetes' answer to a Slurm prolog).

The kubelet's PodResources API (``v1.PodResourcesLister/List`` on its unix socket, proto:
fabricmon/proto/podresources_v1.proto, the same call dcgm-exporter makes to put pods on GPU metrics)
names, per pod, the device ids each container was given for each extended resource.  The NVIDIA device
plugin's ids for ``nvidia.com/gpu`` are NVML GPU UUIDs (``GPU-...``; ``GPU-...::N`` for the Nth
time-sliced replica of one GPU; ``MIG-...`` for a MIG device under the mig strategies, counted for its
parent GPU) or, with ``DEVICE_ID_STRATEGY=index``, NVML indexes (``N:M`` for MIG device M of GPU N).  A pod's job is the
value of the first of ``job_labels`` its labels carry (``GET /api/v1/namespaces/NS/pods/NAME`` with the
agent's service account: ``get`` on pods, nothing else); its identity across nodes is the first of
``job_id_labels`` (the Job controller's uid), else ``<namespace>:<job>``.  A pod with none of the
labels is the job ``<namespace>/<pod>``.

Reads run on their own thread every ``interval`` seconds, so a hung kubelet or API server never holds
the agent's poll; every failure is counted by reason (``fabricmon_pod_jobs_errors_total``) and the last
answer stands until the next one.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from ..config import PodResourcesConfig
from ..kubeapi import KubeApiError, get_json, in_cluster_api_server
from ..model import Reading, Semantics, reading
from .assignment import MAX_GPUS, AssignmentError, JobAssignment, check_job_id

log = structlog.get_logger("fabricmon.podresources")

# why a read came short, the label of fabricmon_pod_jobs_errors_total (each created at 0)
REASONS = ("socket", "kubelet", "api", "answer", "device")
MAX_PODS = 1024  # a kubelet runs at most a few hundred pods; more is not an answer to trust
MAX_DEVICES = 4096
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_REPLICA = "::"  # the NVIDIA device plugin's time-slicing replica suffix (GPU-uuid::3)
_MIG_INDEX = re.compile(r"^[0-9]{1,3}:[0-9]{1,3}$")  # index strategy: MIG device M of GPU N
_MIG_OLD = re.compile(r"^MIG-(GPU-[^/]{1,80})/[0-9]{1,3}/[0-9]{1,3}$")  # before R470: parent/gi/ci


@dataclass(frozen=True, slots=True)
class PodGpus:
    namespace: str
    name: str
    device_ids: tuple[str, ...]


def pods_with_devices(resp: object, resources: tuple[str, ...]) -> list[PodGpus]:
    """The pods of a ``ListPodResourcesResponse`` holding devices of ``resources`` (every container's)."""
    out: list[PodGpus] = []
    exact = {r for r in resources if not r.endswith("*")}
    prefixes = tuple(r[:-1] for r in resources if r.endswith("*"))
    pods = list(resp.pod_resources)  # type: ignore[attr-defined]
    if len(pods) > MAX_PODS:
        raise AssignmentError(f"kubelet listed {len(pods)} pods (more than {MAX_PODS})")
    for pod in pods:
        ids: list[str] = []
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name in exact or (prefixes and dev.resource_name.startswith(prefixes)):
                    ids.extend(dev.device_ids)
        if len(ids) > MAX_DEVICES:
            raise AssignmentError(f"pod {pod.namespace}/{pod.name}: {len(ids)} device ids")
        if ids:
            out.append(PodGpus(pod.namespace, pod.name, tuple(dict.fromkeys(ids))))
    return out


def device_gpu(device_id: str, uuids: Mapping[str, int]) -> int | None:
    """The NVML index of the GPU a device plugin id names (``::N`` replica suffix dropped):

    - ``GPU-<uuid>`` or a MIG device's ``MIG-<uuid>`` through NVML's UUIDs (``uuids`` holds each GPU's and,
      with MIG on, each of its MIG devices' UUIDs: the agent's NVML source): a MIG slice counts for its
      parent GPU, whose fabric path its ranks share;
    - ``MIG-GPU-<gpu uuid>/<gi>/<ci>``, the MIG device name of drivers before R470 (CUDA's
      CUDA_VISIBLE_DEVICES documentation), through its parent's UUID;
    - an index, ``N``, or ``N:M`` (MIG device M of GPU N) with ``DEVICE_ID_STRATEGY=index`` (NVIDIA
      k8s-device-plugin, internal/rm/nvml_devices.go: newMigDevice names MIG devices ``"%v:%v"``).

    None when it names no GPU NVML shows (an unknown UUID, NVML not read yet)."""
    base = device_id.split(_REPLICA, 1)[0]
    index = base.split(":", 1)[0] if _MIG_INDEX.match(base) else base
    if index.isdigit():
        return int(index) if int(index) < MAX_GPUS else None
    old = _MIG_OLD.match(base)
    return uuids.get(old.group(1) if old else base)


def pod_job(obj: object, pod: PodGpus, cfg: PodResourcesConfig) -> tuple[str, str]:
    """(job, job_id) from a Pod object (the API's JSON); AssignmentError when it is not that pod."""
    if not isinstance(obj, dict) or obj.get("kind") != "Pod" or not isinstance(obj.get("metadata"), dict):
        raise AssignmentError(f"pod {pod.namespace}/{pod.name}: the answer is not a Pod object")
    meta = obj["metadata"]
    if meta.get("name") != pod.name or meta.get("namespace") != pod.namespace:
        raise AssignmentError(f"pod {pod.namespace}/{pod.name}: the answer is Pod "
                              f"{meta.get('namespace')}/{meta.get('name')}")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        raise AssignmentError(f"pod {pod.namespace}/{pod.name}: metadata.labels is not a mapping")
    return labels_job(labels, pod, cfg)


def labels_job(labels: Mapping[str, object], pod: PodGpus, cfg: PodResourcesConfig) -> tuple[str, str]:
    job = next((v for k in cfg.job_labels if isinstance(v := labels.get(k), str) and _LABEL_VALUE.match(v)), None)
    if job is None:
        if not cfg.unlabelled:
            raise AssignmentError(f"pod {pod.namespace}/{pod.name}: none of the labels {', '.join(cfg.job_labels)}")
        return f"{pod.namespace}/{pod.name}", check_job_id(f"{pod.namespace}:{pod.name}", "pod")
    job_id = next((v for k in cfg.job_id_labels if isinstance(v := labels.get(k), str) and _LABEL_VALUE.match(v)),
                  f"{pod.namespace}:{job}")
    return job, check_job_id(job_id, f"pod {pod.namespace}/{pod.name}: job id")


def list_pod_resources(socket: str, timeout: float) -> object:
    """The kubelet's ``List`` answer (a ``ListPodResourcesResponse``); grpc.RpcError when it fails."""
    import grpc

    from ..proto import podresources_v1_pb2 as pb
    from ..proto import podresources_v1_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        return stub.List(pb.ListPodResourcesRequest(), timeout=timeout)


class PodJobs:
    """The ``pods`` provider of the ``jobs`` source: the latest assignments, refreshed in the background."""

    def __init__(self, cfg: PodResourcesConfig, uuids: Callable[[], Mapping[str, int] | None], *,
                 env: Mapping[str, str] = os.environ, clock: Callable[[], float] = time.monotonic,
                 lister: Callable[[str, float], object] = list_pod_resources,
                 get: Callable[[str, str, str, float], object] = get_json) -> None:
        self.cfg = cfg
        self.uuids = uuids
        self.clock = clock
        self.lister = lister
        self.get = get
        self.api_server = cfg.api_server or in_cluster_api_server(env)
        self.errors = dict.fromkeys(REASONS, 0)
        self.active = False  # read at least once (forced on, or found its socket)
        self.up = False  # the last read had no error
        self.pending = False  # the kubelet named GPU UUIDs before NVML was read: read again soon
        self._labels: dict[tuple[str, str], tuple[float, tuple[str, str]]] = {}  # pod -> (when, (job, id))
        self._latest: list[JobAssignment] = []
        self._messages: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wanted(self) -> bool:
        """``enabled`` unset: on where the socket exists and an API server is known (a pod, or configured)."""
        if self.cfg.enabled is not None:
            return self.cfg.enabled
        return bool(self.api_server) and os.path.exists(self.cfg.socket)

    def _fail(self, reason: str, message: str, errors: list[str]) -> None:
        self.errors[reason] += 1
        errors.append(f"podresources: {message}")

    def refresh(self) -> None:
        """One read of the kubelet and of the labels of the pods it names."""
        if not self.wanted():
            return
        self.active = True
        errors: list[str] = []
        found = self._read(errors)
        with self._lock:
            if found is not None:
                self._latest = found
            self._messages.extend(errors)
            del self._messages[:-20]
            self.up = not errors and not self.pending
        for m in errors:
            log.warning("podresources_read_failed", error=m)

    def _read(self, errors: list[str]) -> list[JobAssignment] | None:
        sock = self.cfg.socket
        if not os.path.exists(sock):
            self._fail("socket", f"{sock}: no kubelet PodResources socket (is the kubelet's "
                                 f"/var/lib/kubelet/pod-resources mounted?)", errors)
            return None
        try:
            resp = self.lister(sock, self.cfg.timeout)
            pods = pods_with_devices(resp, self.cfg.resources)
        except AssignmentError as exc:
            self._fail("answer", str(exc), errors)
            return None
        except Exception as exc:  # grpc.RpcError and whatever a broken socket raises: counted, never fatal
            code = getattr(exc, "code", None)
            what = f"{code().name}: {exc.details()}" if callable(code) else f"{type(exc).__name__}: {exc}"  # type: ignore[attr-defined]
            hint = " (the agent needs uid 0 to open the kubelet's socket)" if "ermission denied" in what else ""
            self._fail("kubelet", f"{sock}: List: {what}{hint}", errors)
            return None
        now = self.clock()
        listed = {(p.namespace, p.name) for p in pods}
        for key in list(self._labels):
            if key not in listed:
                del self._labels[key]
        uuids = self.uuids()
        self.pending = uuids is None and any(device_gpu(d, {}) is None for p in pods for d in p.device_ids)
        if self.pending:
            return None  # not an error: NVML answers at the agent's first poll
        uuids = uuids or {}
        held: dict[tuple[str, str], set[int]] = {}
        for pod in pods:
            ident = self._job(pod, now, errors)
            if ident is None:
                continue
            gpus = held.setdefault(ident, set())
            for d in pod.device_ids:
                g = device_gpu(d, uuids)
                if g is None:
                    self._fail("device", f"pod {pod.namespace}/{pod.name}: device {d[:80]!r} is no GPU or MIG "
                                         f"device NVML shows here (NVML not read yet?)", errors)
                else:
                    gpus.add(g)
        return [JobAssignment(job, job_id, tuple(sorted(gpus)), "", "kubernetes")
                for (job, job_id), gpus in sorted(held.items()) if gpus]

    def _job(self, pod: PodGpus, now: float, errors: list[str]) -> tuple[str, str] | None:
        key = (pod.namespace, pod.name)
        cached = self._labels.get(key)
        if cached is not None and now - cached[0] < self.cfg.label_ttl:
            return cached[1]
        try:
            if not self.api_server:
                raise KubeApiError("api", "no API server: not in a pod (KUBERNETES_SERVICE_HOST unset) and "
                                          "sources.jobs.kubernetes.api_server not given")
            url = (f"{self.api_server.rstrip('/')}/api/v1/namespaces/{urllib.parse.quote(pod.namespace, safe='')}"
                   f"/pods/{urllib.parse.quote(pod.name, safe='')}")
            ident = pod_job(self.get(url, self.cfg.token_file, self.cfg.ca_file, self.cfg.timeout), pod, self.cfg)
        except KubeApiError as exc:
            if exc.status == 404:
                return None  # the pod went between the kubelet's answer and ours
            hint = " (the agent's service account needs get on pods: ClusterRole fabricmon-agent-pod-reader)" \
                if exc.status in (401, 403) else ""
            self._fail(exc.reason, f"{exc}{hint}", errors)
            if cached is not None:
                return cached[1]  # labels rarely change: the last ones stand while the API is away
            if self.cfg.unlabelled:
                return labels_job({}, pod, self.cfg)
            return None
        except AssignmentError as exc:
            self._fail("answer", str(exc), errors)
            return None if cached is None else cached[1]
        self._labels[key] = (now, ident)
        return ident

    def __call__(self) -> tuple[list[JobAssignment], list[str]]:
        """The latest assignments and the messages since the last call (the ``jobs`` source's ``pods``)."""
        with self._lock:
            msgs, self._messages = self._messages, []
            return list(self._latest), msgs

    def readings(self) -> list[Reading]:
        if not self.active:
            return []  # auto and no socket: not a Kubernetes GPU node (no series, as nvml without a driver)
        out = [reading("fabricmon_pod_jobs_up", 1.0 if self.up else 0.0)]
        out += [Reading("fabricmon_pod_jobs_errors_total", (("reason", r),), float(n), Semantics.MONOTONIC, 64, "")
                for r, n in self.errors.items()]
        return out

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.refresh()
                except Exception as exc:  # a bug here must not end the thread silently
                    self.errors["answer"] += 1
                    log.error("podresources_refresh_failed", error=repr(exc))
                self._stop.wait(1.0 if self.pending else self.cfg.interval)

        self._thread = threading.Thread(target=loop, name="podresources", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.cfg.timeout * 2 + 1.0)
