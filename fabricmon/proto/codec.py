"""Conversion between the wire form (``fabricmon_pb2``) and ``fabricmon.batch``.

``SeriesEncoder`` holds the agent's side of one connection's series table,
``SeriesDecoder`` the aggregator's.  A self-contained batch (spooled, replayed on
a later connection) uses ids local to itself and touches neither table.
Decoding validates everything and raises ``MalformedBatch`` with a reason;
it never trusts lengths or ids from the wire.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import compress

from ..batch import DeltaColumns, NicHello, NodeBatch, NodeHello
from ..model import CounterDelta, Labels, Sample
from ..nccl_ras.protocol import BadAddress, parse_addr
from ..rank_timing import (
    MAX_GPU,
    MAX_GROUP_VALUE,
    MAX_LOCAL_RANK,
    MAX_SECONDS,
    MAX_STEP,
    MAX_TS,
    Heartbeat,
    JobLayout,
    RankTiming,
)
from ..textcheck import ID_LABELS, id_part_problem, job_name_problem, node_name_problem
from . import fabricmon_pb2 as pb

PROTOCOL_VERSION = 1
SUPPORTED_PROTOCOLS = frozenset({1})

# Bounds on what one peer may make the aggregator hold.
MAX_SERIES_PER_CONNECTION = 500_000
MAX_LABELS = 16
MAX_NAME = 200
MAX_VALUE = 1024
# Hello bounds: what a real node can have, far above it (a NIC's rate in Gb/s, lanes, GPUs).
MAX_RATE_GBPS = 1e5
MAX_WIDTH = 64
MAX_GPUS = 1024
MAX_GUID_TEXT = 64  # "0x" and 16 hex digits, or sysfs' "b8ce:f603:00a1:b2c3": far below

SeriesKey = tuple[str, Labels]
UNSPECIFIED = pb.SERIES_KIND_UNSPECIFIED  # an agent older than SeriesDef.kind
COUNTER = pb.SERIES_KIND_COUNTER
GAUGE = pb.SERIES_KIND_GAUGE
_KINDS = frozenset({UNSPECIFIED, COUNTER, GAUGE})


class MalformedBatch(ValueError):
    """A batch or hello that does not follow the protocol; the message names the field."""


# --------------------------------------------------------------------- hello


def hello_to_pb(h: NodeHello) -> pb.Hello:
    return pb.Hello(
        node=h.node, agent_version=h.agent_version, interval_seconds=h.interval_seconds,
        nics=[pb.Nic(device=n.device, port=n.port, rail=n.rail, link_layer=n.link_layer, netdev=n.netdev,
                     rate_gbps=n.rate_gbps, width=max(0, int(n.width)), gpu=int(n.gpu), node_guid=n.node_guid)
              for n in h.nics],
        gpus=max(0, int(h.gpus)), boot_id=h.boot_id, protocol_version=PROTOCOL_VERSION,
        boot_time_seconds=h.boot_time,
    )


def hello_from_pb(m: pb.Hello) -> NodeHello:
    why = node_name_problem(m.node)
    if why is not None:
        raise MalformedBatch(f"hello.node: {why}")
    if m.protocol_version not in SUPPORTED_PROTOCOLS:
        raise MalformedBatch(f"hello.protocol_version: {m.protocol_version} not supported "
                             f"(supported: {sorted(SUPPORTED_PROTOCOLS)})")
    if not math.isfinite(m.interval_seconds) or m.interval_seconds < 0:
        raise MalformedBatch("hello.interval_seconds: must be finite and >= 0")
    if not math.isfinite(m.boot_time_seconds) or m.boot_time_seconds < 0:
        raise MalformedBatch("hello.boot_time_seconds: must be finite and >= 0")
    if m.gpus > MAX_GPUS:
        raise MalformedBatch(f"hello.gpus: {m.gpus} is over {MAX_GPUS}")
    for i, n in enumerate(m.nics):
        if not (math.isfinite(n.rate_gbps) and 0 <= n.rate_gbps <= MAX_RATE_GBPS):
            raise MalformedBatch(f"hello.nics[{i}].rate_gbps: must be finite in [0, {MAX_RATE_GBPS:g}], got "
                                 f"{n.rate_gbps!r}")
        if n.width > MAX_WIDTH or not -1 <= n.gpu <= MAX_GPU:
            raise MalformedBatch(f"hello.nics[{i}]: width {n.width} or gpu {n.gpu} out of range")
        for field, value in (("device", n.device), ("port", n.port), ("netdev", n.netdev)):
            if (why := id_part_problem(value, MAX_VALUE)) is not None:
                raise MalformedBatch(f"hello.nics[{i}].{field}: {why}")
        if len(n.node_guid) > MAX_GUID_TEXT:
            raise MalformedBatch(f"hello.nics[{i}].node_guid: {len(n.node_guid)} characters, at most {MAX_GUID_TEXT}")
    return NodeHello(
        node=m.node, agent_version=m.agent_version, interval_seconds=m.interval_seconds,
        nics=tuple(NicHello(n.device, n.port, n.rail, n.link_layer, n.netdev, n.rate_gbps, n.width, n.gpu,
                             n.node_guid) for n in m.nics),
        gpus=m.gpus, boot_id=m.boot_id, boot_time=m.boot_time_seconds,
    )


# --------------------------------------------------------------------- batch: encode


class SeriesEncoder:
    """Agent side of one connection's series table: assigns ids, defines each once."""

    def __init__(self) -> None:
        self._ids: dict[SeriesKey, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def _id(self, key: SeriesKey, out: pb.Batch, kind: pb.SeriesKind = COUNTER) -> int:
        sid = self._ids.get(key)
        if sid is None:
            sid = len(self._ids) + 1
            self._ids[key] = sid
            # add() builds the message in place (append() would copy one built apart): ~3x faster
            sd = out.new_series.add(id=sid, family=key[0], kind=kind)
            label = sd.labels.add
            for k, v in key[1]:
                label(name=k, value=v)
        return sid

    def encode(self, b: NodeBatch, *, self_contained: bool = False) -> pb.Batch:
        out = pb.Batch(seq=b.seq, ts=b.ts, interval_seconds=b.interval_seconds, self_contained=self_contained)
        # built as lists and handed to protobuf once: one C call per field, not one per delta
        get = self._ids.get
        deltas = b.deltas
        if type(deltas) is DeltaColumns:  # the simulator's: the columns as they are, no CounterDelta made
            ids = [get(key) or self._id(key, out) for key in deltas.keys]
            out.delta_ids.extend(ids)
            out.delta_values.extend(deltas.values)
            if any(deltas.saturated):
                out.saturated_ids.extend(list(compress(ids, deltas.saturated)))
            if any(deltas.reset):
                out.reset_ids.extend(list(compress(ids, deltas.reset)))
        else:
            ids = [get((d.family, d.labels)) or self._id((d.family, d.labels), out) for d in deltas]
            out.delta_ids.extend(ids)
            out.delta_values.extend([d.delta for d in deltas])
            for sid, d in zip(ids, deltas, strict=True):
                if d.saturated:
                    out.saturated_ids.append(sid)
                if d.reset:
                    out.reset_ids.append(sid)
        if b.gauges:
            gids = [get((g.family, g.labels)) or self._id((g.family, g.labels), out, GAUGE) for g in b.gauges]
            out.gauge_ids.extend(gids)
            out.gauge_values.extend([s.value for s in b.gauges])
        # Messages built in place with add() (append() copies a message built apart): the same bytes.
        add_rank = out.ranks.add
        for r in b.ranks:
            pair = add_rank(job=r.job, rank=r.rank, local_rank=r.local_rank, step=r.step, step_seconds=r.step_seconds,
                            comm_seconds=r.comm_seconds, ts=r.ts, gpu=r.gpu, job_id=r.job_id).group.add
            for k, v in r.group:
                pair(key=k, value=v)
        for lay in b.layouts:
            pair = out.layouts.add(job=lay.job).layout.add
            for k, v in lay.layout:
                pair(key=k, value=v)
        add_beat = out.heartbeats.add
        for h in b.heartbeats:
            add_beat(job=h.job, rank=h.rank, step=h.step, coll_sn=h.coll_sn, in_collective=h.in_collective, ts=h.ts,
                     job_id=h.job_id, nccl_ras=h.nccl_ras)
        return out


def encode_self_contained(b: NodeBatch) -> pb.Batch:
    """A batch that carries every series definition it uses (for the spool)."""
    return SeriesEncoder().encode(b, self_contained=True)


# --------------------------------------------------------------------- batch: decode


# Label values already found fit to be a part of a component id: every node defines the same few
# (mlx5_0, port 1, GPU 3) once per connection, so each is checked once per process, not per
# definition (4,096 nodes define about four million series on connecting).  Bounded: past the
# bound it is cleared and refills.
_ID_PARTS_OK: set[str] = set()
_ID_PARTS_OK_MAX = 65536


def _check_def(sd: pb.SeriesDef) -> SeriesKey:
    family = sd.family
    if not family or len(family) > MAX_NAME:
        raise MalformedBatch(f"new_series id {sd.id}: family must be a non-empty name of at most {MAX_NAME} characters")
    labs = sd.labels
    if len(labs) > MAX_LABELS:
        raise MalformedBatch(f"new_series id {sd.id}: more than {MAX_LABELS} labels")
    labels = []
    ok = _ID_PARTS_OK
    for lab in labs:
        name, value = lab.name, lab.value
        if not name or len(name) > MAX_NAME or len(value) > MAX_VALUE:
            raise MalformedBatch(f"new_series id {sd.id}: bad label {name[:40]!r}")
        if name in ID_LABELS and value not in ok:
            if (why := id_part_problem(value, MAX_VALUE)) is not None:
                raise MalformedBatch(f"new_series id {sd.id}: label {name}: {why}")
            if len(ok) >= _ID_PARTS_OK_MAX:
                ok.clear()
            ok.add(value)
        labels.append((name, value))
    return family, tuple(labels)


class SeriesDecoder:
    """Aggregator side of one connection's series table.

    Per series id the table keeps the key and a ready ``CounterDelta`` of zero: on a healthy
    fabric most counters do not move in an interval, and a zero delta of an unflagged series
    is then that shared immutable object, not a new one.  With ``read_families`` (what the
    consumer reads: the engine's delta families), an unflagged delta of any other family
    (traffic bytes, packets, NVLink throughput: most of what moves) is validated and counted
    in ``NodeBatch.unread_deltas`` but never built, so decode cost follows what is read.
    """

    def __init__(self, max_series: int = MAX_SERIES_PER_CONNECTION,
                 read_families: frozenset[str] | None = None,
                 admit: Callable[[SeriesKey], bool] | None = None) -> None:
        self._table: dict[int, SeriesKey] = {}
        self._gauge_ids: set[int] = set()  # series the agent defined as GAUGE: never a delta
        self._counter_ids: set[int] = set()  # series the agent defined as COUNTER: never a gauge value
        self._zero: dict[int, CounterDelta] = {}
        self._read_ids: set[int] = set()
        self._refused: set[int] = set()
        self._read = read_families
        self._max = max_series
        # ``admit``: asked once per series definition (aggregator.name_bounds); a refused series
        # stays in the table (its id is valid) but its values are never built, counted in
        # ``refused_values``.
        self._admit = admit
        self.refused_values = 0

    def __len__(self) -> int:
        return len(self._table)

    def decode(self, m: pb.Batch, node: str) -> NodeBatch:
        """Validate and decode; raises MalformedBatch.  The table changes only if the batch is valid."""
        # every field read once: a protobuf attribute costs as much as a dict lookup and a call, and
        # most batches carry a few changed counters, so these fixed costs are most of a batch's cost
        seq, ts, iv, sc = m.seq, m.ts, m.interval_seconds, m.self_contained
        if seq == 0:
            raise MalformedBatch("seq: must be > 0")
        if not (math.isfinite(ts) and math.isfinite(iv)) or iv < 0:
            raise MalformedBatch("ts/interval_seconds: must be finite (interval >= 0)")
        ids = list(m.delta_ids)
        vals = list(m.delta_values)
        if len(ids) != len(vals):
            raise MalformedBatch(f"delta_ids ({len(ids)}) and delta_values ({len(vals)}) differ in length")
        g_ids = list(m.gauge_ids)
        gvals = list(m.gauge_values)
        if len(g_ids) != len(gvals):
            raise MalformedBatch(f"gauge_ids ({len(g_ids)}) and gauge_values ({len(gvals)}) differ in "
                                 f"length")
        if sc:
            table, zero, read_ids, gauge_ids, counter_ids = {}, {}, set(), set(), set()
        else:
            table, zero, read_ids = self._table, self._zero, self._read_ids
            gauge_ids, counter_ids = self._gauge_ids, self._counter_ids
        added: dict[int, SeriesKey] = {}
        added_gauges: set[int] = set()
        added_counters: set[int] = set()
        for sd in m.new_series:
            sid, kind = sd.id, sd.kind  # each read once (see above): about 1,000 definitions a node on connecting
            if sid == 0:
                raise MalformedBatch("new_series: id 0 is not allowed")
            key = _check_def(sd)
            old = table.get(sid) or added.get(sid)
            if old is not None and old != key:
                raise MalformedBatch(f"new_series id {sid}: redefined ({old[0]} -> {key[0]})")
            if kind not in _KINDS:
                raise MalformedBatch(f"new_series id {sid}: unknown kind {kind}")
            if old is not None and kind != UNSPECIFIED and (
                    (kind == GAUGE) != (sid in gauge_ids or sid in added_gauges)):
                raise MalformedBatch(f"new_series id {sid}: kind redefined ({key[0]})")
            added[sid] = key
            if kind == GAUGE:
                added_gauges.add(sid)
            elif kind == COUNTER:
                added_counters.add(sid)
        if not sc and len(table) + len(added) > self._max:
            raise MalformedBatch(f"series table over its limit of {self._max} series")
        refused = set() if sc else self._refused
        if added:
            # the table (and the zero cache) change only once the whole batch is valid
            table = {**table, **added}
            zero = {**zero, **{sid: CounterDelta(k[0], k[1], 0.0) for sid, k in added.items() if sid not in zero}}
            if self._admit is not None:
                # ids redefined identically were judged when first defined on this connection
                # (names admitted for a batch refused later stay counted: only that node's own budget)
                no = {sid for sid, k in added.items()
                      if (sc or sid not in self._table) and not self._admit(k)}
                if no:
                    refused = refused | no
            read_ids = read_ids | {sid for sid, k in added.items()
                                   if (self._read is None or k[0] in self._read) and sid not in refused}

        def look(sid: int, what: str) -> SeriesKey:
            key = table.get(sid)
            if key is None:
                raise MalformedBatch(f"{what}: unknown series id {sid}")
            return key

        # One pass in C over all values: a NaN or an infinity makes the sum non-finite, a negative the
        # minimum negative.  Only then (or on a sum that merely overflowed) is each value looked at.
        if vals and (not math.isfinite(sum(vals)) or min(vals) < 0):
            for sid, v in zip(ids, vals, strict=True):
                if not math.isfinite(v) or v < 0:
                    raise MalformedBatch(f"delta_values: series {look(sid, 'delta_ids')[0]} has a bad delta {v!r}")
        # Kinds as the agent defined them (isdisjoint runs in C: no per-delta Python on the hot path).
        if not gauge_ids.isdisjoint(ids) or not added_gauges.isdisjoint(ids):
            # a level sent as a count: its fall would read as a counter reset downstream
            bad = next(sid for sid in ids if sid in gauge_ids or sid in added_gauges)
            raise MalformedBatch(f"delta_ids: series {look(bad, 'delta_ids')[0]} is a gauge")
        if g_ids and (not counter_ids.isdisjoint(g_ids) or not added_counters.isdisjoint(g_ids)):
            bad = next(sid for sid in g_ids if sid in counter_ids or sid in added_counters)
            raise MalformedBatch(f"gauge_ids: series {look(bad, 'gauge_ids')[0]} is a counter")
        sat_ids, rst_ids = m.saturated_ids, m.reset_ids
        sat = set(sat_ids) if sat_ids else _NONE
        rst = set(rst_ids) if rst_ids else _NONE
        if sat or rst:
            delta_set = set(ids)
            for what, flagged in (("saturated_ids", sat), ("reset_ids", rst)):
                for sid in flagged:
                    if sid not in delta_set:
                        raise MalformedBatch(f"{what}: id {sid} has no delta in this batch")
        if not all(map(zero.__contains__, ids)):
            for sid in ids:
                look(sid, "delta_ids")
        flagged = sat | rst
        deltas: list[CounterDelta] = []
        append = deltas.append
        if flagged:
            for sid, v in zip(ids, vals, strict=True):
                if sid in flagged and sid not in refused:
                    fam, labels = table[sid]
                    append(CounterDelta(fam, labels, v, sid in sat, sid in rst))
                elif sid in read_ids:
                    append(CounterDelta(*table[sid], v) if v else zero[sid])
        else:
            # the unread majority is filtered out in C (compress/map), never touched in Python
            for sid, v in compress(zip(ids, vals, strict=True), map(read_ids.__contains__, ids)):
                append(CounterDelta(*table[sid], v) if v else zero[sid])
        n_refused = sum(1 for sid in ids if sid in refused) if refused else 0  # neither read nor "unread"
        skipped = len(ids) - len(deltas) - n_refused
        gauges = []
        # the same one C pass as for deltas: a NaN or an infinity makes the sum non-finite
        if gvals and not math.isfinite(sum(gvals)):
            for sid, v in zip(g_ids, gvals, strict=True):
                if not math.isfinite(v):
                    raise MalformedBatch(f"gauge_values: series {look(sid, 'gauge_ids')[0]} has a non-finite value "
                                         f"{v!r}")
        get = table.get
        for sid, v in zip(g_ids, gvals, strict=True):
            gkey = get(sid)
            if gkey is None:
                gkey = look(sid, "gauge_ids")  # raises, naming the id
            if refused and sid in refused:
                n_refused += 1
                continue
            gauges.append(Sample(gkey[0], gkey[1], v))
        ranks = _ranks(m.ranks, node) if m.ranks else ()
        layouts = _layouts(m.layouts) if m.layouts else ()
        heartbeats = _heartbeats(m.heartbeats, node) if m.heartbeats else ()
        if not sc and added:
            self._table, self._zero, self._read_ids, self._refused = table, zero, read_ids, refused
            if added_gauges:
                self._gauge_ids = gauge_ids | added_gauges
            if added_counters:
                self._counter_ids = counter_ids | added_counters
        self.refused_values += n_refused
        return NodeBatch(node, seq, ts, iv, tuple(deltas), tuple(gauges), ranks, layouts, skipped, heartbeats)


_NONE: frozenset[int] = frozenset()
# Job names (and job ids) already found fit, as _ID_PARTS_OK: a node's ranks repeat the same few every
# batch, so each is checked once per process, not per rank timing.
_JOB_NAMES_OK: set[str] = set()


def _job_name_problem(value: str) -> str | None:
    if value in _JOB_NAMES_OK:
        return None
    why = job_name_problem(value)
    if why is None:
        if len(_JOB_NAMES_OK) >= _ID_PARTS_OK_MAX:
            _JOB_NAMES_OK.clear()
        _JOB_NAMES_OK.add(value)
    return why


def _ranks(wire: Iterable[pb.RankTiming], node: str) -> tuple[RankTiming, ...]:
    out: list[RankTiming] = []
    append = out.append
    names_ok = _JOB_NAMES_OK  # the names already found fit: no call for them
    for r in wire:
        # each field read once (see decode)
        job, job_id, step_s, comm_s, ts = r.job, r.job_id, r.step_seconds, r.comm_seconds, r.ts
        step, local_rank, gpu, rank = r.step, r.local_rank, r.gpu, r.rank
        if job not in names_ok and (why := _job_name_problem(job)) is not None:
            raise MalformedBatch(f"ranks.job: {why}")
        # one chain decides the usual case: a NaN fails every comparison, an infinity the bound
        if not (0 <= step_s <= MAX_SECONDS and 0 <= comm_s <= MAX_SECONDS and 0 <= ts <= MAX_TS):
            if not (math.isfinite(step_s) and math.isfinite(comm_s) and math.isfinite(ts)):
                raise MalformedBatch(f"ranks: job {job} rank {rank}: non-finite time")
            raise MalformedBatch(f"ranks: job {job} rank {rank}: a time out of range (seconds in "
                                 f"[0, {MAX_SECONDS:g}], ts in [0, {MAX_TS:g}])")
        if step > MAX_STEP or local_rank > MAX_LOCAL_RANK or not -1 <= gpu <= MAX_GPU:
            raise MalformedBatch(f"ranks: job {job} rank {rank}: step, local_rank or gpu out of range")
        pairs = r.group
        group: tuple[tuple[str, int], ...] = ()
        if pairs:
            group = tuple([(p.key, p.value) for p in pairs])  # the wire's pairs read once
            values = [v for _, v in group]
            if not (0 <= min(values) and max(values) <= MAX_GROUP_VALUE):
                raise MalformedBatch(f"ranks: job {job} rank {rank}: a group value out of range")
        if job_id and job_id not in names_ok and (why := _job_name_problem(job_id)) is not None:
            raise MalformedBatch(f"ranks.job_id: {why}")
        append(RankTiming(job, rank, local_rank, step, step_s, comm_s, ts, node, gpu, group, job_id))
    return tuple(out)


def _layouts(wire: Iterable[pb.JobLayout]) -> tuple[JobLayout, ...]:
    out = []
    for lay in wire:
        why = _job_name_problem(lay.job)
        if why is not None:
            raise MalformedBatch(f"layouts.job: {why}")
        if any(not 1 <= p.value <= MAX_GROUP_VALUE for p in lay.layout):
            raise MalformedBatch(f"layouts: job {lay.job}: a layout value out of range")
        out.append(JobLayout(lay.job, tuple((p.key, p.value) for p in lay.layout)))
    return tuple(out)


def _heartbeats(wire: Iterable[pb.Heartbeat], node: str) -> tuple[Heartbeat, ...]:
    out = []
    for h in wire:
        why = _job_name_problem(h.job) or (_job_name_problem(h.job_id) if h.job_id else None)
        if why is not None:
            raise MalformedBatch(f"heartbeats.job: {why}")
        if not math.isfinite(h.ts) or not 0 <= h.ts <= MAX_TS or h.step > MAX_STEP or h.coll_sn > MAX_STEP:
            raise MalformedBatch(f"heartbeats: job {h.job} rank {h.rank}: ts, step or coll_sn out of range")
        if h.nccl_ras:
            try:
                parse_addr(h.nccl_ras)
            except BadAddress as exc:
                raise MalformedBatch(f"heartbeats: job {h.job} rank {h.rank}: nccl_ras: {exc}") from None
        out.append(Heartbeat(h.job, h.rank, h.step, h.coll_sn, h.in_collective, h.ts, node, h.job_id, h.nccl_ras))
    return tuple(out)


# --------------------------------------------------------------------- framing helpers


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def agent_message_from_batch_bytes(batch_bytes: bytes) -> bytes:
    """Serialized ``AgentMessage{batch: <batch_bytes>}`` without re-parsing the batch.

    Field 2 (``batch``), wire type 2 (length-delimited): tag byte 0x12.
    """
    return b"\x12" + _varint(len(batch_bytes)) + batch_bytes
