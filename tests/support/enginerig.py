"""An in-process engine rig: a generated cluster fed batch by batch, second by second."""

from __future__ import annotations

import random

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.batch import NicHello, NodeBatch, NodeHello
from fabricmon.model import CounterDelta, Sample
from fabricmon.rank_timing import RankTiming
from fabricmon.topology import generate_topology

T0 = 1_764_000_000.0


def _port(dev: str) -> tuple:
    return (("device", dev), ("port", "1"))


class Feed:
    """Builds one node's batches second by second: steady traffic plus injected evidence."""

    def __init__(self, topo, node: str, seed: int = 0, roce: bool = True):
        self.topo, self.node, self.seq = topo, node, 0
        self.rng = random.Random(seed)
        self.spec = topo.nodes[node]
        self.roce = roce
        self.extra_deltas: list[CounterDelta] = []
        self.extra_gauges: list[Sample] = []
        self.interval = 1.0

    def hello(self, boot_id: str = "boot-1") -> NodeHello:
        nics = tuple(NicHello(n.device, "1", str(n.rail), "Ethernet" if self.roce else "InfiniBand",
                              f"eth{n.rail}", n.rate_gbps, n.width, n.gpu) for n in self.spec.nics)
        return NodeHello(self.node, "test", self.interval, nics, self.spec.gpus, boot_id)

    def gauges_all(self) -> list[Sample]:
        out = []
        for n in self.spec.nics:
            lab = _port(n.device)
            out += [Sample("fabricmon_ib_port_state", lab, 4.0), Sample("fabricmon_ib_port_physical_state", lab, 5.0),
                    Sample("fabricmon_ib_port_rate_bytes_per_second", lab, n.rate_gbps * 1e9 / 8),
                    Sample("fabricmon_ib_port_width_lanes", lab, float(n.width))]
            for check in ("pfc", "trust", "ecn_np", "ecn_rp", "mtu", "rate", "width"):
                out.append(Sample("fabricmon_fabric_config_ok",
                                  (("device", n.device), ("interface", f"eth{n.rail}"), ("check", check)), 1.0))
        for g in range(self.spec.gpus):
            for link in range(18):
                out.append(Sample("fabricmon_nvlink_up", (("gpu", str(g)), ("link", str(link))), 1.0))
        return out

    def batch(self, t: float, first: bool = False, ranks=()) -> NodeBatch:
        r = self.rng
        self.seq += 1
        deltas = []
        for n in self.spec.nics:
            lab = _port(n.device)
            deltas += [
                CounterDelta("fabricmon_ib_port_transmit_bytes_total", lab, r.uniform(1e9, 2e10)),
                CounterDelta("fabricmon_ib_port_receive_bytes_total", lab, r.uniform(1e9, 2e10)),
                CounterDelta("fabricmon_ib_port_transmit_wait_total", lab, float(r.randint(0, 2000))),
                CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),), 0.0),
                CounterDelta("fabricmon_rdma_transport_retries_total", lab + (("counter", "out_of_sequence"),),
                             float(r.choice((0, 0, 0, 1)))),
            ]
            for d in ("rx", "tx"):
                deltas.append(CounterDelta("fabricmon_pfc_pause_seconds_total",
                                           (("interface", f"eth{n.rail}"), ("priority", "3"), ("direction", d)),
                                           r.randint(0, 2) * 5e-6))
        for g in range(self.spec.gpus):
            for link in range(18):
                lab = (("gpu", str(g)), ("link", str(link)))
                deltas.append(CounterDelta("fabricmon_nvlink_transmit_bytes_total", lab, r.uniform(1e9, 5e9)))
        deltas += self.extra_deltas
        gauges = (self.gauges_all() if first else []) + self.extra_gauges
        self.extra_deltas, self.extra_gauges = [], []
        return NodeBatch(self.node, self.seq, t, self.interval, tuple(deltas), tuple(gauges), tuple(ranks))

    def add(self, family: str, labels: tuple, delta: float, reset: bool = False) -> None:
        self.extra_deltas.append(CounterDelta(family, labels, delta, reset=reset))

    def gauge(self, family: str, labels: tuple, value: float) -> None:
        self.extra_gauges.append(Sample(family, labels, value))


class Cluster:
    def __init__(self, nodes: int = 16, nodes_per_unit: int = 8, settings: DetectionSettings | None = None,
                 seed: int = 1):
        self.topo = generate_topology(nodes, nodes_per_unit=nodes_per_unit, layout="roce", cluster="test")
        self.engine = Engine(self.topo, settings or DetectionSettings())
        self.feeds = {n: Feed(self.topo, n, seed + i) for i, n in enumerate(self.topo.nodes)}
        self.t = T0
        for f in self.feeds.values():
            self.engine.hello(f.hello())
        self.first = True
        self.ranks_fn = None
        self.reported: list[tuple[float, str, str, bool]] = []  # what tick() reported: (t, alert, comp, open)

    def feed(self, inject=None) -> None:
        """Advance one second of sample time: every node sends a batch (nothing ticks)."""
        self.t += 1.0
        if inject is not None:
            inject(self)
        for name, f in self.feeds.items():
            ranks = self.ranks_fn(self, name) if self.ranks_fn else ()
            self.engine.ingest(f.batch(self.t, first=self.first, ranks=ranks))
        self.first = False

    def step(self, inject=None) -> None:
        """Advance one second of sample time: every node sends a batch, then the engine ticks."""
        self.feed(inject)
        for inc in self.engine.tick(self.t):
            self.reported.append((self.t, inc.alertname, inc.component, inc.open))

    def run(self, seconds: int, inject=None) -> None:
        for _ in range(seconds):
            self.step(inject)

    def incidents(self, **match):
        return [i for i in self.engine.incidents() if all(getattr(i, k) == v for k, v in match.items())]


def flaky(node: str, dev: str):
    def inject(c: Cluster):
        f = c.feeds[node]
        r = f.rng
        lab = _port(dev)
        f.add("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),), float(r.randint(200, 2000)))
        f.add("fabricmon_ib_port_errors_total", lab + (("counter", "port_rcv_errors"),), float(r.randint(5, 50)))
        f.add("fabricmon_ib_port_errors_total", lab + (("counter", "link_error_recovery"),), 1.0)
    return inject


def _set_state(c, node, dev, state, phys):
    f = c.feeds[node]
    f.gauge("fabricmon_ib_port_state", _port(dev), float(state))
    f.gauge("fabricmon_ib_port_physical_state", _port(dev), float(phys))


def synced_ranks(slow_extra, step_time=2.0, comm=0.5, noise=0.01, seed=3, slow_transfer=None):
    """Synchronous job: each rank's step = max compute + comm; comm = wait for the slowest + transfer.
    ``slow_extra`` slows a GPU's compute, ``slow_transfer`` a rank's transfers (a bad link or NIC)."""
    rng = random.Random(seed)
    cache: dict = {}

    def fn(c: Cluster, node: str):
        step = int(c.t - T0)
        if step not in cache:
            comps = {}
            for n in c.topo.nodes:
                for g in range(8):
                    comps[(n, g)] = step_time - comm + slow_extra(step, n, g) + rng.gauss(0, noise)
            slowest = max(comps.values())
            cache.clear()
            cache[step] = (comps, slowest)
        comps, slowest = cache[step]
        idx = list(c.topo.nodes).index(node)
        out = []
        for g in range(8):
            transfer = comm + rng.gauss(0, noise / 2) + (slow_transfer(step, node, g) if slow_transfer else 0.0)
            wait = slowest - comps[(node, g)]
            total = comps[(node, g)] + wait + transfer
            out.append(RankTiming("llm", idx * 8 + g, g, step, total, wait + transfer, c.t, node=node))
        return out
    return fn
