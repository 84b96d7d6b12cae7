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

from .stream import AGGREGATOR_DROP_REASONS, BATCH_DROP_REASONS, REFUSAL_REASONS
from .wire_guard import ITEM_REASONS

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


class AgentSelfCollector:
    """Collects delivery (when a stream is configured) and thread-supervision metrics."""

    def __init__(self, node: str, stream_stats: Callable[[], dict[str, Any]] | None,
                 thread_stats: Callable[[], dict[str, tuple[int, int]]] | None) -> None:
        self._node = node
        self._stream = stream_stats
        self._threads = thread_stats

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        node = self._node
        if self._stream is not None:
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


def self_exposition(collector: AgentSelfCollector) -> Callable[[], bytes]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return lambda: generate_latest(registry)
