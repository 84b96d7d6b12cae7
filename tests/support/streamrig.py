"""A recording engine, snapshots and a stream client for the agent-aggregator stream tests."""

from __future__ import annotations

import threading

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.batch import NodeBatch, NodeHello
from fabricmon.model import CounterDelta, Sample, Snapshot

P = (("device", "mlx5_0"), ("port", "1"))


class RecordingEngine:
    """Test double of fabricmon.aggregator.engine.Engine."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hellos: list[NodeHello] = []
        self.batches: list[NodeBatch] = []
        self.disconnects: list[str] = []

    def hello(self, hello: NodeHello) -> None:
        with self.lock:
            self.hellos.append(hello)

    def ingest(self, batch: NodeBatch) -> None:
        with self.lock:
            self.batches.append(batch)

    def tick(self, now: float) -> None:
        pass

    def disconnected(self, node: str) -> None:
        with self.lock:
            self.disconnects.append(node)

    def seqs(self) -> list[int]:
        with self.lock:
            return [b.seq for b in self.batches]


def snap(i: int, state: float = 4.0, errors: float = 1.0) -> Snapshot:
    return Snapshot(
        node="node-001", ts=1000.0 + i, seq=i,
        samples=(Sample("fabricmon_ib_port_state", P, state),
                 Sample("fabricmon_host_load1", (), float(i)),
                 Sample("fabricmon_ib_port_receive_bytes_total", P, 1e6 * i)),  # a counter total: never streamed
        deltas=(CounterDelta("fabricmon_ib_port_errors_total", P + (("counter", "symbol_error"),), errors,
                             saturated=(i % 3 == 0), reset=(i == 4)),),
        interval_seconds=1.0, sources=(),
    )


def client(target: str, **kw) -> StreamClient:
    kw.setdefault("backoff_min", 0.05)
    kw.setdefault("backoff_max", 0.3)
    kw.setdefault("hello_timeout", 3.0)
    hello = NodeHello("node-001", "test", 1.0, gpus=8, boot_id="b1")
    spool = kw.pop("spool", None)
    return StreamClient(target, "node-001", lambda: hello, MemorySpool() if spool is None else spool, **kw)
