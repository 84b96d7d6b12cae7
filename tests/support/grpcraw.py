"""A raw gRPC stream to the aggregator, message by message: what a hostile or broken peer can send."""

from __future__ import annotations

import grpc

from fabricmon.proto import fabricmon_pb2 as pb


def raw_stream(target: str, messages, metadata=(), credentials=None, timeout: float = 10.0,
               subscriptions: bool = False):
    """Send messages on one stream; return (responses, final status code).  The aggregator's
    Subscription (sent before the hello's ack) is left out unless ``subscriptions``."""
    ch = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with ch:
        rpc = ch.stream_stream("/fabricmon.v1.FabricStream/Stream",
                               request_serializer=pb.AgentMessage.SerializeToString,
                               response_deserializer=pb.AggregatorMessage.FromString)
        out = []
        try:
            for m in rpc(iter(messages), metadata=list(metadata), timeout=timeout):
                if subscriptions or m.WhichOneof("msg") != "subscription":
                    out.append(m)
            return out, grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return out, exc.code()
