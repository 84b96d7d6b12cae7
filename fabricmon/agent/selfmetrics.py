"""The agent's own delivery and thread metrics, beside the snapshot's on /metrics.

A prometheus_client custom collector over ``StreamClient.stats()`` and
``Supervisor.stats()``: both are plain counters read at scrape time (no I/O, no
NVML).  Drop reasons are fixed sets (``stream.BATCH_DROP_REASONS``,
``wire_guard.ITEM_REASONS``): every reason is exported, zero or not, so a rate()
over one never starts from a missing series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# (stats key, family name without the _total suffix for counters, kind, help)
_STREAM_SCALARS = (
    ("connected", "fabricmon_stream_connected", "gauge", "1 while the stream to the aggregator is established."),
    ("disconnected_seconds", "fabricmon_stream_disconnected_seconds", "gauge",
     "Seconds since the stream to the aggregator was lost (since the agent started if it never connected); 0 while "
     "connected."),
    ("interval_seconds", "fabricmon_stream_interval_seconds", "gauge", "Poll interval: a batch is due this often."),
    ("batches_sent_total", "fabricmon_stream_batches_sent", "counter",
     "Batches sent to the aggregator (live and replayed)."),
    ("batches_replayed_total", "fabricmon_stream_batches_replayed", "counter",
     "Spooled batches sent after a reconnect."),
    ("batches_acked_total", "fabricmon_stream_batches_acked", "counter", "Batches the aggregator acknowledged."),
    ("batches_spooled_total", "fabricmon_stream_batches_spooled", "counter",
     "Batches written to the spool while the aggregator was unreachable."),
    ("spool_write_failures_total", "fabricmon_stream_spool_write_failures", "counter",
     "Spool writes that failed (ENOSPC, EIO): each is a batch lost."),
    ("spool_set_aside_total", "fabricmon_stream_spool_set_aside", "counter",
     "Spool entries named outside the seq range (past 2^64, or ahead of the clock): renamed set-aside-*, never "
     "replayed or numbered from."),
    ("connects_total", "fabricmon_stream_connects", "counter", "Sessions established with the aggregator."),
    ("connect_failures_total", "fabricmon_stream_connect_failures", "counter",
     "Connection attempts that failed or were refused."),
    ("items_unsubscribed_total", "fabricmon_stream_items_unsubscribed", "counter",
     "Deltas and gauges not streamed because the aggregator reads no series of their family (its subscription); "
     "/metrics still exports them."),
    ("acks_refused_total", "fabricmon_stream_acks_refused", "counter",
     "Acks refused: beyond what was sent, or at the end of the seq range."),
    ("thread_restarts_total", "fabricmon_stream_session_errors", "counter",
     "Unexpected errors a stream session or spooling survived."),
    ("aggregator_dropping", "fabricmon_stream_aggregator_dropping", "gauge",
     "1 while the aggregator's newest ack says it dropped that batch (the node's clock or seq): this node is not "
     "monitored there."),
    ("spool_bytes", "fabricmon_stream_spool_bytes", "gauge", "Bytes held in the spool."),
    ("spool_max_bytes", "fabricmon_stream_spool_max_bytes", "gauge",
     "Bound of the spool in bytes (oldest dropped beyond it)."),
    ("spool_entries", "fabricmon_stream_spool_batches", "gauge", "Batches held in the spool."),
    ("queue_length", "fabricmon_stream_queue_length", "gauge", "Snapshots waiting for the stream thread."),
    ("queue_max", "fabricmon_stream_queue_max", "gauge", "Bound of the snapshot queue (oldest dropped beyond it)."),
)

# The link watch (agent/linkwatch.py): (stats key, family, kind, help).
_LINK_WATCH = (
    ("interval_seconds", "fabricmon_link_watch_interval_seconds", "gauge",
     "Seconds between link watch passes (reads of link state files only, between polls)."),
    ("passes_total", "fabricmon_link_watch_passes", "counter", "Link watch passes."),
    ("reads_total", "fabricmon_link_watch_reads", "counter", "Link state files the watch read."),
    ("read_errors_total", "fabricmon_link_watch_read_errors", "counter",
     "Link state file reads that failed or read junk (vanished, unreadable, unparsable)."),
    ("changes_total", "fabricmon_link_watch_changes", "counter", "Link state changes the watch saw between polls."),
    ("triggered_polls_total", "fabricmon_link_watch_triggered_polls", "counter",
     "Full polls run off the cadence because a link changed state."),
    ("held_total", "fabricmon_link_watch_held_requests", "counter",
     "Poll requests held back (at most one off-cadence poll between two regular polls): the next regular "
     "poll serves them."),
    ("links_watched", "fabricmon_link_watch_links_watched", "gauge", "Links whose state files the watch reads."),
    ("links_unwatched", "fabricmon_link_watch_links_unwatched", "gauge",
     "Links the watch cannot watch now (a state file unreadable or gone, the device stuck in a read): their "
     "changes wait for the next regular poll."),
)


class AgentSelfCollector:
    """Collects delivery (when a stream is configured) and thread-supervision metrics."""

    def __init__(self, node: str, stream_stats: Callable[[], dict[str, Any]] | None,
                 thread_stats: Callable[[], dict[str, tuple[int, int]]] | None,
                 link_watch_stats: Callable[[], dict[str, float]] | None = None) -> None:
        self._node = node
        self._stream = stream_stats
        self._threads = thread_stats
        self._link_watch = link_watch_stats

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        node = self._node
        if self._stream is not None:
            # Imported only with a stream configured: they bring gRPC and protobuf, which an agent
            # that only exports never loads (its memory).
            from .ras_query import QUERY_OUTCOMES
            from .stream import AGGREGATOR_DROP_REASONS, BATCH_DROP_REASONS, REFUSAL_REASONS
            from .wire_guard import ITEM_REASONS

            s = self._stream()
            for key, name, kind, help_ in _STREAM_SCALARS:
                fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_, labels=["node"])
                fam.add_metric([node], float(s.get(key, 0)))
                yield fam
            fam = CounterMetricFamily("fabricmon_stream_batches_dropped",
                                      "Batches (or the snapshots they come from) lost, by reason.",
                                      labels=["node", "reason"])
            dropped = s.get("batches_dropped", {})
            for reason in BATCH_DROP_REASONS:
                fam.add_metric([node, reason], float(dropped.get(reason, 0)))
            yield fam
            fam = CounterMetricFamily("fabricmon_stream_batches_dropped_by_aggregator",
                                      "Batches the aggregator acknowledged but did not believe, by the reason its ack "
                                      "gave: the node's clock (ts_ahead, ts_behind, ts_stale) or seq (seq_ahead).",
                                      labels=["node", "reason"])
            agg = s.get("aggregator_dropped", {})
            for reason in AGGREGATOR_DROP_REASONS:
                fam.add_metric([node, reason], float(agg.get(reason, 0)))
            yield fam
            fam = CounterMetricFamily("fabricmon_stream_refused",
                                      "Connections the aggregator refused: no or wrong credential (unauthenticated), "
                                      "a credential naming another node (permission_denied).",
                                      labels=["node", "reason"])
            refused = s.get("refused", {})
            for reason in REFUSAL_REASONS.values():
                fam.add_metric([node, reason], float(refused.get(reason, 0)))
            yield fam
            fam = CounterMetricFamily("fabricmon_stream_items_dropped",
                                      "Items left out of a batch because the wire cannot carry them, by kind.",
                                      labels=["node", "reason"])
            items = s.get("items_dropped", {})
            for reason in ITEM_REASONS:
                fam.add_metric([node, reason], float(items.get(reason, 0)))
            yield fam
            ras = s.get("nccl_ras", {})
            fam = CounterMetricFamily("fabricmon_agent_nccl_ras_queries",
                                      "NCCL RAS queries the aggregator asked this agent to run, by outcome: ok, "
                                      "refused, unreachable, timeout, old_protocol (NCCL < 2.28.7, no JSON), "
                                      "bad_reply, bad_json, too_large, not_local, bad_address, busy, bad_query.",
                                      labels=["node", "outcome"])
            outcomes = ras.get("outcomes", {})
            for outcome in QUERY_OUTCOMES:
                fam.add_metric([node, outcome], float(outcomes.get(outcome, 0)))
            yield fam
            fam = CounterMetricFamily("fabricmon_agent_nccl_ras_query_seconds",
                                      "Seconds spent in NCCL RAS queries (on their own thread, off the poll loop).",
                                      labels=["node"])
            fam.add_metric([node], float(ras.get("seconds_total", 0.0)))
            yield fam
        if self._threads is not None:
            st = self._threads()
            up = GaugeMetricFamily("fabricmon_agent_thread_up", "1 while the agent thread runs.",
                                   labels=["node", "thread"])
            rs = CounterMetricFamily("fabricmon_agent_thread_restarts",
                                     "Times the supervisor restarted a dead agent thread.", labels=["node", "thread"])
            for name in sorted(st):
                alive, restarts = st[name]
                up.add_metric([node, name], float(alive))
                rs.add_metric([node, name], float(restarts))
            yield up
            yield rs
        lw = self._link_watch() if self._link_watch is not None else {}
        if lw:  # only while the watch runs: a disabled watch has no series rather than zeros
            for key, name, kind, help_ in _LINK_WATCH:
                fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_, labels=["node"])
                fam.add_metric([node], float(lw.get(key, 0)))
                yield fam


def self_exposition(collector: AgentSelfCollector) -> Callable[[], bytes]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return lambda: generate_latest(registry)
