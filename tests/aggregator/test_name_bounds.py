"""Per-node bounds on the names a node may introduce at the aggregator (issue 26: one node with
its own token grew the aggregator's memory without bound with new device, port and GPU names,
about 14 MiB per 100k).  Real gRPC over loopback, the real engine and stream client."""

from __future__ import annotations

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.name_bounds import DEFAULT_LIMITS, NameBounds
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NicHello, NodeHello
from fabricmon.model import Sample, Snapshot
from fabricmon.topology import generate_topology
from support.waiting import wait_until

NODE = "node-000"


def _snap(i: int, devices: range, gpus: range = range(0)) -> Snapshot:
    samples = tuple(Sample("fabricmon_ib_port_state", (("device", f"mlx5_{d}"), ("port", "1")), 4.0) for d in devices)
    samples += tuple(Sample("fabricmon_nvlink_up", (("gpu", str(g)), ("link", "0")), 1.0) for g in gpus)
    return Snapshot(NODE, 1000.0 + i, i, samples, (), 1.0, ())


def test_a_node_cannot_grow_the_aggregator_without_bound():
    topo = generate_topology(2, nodes_per_unit=2, layout="roce", cluster="test")
    eng = Engine(topo, DetectionSettings())
    srv = start_grpc_server(eng, "127.0.0.1:0")
    hello = NodeHello(NODE, "test", 1.0, gpus=8, boot_id="b1")
    c = StreamClient(srv.address, NODE, lambda: hello, MemorySpool(), backoff_min=0.05, backoff_max=0.3).start()
    limit = DEFAULT_LIMITS["device"]
    try:
        assert wait_until(lambda: c.connected)
        for i in range(1, 7):  # 50 new device names a batch, 300 in all, and 100 GPU indexes
            c.offer(_snap(i, range(50 * (i - 1), 50 * i), range(100) if i == 1 else range(0)))
        assert wait_until(lambda: eng.admission.batches_total == 6)
        links = eng.nodes[NODE].links
        assert limit <= len(links) <= limit + 8, len(links)  # 8: the topology's own NICs
        refused = srv.stats()
        assert refused["names_refused_device_total"] == 300 - limit
        assert refused["names_refused_gpu_total"] == 100 - DEFAULT_LIMITS["gpu"]
        # an honest node beside it is unaffected
        assert eng.nodes[NODE].connected
    finally:
        c.stop()
        srv.stop(0.5)


def test_names_once_admitted_stay_admitted_and_hello_nics_are_bounded():
    nb = NameBounds({"device": 2, "interface": 2})
    admit = nb.admitter("n1")
    key = lambda d: ("fabricmon_ib_port_state", (("device", d), ("port", "1")))  # noqa: E731
    assert admit(key("a")) and admit(key("b")) and not admit(key("c"))
    assert admit(key("a"))  # a known name is never refused (a reconnect redefines every series)
    assert nb.admitter("n2")(key("c"))  # bounds are per node
    h = NodeHello("n3", "t", 1.0, nics=tuple(NicHello(f"d{i}", "1", "", "Ethernet", f"eth{i}", 400.0, 4)
                                             for i in range(4)))
    assert [n.device for n in nb.hello(h).nics] == ["d0", "d1"]
    assert nb.refused["device"] == 3
