"""The aggregator's Subscription: which families it reads, so an agent sends only those.

Most of what a node measures every second (traffic bytes and packets, NVLink
throughput, per-counter hardware statistics) is for dashboards, which Prometheus
scrapes from the agent's own ``/metrics``; the aggregator's detectors read a
dozen families.  Sending the rest over the stream costs the wire, the
aggregator's protobuf parse and its decode on every batch of every node, so the
aggregator names what it reads right after the hello and the agent leaves the
rest out (``filter_batch``).

A delta flagged saturated or reset is always kept: the engine reads a reset of
any family (a device reset starts every counter again).  An aggregator that
sends no Subscription (an older one) gets everything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..batch import NodeBatch
from . import fabricmon_pb2 as pb

# An agent must not let a peer make it hold or compare against an unbounded list.
MAX_FAMILIES = 256
MAX_NAME = 200


class BadSubscription(ValueError):
    """A Subscription an agent refuses (it then keeps sending everything)."""


@dataclass(frozen=True)
class Subscription:
    delta_families: frozenset[str]
    gauge_families: frozenset[str]

    def to_pb(self) -> pb.AggregatorMessage:
        return pb.AggregatorMessage(subscription=pb.Subscription(
            delta_families=sorted(self.delta_families), gauge_families=sorted(self.gauge_families)))


def subscription_from_pb(m: pb.Subscription) -> Subscription:
    """Validated: bounded in count and name length, every name non-empty."""
    out = []
    for what, names in (("delta_families", m.delta_families), ("gauge_families", m.gauge_families)):
        if len(names) > MAX_FAMILIES:
            raise BadSubscription(f"subscription.{what}: {len(names)} names, at most {MAX_FAMILIES}")
        for n in names:
            if not n or len(n) > MAX_NAME:
                raise BadSubscription(f"subscription.{what}: a name must have 1 to {MAX_NAME} characters")
        out.append(frozenset(names))
    return Subscription(out[0], out[1])


def filter_batch(b: NodeBatch, sub: Subscription) -> tuple[NodeBatch, int]:
    """``b`` without the deltas and gauges ``sub`` does not read; and how many were left out."""
    read_d, read_g = sub.delta_families, sub.gauge_families
    deltas = tuple(d for d in b.deltas if d.family in read_d or d.saturated or d.reset)
    gauges = tuple(g for g in b.gauges if g.family in read_g)
    left_out = len(b.deltas) - len(deltas) + len(b.gauges) - len(gauges)
    if not left_out:
        return b, 0
    return replace(b, deltas=deltas, gauges=gauges), left_out
