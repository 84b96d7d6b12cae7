"""An in-process kubelet PodResources server on a unix socket: the real ``v1.PodResourcesLister`` service
(fabricmon/proto/podresources_v1.proto, copied from k8s.io/kubelet) over real gRPC, answering ``List``
with the pods a test sets.  This machine runs no kubelet; the agent's client cannot tell the difference
on the wire.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from fabricmon.proto import podresources_v1_pb2 as pb
from fabricmon.proto import podresources_v1_pb2_grpc as pb_grpc


def pod(namespace: str, name: str, devices: dict[str, list[str]], container: str = "trainer") -> pb.PodResources:
    """One pod whose one container holds ``devices`` (resource name -> device ids), as the kubelet lists it."""
    return pb.PodResources(name=name, namespace=namespace, containers=[pb.ContainerResources(
        name=container, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()])])


class FakeKubelet:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: list[pb.PodResources] = []
        self.status: grpc.StatusCode | None = None  # answer List with this error instead
        self.calls = 0
        self.lock = threading.Lock()
        server = self

        class Lister(pb_grpc.PodResourcesListerServicer):
            def List(self, request, context):  # noqa: N802 - the proto's method name
                with server.lock:
                    server.calls += 1
                    if server.status is not None:
                        context.abort(server.status, "kubelet says no")
                    return pb.ListPodResourcesResponse(pod_resources=list(server.pods))

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), self.server)
        if self.server.add_insecure_port(f"unix:{socket}") == 0:
            raise RuntimeError(f"cannot bind {socket}")
        self.server.start()

    def close(self) -> None:
        self.server.stop(0).wait(5.0)
