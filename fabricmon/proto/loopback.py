"""A loopback of the stream codec: every batch crosses it as bytes (the in-memory demo's wire).

Each simulated node has the agent's side of a connection (``SeriesEncoder``,
serialized ``AgentMessage`` bytes, exactly what the stream client writes to gRPC)
and the aggregator's side (parse, ``SeriesDecoder`` with the engine's read
families, the servicer's seq rule), so ``--mode memory`` exercises the wire
format and the decoder the server runs, without a gRPC connection per node:
4,096 HTTP/2 streams in one process would measure the simulator's process, not
fabricmon.  What it skips is gRPC framing and the event loop (bench_freshness.py
measures those with real streams).
"""

from __future__ import annotations

from collections.abc import Callable

from ..batch import NodeBatch, NodeHello
from . import fabricmon_pb2 as pb
from .codec import SeriesDecoder, SeriesEncoder, hello_from_pb, hello_to_pb


class CodecWire:
    def __init__(self, hello: Callable[[NodeHello], None], ingest: Callable[[NodeBatch], object],
                 read_families: frozenset[str] | None = None) -> None:
        self._hello = hello
        self._ingest = ingest
        self._read = read_families
        self._enc: dict[str, SeriesEncoder] = {}
        self._dec: dict[str, SeriesDecoder] = {}
        self._last_seq: dict[str, int] = {}
        self.bytes_total = 0
        self.batches_total = 0
        self.duplicates_total = 0

    def connect(self, h: NodeHello) -> None:
        """A (re)connect: new series tables on both sides, the hello over the wire."""
        data = pb.AgentMessage(hello=hello_to_pb(h)).SerializeToString()
        self.bytes_total += len(data)
        got = pb.AgentMessage.FromString(data).hello
        self._enc[h.node] = SeriesEncoder()
        self._dec[h.node] = SeriesDecoder(read_families=self._read)
        self._hello(hello_from_pb(got))

    def deliver(self, b: NodeBatch) -> None:
        data = pb.AgentMessage(batch=self._enc[b.node].encode(b)).SerializeToString()
        self.bytes_total += len(data)
        m = pb.AgentMessage.FromString(data).batch
        if m.seq <= self._last_seq.get(b.node, 0):
            self.duplicates_total += 1  # the servicer drops (and acks) a replayed seq the same way
            return
        self._last_seq[b.node] = m.seq
        self.batches_total += 1
        self._ingest(self._dec[b.node].decode(m, b.node))
