"""Ingest and admission: one agent batch judged (duplicate, time out of bounds, not this shard's),
counted, and handed to the stages that read it.

Deltas and gauges go to ``ingest.Ingest`` (typed events and state on the registry's components),
rank layouts and timings to the straggler tracker (and the cost of a job's steps), heartbeats to the
hang tracker.  What is dropped is counted by reason (fabricmon_ingest_batches_dropped_total) and
logged once per node and reason; the time bounds are the cluster clock's (admission.py).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from ..batch import NodeBatch
from .cost import IncidentCost
from .engine_state import EngineState, Stage
from .hangs import HeartbeatTracker
from .ingest import Ingest
from .stragglers import StragglerTracker

_log = structlog.get_logger("fabricmon.aggregator.engine")


class AdmissionStage(Stage):
    def __init__(self, state: EngineState, ingest_stage: Ingest, stragglers: StragglerTracker,
                 heartbeats: HeartbeatTracker, cost: IncidentCost, note_unknown: Callable[[str], None]) -> None:
        super().__init__(state)
        self.ingest_stage = ingest_stage
        self.stragglers = stragglers
        self.heartbeats = heartbeats
        self.cost = cost
        self._note_unknown = note_unknown  # the node registry's: an unknown node is warned about once
        # self-instrumentation (read by http_api)
        self.samples_total = 0
        self.batches_total = 0
        self.batches_dropped_total = 0
        self.dropped_by_reason: dict[str, int] = {}
        self.rank_timings_dropped: dict[str, int] = {}
        self._drop_logged: set[tuple[str, str]] = set()

    @property
    def newest_ts(self) -> float:
        """The cluster clock: the sample time ``tick`` should run at (0.0 before any batch in
        sample mode).  One node cannot move it: see admission.py."""
        with self.lock:
            return self.cluster_clock.now()

    def _drop(self, reason: str, batch: NodeBatch) -> bool:
        self.batches_dropped_total += 1
        n = self.dropped_by_reason.get(reason, 0)
        self.dropped_by_reason[reason] = n + 1
        if reason != "duplicate" and (batch.node, reason) not in self._drop_logged:
            # once per node and reason: a node with a broken clock would otherwise log every second
            self._drop_logged.add((batch.node, reason))
            _log.warning("batch_rejected", node=batch.node, reason=reason, ts=batch.ts,
                         cluster_clock=self.cluster_clock.now(), metric="fabricmon_ingest_batches_dropped_total")
        return False

    def admission_snapshot(self) -> dict[str, int]:
        """Batches dropped before detection, by reason."""
        with self.lock:
            return dict(self.dropped_by_reason)

    def rank_admission_snapshot(self) -> dict[str, int]:
        """Rank timings dropped before straggler scoring (time out of bounds), by reason."""
        with self.lock:
            return dict(self.rank_timings_dropped)

    def ingest(self, batch: NodeBatch) -> bool:
        """Apply one batch; False when it was dropped (duplicate, time out of bounds, or not ours)."""
        with self.lock:
            self.state.inputs += 1  # judged, dropped or not: the clock and the counters move (tick_gate.py)
            ns = self.nodes.get(batch.node)
            if ns is None:
                if not self.registry.owned(batch.node):
                    return False
                self._note_unknown(batch.node)
                ns = self.registry.node(batch.node)
            ts = batch.ts
            if batch.seq <= ns.last_seq and ts <= ns.last_ts:
                return self._drop("duplicate", batch)
            reason = self.cluster_clock.admit(batch.node, ts)
            if reason is not None:
                return self._drop(reason, batch)
            ns.last_seq = batch.seq
            if ts > ns.last_ts:
                ns.last_ts = ts
            ns.last_heard = max(ns.last_heard, self.cluster_clock.receipt(ts))
            ns.ever_seen = True
            if batch.interval_seconds > 0:
                # A batch's interval is the time since the node's previous poll.  An off-cadence poll (the
                # agent's link watch) is shorter than the cadence the hello announced, and must not shrink
                # the windows, the lateness bound or the agents-down silence; a poll that fell behind
                # (slow sources) is longer, and does widen them.
                ns.interval = max(batch.interval_seconds, ns.announced_interval)
            self.batches_total += 1
            self.samples_total += len(batch.deltas) + batch.unread_deltas + len(batch.gauges) + len(batch.ranks)
            if batch.deltas:
                self.ingest_stage.deltas(ns, batch)
            if batch.gauges:
                self.ingest_stage.gauges(ns, batch)
            if self.switch_side.carries(batch):
                self.switch_side.ingest(batch)
            if batch.layouts:
                for lay in batch.layouts:
                    self.stragglers.layout(lay)
            if batch.heartbeats:
                judge_hb = self.cluster_clock.judge
                for hb in batch.heartbeats:
                    if judge_hb(hb.ts) is None:  # bounded like rank timings: a future one would pin a job
                        self.heartbeats.add(hb, batch.node)
            if batch.ranks:
                add = self.stragglers.add
                judge = self.cluster_clock.judge
                for rt in batch.ranks:
                    # a job's own timestamps are bounded like the node's: one from the future would
                    # keep its job alive for good
                    why = judge(rt.ts)
                    if why is None:
                        why = add(rt, batch.node)  # the tracker's own refusals (step range) count here too
                    if why is None:
                        self.cost.record(f"{rt.job}\x00{rt.job_id}" if rt.job_id else rt.job, rt.job, rt.job_id,
                                         rt.step, rt.ts, rt.step_seconds, rt.comm_seconds)
                    else:
                        self.rank_timings_dropped[why] = self.rank_timings_dropped.get(why, 0) + 1
            return True
