"""A loopback of the stream codec: every batch crosses it as bytes (the in-memory demo's wire).

Each simulated node has the agent's side of a connection (``AgentEnd``: a ``SeriesEncoder``,
serialized ``AgentMessage`` bytes, exactly what the stream client writes to gRPC) and the
aggregator's side (``ServerEnd``: parse, ``SeriesDecoder`` with the engine's read families, the
servicer's seq rule), so ``--mode memory`` exercises the wire format and the decoder the server
runs, without a gRPC connection per node: 4,096 HTTP/2 streams in one process would measure the
simulator's process, not fabricmon.  What it skips is gRPC framing and the event loop
(bench_freshness.py measures those with real streams).

``CodecWire`` holds both ends in one process; the parallel memory simulator
(``sim/parallel_memory.py``) runs the agents' end in its worker and hands the bytes to a
``ServerEnd`` here.
"""

from __future__ import annotations

from collections.abc import Callable

from ..batch import NodeBatch, NodeHello
from . import fabricmon_pb2 as pb
from .codec import SeriesDecoder, SeriesEncoder, hello_from_pb, hello_to_pb


class AgentEnd:
    """The agents' side: one series table per node, each message as the stream client serializes it."""

    def __init__(self) -> None:
        self._enc: dict[str, SeriesEncoder] = {}

    def hello(self, h: NodeHello) -> bytes:
        """A (re)connect: a new series table, the hello's bytes."""
        self._enc[h.node] = SeriesEncoder()
        return pb.AgentMessage(hello=hello_to_pb(h)).SerializeToString()

    def batch(self, b: NodeBatch) -> bytes:
        return pb.AgentMessage(batch=self._enc[b.node].encode(b)).SerializeToString()


class ServerEnd:
    """The aggregator's side: a hello opens a node's series table, each batch is parsed, put through
    the servicer's seq rule, decoded and ingested."""

    def __init__(self, hello: Callable[[NodeHello], None], ingest: Callable[[NodeBatch], object],
                 read_families: frozenset[str] | None = None) -> None:
        self._hello = hello
        self._ingest = ingest
        self._read = read_families
        self._dec: dict[str, SeriesDecoder] = {}
        self._last_seq: dict[str, int] = {}
        self.bytes_total = 0
        self.batches_total = 0
        self.duplicates_total = 0

    def hello(self, data: bytes) -> None:
        self.bytes_total += len(data)
        got = hello_from_pb(pb.AgentMessage.FromString(data).hello)
        self._dec[got.node] = SeriesDecoder(read_families=self._read)
        self._hello(got)

    def batch(self, node: str, data: bytes) -> None:
        """``data`` from ``node``'s connection (the node its hello named)."""
        self.bytes_total += len(data)
        m = pb.AgentMessage.FromString(data).batch
        if m.seq <= self._last_seq.get(node, 0):
            self.duplicates_total += 1  # the servicer drops (and acks) a replayed seq the same way
            return
        self._last_seq[node] = m.seq
        self.batches_total += 1
        self._ingest(self._dec[node].decode(m, node))


class CodecWire:
    """Both ends in one process: ``connect`` a node's hello, then ``deliver`` its batches."""

    def __init__(self, hello: Callable[[NodeHello], None], ingest: Callable[[NodeBatch], object],
                 read_families: frozenset[str] | None = None) -> None:
        self.agents = AgentEnd()
        self.server = ServerEnd(hello, ingest, read_families)

    @property
    def bytes_total(self) -> int:
        return self.server.bytes_total

    @property
    def batches_total(self) -> int:
        return self.server.batches_total

    @property
    def duplicates_total(self) -> int:
        return self.server.duplicates_total

    def connect(self, h: NodeHello) -> None:
        """A (re)connect: new series tables on both sides, the hello over the wire."""
        self.server.hello(self.agents.hello(h))

    def deliver(self, b: NodeBatch) -> None:
        self.server.batch(b.node, self.agents.batch(b))
