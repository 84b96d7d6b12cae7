"""What the stream puts on the wire: the connection hello, and one batch per poll.

Every batch gets an increasing ``seq`` (starting above the wall clock in
milliseconds and above anything in the spool, so it keeps increasing across
agent restarts; the aggregator's first ack after the hello raises it further if
needed).

Gauges are sent only when they changed since the previous batch of the same run
(a connection's live run, or a disconnected spool run); the first batch of each
run carries all.  Items the wire cannot carry are removed (and counted) by the
``WireGuard`` before encoding.  Once an aggregator has sent its Subscription,
deltas and gauges of families it does not read are left out (live and spooled
alike: the node's own ``/metrics`` still has them).  Spooled batches are *self-contained*: they
define their own series inline, so they can be replayed verbatim on any later
connection.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from .. import __version__
from ..batch import NicHello, NodeBatch, NodeHello
from ..metrics import SELF_SPECS, SPECS
from ..model import Sample, Snapshot
from ..proto.codec import encode_self_contained
from ..proto.subscription import Subscription, filter_batch
from ..rank_timing import JobLayout, RankTiming
from ..sources.host import read_boot_time
from .wire_guard import WireGuard

log = structlog.get_logger("fabricmon.stream")


def _kind(family: str) -> str:
    spec = SPECS.get(family) or SELF_SPECS.get(family)
    if spec is not None:
        return spec.kind
    return "counter" if family.endswith("_total") else "gauge"


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


_IS_COUNTER: dict[str, bool] = {}


def changed_gauges(samples, base: dict | None) -> tuple[list[Sample], dict]:
    """The stream's gauge rule: all gauges when ``base`` is None (first batch of a run), then only
    those whose value changed or that (re)appeared.  Returns (gauges to send, the new base).

    Runs over every sample of every poll, so it is kept cheap: the family's kind is looked up once,
    and the counter tracker hands back the same Sample object while a value is unchanged, so an
    identity check settles most series.
    """
    new: dict = {}
    out: list[Sample] = []
    is_counter = _IS_COUNTER
    for s in samples:
        fam = s.family
        c = is_counter.get(fam)
        if c is None:
            c = is_counter[fam] = _kind(fam) == "counter"
        if c:
            continue  # totals are not streamed: deltas are
        key = (fam, s.labels)
        new[key] = s
        if base is None:
            out.append(s)
            continue
        old = base.get(key)
        if old is None or (old is not s and not _same(old.value, s.value)):
            out.append(s)
    return out, new  # series that vanished are forgotten: sent again if they return


def hello_from_snapshot(node: str, snap: Snapshot | None, interval_seconds: float,
                        agent_version: str = __version__, boot_id: str | None = None,
                        boot_time: float | None = None) -> NodeHello:
    """Build the connection hello from the latest snapshot's inventory and facts."""
    nics: list[NicHello] = []
    gpus = 0
    if snap is not None:
        inv = snap.facts.get("inventory")
        ports_facts = snap.facts.get("ports") or {}
        guids = {d.name: d.node_guid for d in getattr(inv, "devices", ()) or ()}
        for p in getattr(inv, "ports", ()) or ():
            f = ports_facts.get(f"{p.device}/{p.port}") or {}
            gpu = f.get("gpu")
            nics.append(NicHello(
                device=p.device, port=p.port, rail=p.rail, link_layer=p.link_layer or (f.get("link_layer") or ""),
                netdev=p.netdev, rate_gbps=float(f.get("rate_gbps") or 0.0), width=int(f.get("width") or 0),
                gpu=int(gpu) if isinstance(gpu, int) else -1, node_guid=guids.get(p.device, "")))
        gpus = len(snap.facts.get("gpus") or {})
    if boot_id is None:
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot_id = ""
    if boot_time is None:
        boot_time = read_boot_time()
    return NodeHello(node=node, agent_version=agent_version, interval_seconds=interval_seconds,
                     nics=tuple(nics), gpus=gpus, boot_id=boot_id, boot_time=boot_time)


class BatchMaker:
    """Snapshots of one node as ``NodeBatch``es: seq, gauge rule, rank timings, wire guard.

    Used only from the stream thread.  ``counters`` is the client's counter dict
    (``batches_unencodable_total`` is counted here) so that its stats stay one dict.
    """

    def __init__(self, node: str, intake: Any, first_seq: int, counters: dict[str, int]) -> None:
        self.node = node
        self.intake = intake
        self.next_seq = first_seq
        self.gauge_base: dict | None = None
        self.guard = WireGuard()
        # the families the last aggregator said it reads (proto/subscription.py); None: send all
        self.subscription: Subscription | None = None
        self._c = counters

    def new_run(self) -> None:
        """The next batch starts a run: it carries every gauge."""
        self.gauge_base = None

    def _changed_gauges(self, samples) -> list[Sample]:
        out, self.gauge_base = changed_gauges(samples, self.gauge_base)
        return out

    def _drain_intake(self) -> tuple[list[RankTiming], list[JobLayout]]:
        if self.intake is None:
            return [], []
        try:
            ranks, layouts = self.intake.drain()
            return list(ranks), list(layouts)
        except Exception as exc:
            log.error("intake_drain_failed", error=str(exc))
            return [], []

    def _drain_heartbeats(self) -> list:
        drain = getattr(self.intake, "drain_heartbeats", None)
        if drain is None:
            return []
        try:
            return list(drain())
        except Exception as exc:
            log.error("intake_drain_failed", error=str(exc))
            return []

    def convert(self, snap: Snapshot) -> NodeBatch:
        """The snapshot as the next batch, without any item the wire cannot carry (counted)."""
        ranks, layouts = self._drain_intake()
        heartbeats = self._drain_heartbeats()
        gauges = self._changed_gauges(snap.samples)
        seq = self.next_seq
        self.next_seq += 1
        b = NodeBatch(node=self.node, seq=seq, ts=snap.ts, interval_seconds=snap.interval_seconds,
                      deltas=tuple(snap.deltas), gauges=tuple(gauges), ranks=tuple(ranks), layouts=tuple(layouts),
                      heartbeats=tuple(heartbeats))
        sub = self.subscription
        if sub is not None:
            b, left_out = filter_batch(b, sub)
            self._c["items_unsubscribed_total"] += left_out
        return self.guard.clean(b)

    def with_known_layouts(self, b: NodeBatch) -> NodeBatch:
        """``b`` carrying every job layout the intake knows: a new connection's aggregator
        may have forgotten them, and layouts are sent only when they change."""
        if self.intake is None or not hasattr(self.intake, "layouts"):
            return b
        try:
            known = {lay.job: lay for lay in self.intake.layouts()}
            known.update({lay.job: lay for lay in b.layouts})
            return self.guard.clean(replace(b, layouts=tuple(known.values())))
        except Exception as exc:
            log.error("intake_layouts_failed", error=str(exc))
            return b

    def self_contained(self, b: NodeBatch) -> bytes | None:
        """Serialized self-contained batch; None (counted) in the unforeseen case it cannot be encoded.

        Should the guard have missed something, the batch is tried again without its rank
        timings and layouts (counted as dropped items) so the poll's deltas still go out."""
        try:
            return encode_self_contained(b).SerializeToString()
        except Exception as exc:
            log.error("stream_batch_unencodable", seq=b.seq, error=f"{type(exc).__name__}: {exc}")
        if b.ranks or b.layouts or b.heartbeats:
            self.guard.dropped["rank"] += len(b.ranks)
            self.guard.dropped["layout"] += len(b.layouts)
            self.guard.dropped["heartbeat"] += len(b.heartbeats)
            try:
                return encode_self_contained(replace(b, ranks=(), layouts=(), heartbeats=())).SerializeToString()
            except Exception as exc:
                log.error("stream_batch_unencodable", seq=b.seq, error=f"{type(exc).__name__}: {exc}")
        self._c["batches_unencodable_total"] += 1
        return None
