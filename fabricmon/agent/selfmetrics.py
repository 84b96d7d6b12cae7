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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

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
        for name, kind, help_, labels, samples in self.rows():
            fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_, labels=list(labels))
            for values, value in samples:
                fam.add_metric(list(values), value)
            yield fam

    def rows(self) -> Iterator[tuple[str, str, str, tuple[str, ...], list[tuple[tuple[str, ...], float]]]]:
        """Each family as (name, kind, help, label names, [(label values, value)]): what ``collect``
        and ``SelfExposition`` both write."""
        node = self._node
        if self._stream is not None:
            # Imported only with a stream configured: they bring gRPC and protobuf, which an agent
            # that only exports never loads (its memory).
            from .ras_query import QUERY_OUTCOMES
            from .stream import AGGREGATOR_DROP_REASONS, BATCH_DROP_REASONS, REFUSAL_REASONS
            from .wire_guard import ITEM_REASONS

            s = self._stream()
            for key, name, kind, help_ in _STREAM_SCALARS:
                yield name, kind, help_, _NODE, [((node,), float(s.get(key, 0)))]
            for name, help_, key, reasons in (
                ("fabricmon_stream_batches_dropped", "Batches (or the snapshots they come from) lost, by reason.",
                 "batches_dropped", BATCH_DROP_REASONS),
                ("fabricmon_stream_batches_dropped_by_aggregator",
                 "Batches the aggregator acknowledged but did not believe, by the reason its ack gave: the node's "
                 "clock (ts_ahead, ts_behind, ts_stale) or seq (seq_ahead).", "aggregator_dropped",
                 AGGREGATOR_DROP_REASONS),
                ("fabricmon_stream_refused", "Connections the aggregator refused: no or wrong credential "
                 "(unauthenticated), a credential naming another node (permission_denied).", "refused",
                 tuple(REFUSAL_REASONS.values())),
                ("fabricmon_stream_items_dropped", "Items left out of a batch because the wire cannot carry them, "
                 "by kind.", "items_dropped", ITEM_REASONS),
            ):
                counts = s.get(key, {})
                yield name, "counter", help_, _NODE_REASON, [((node, r), float(counts.get(r, 0))) for r in reasons]
            ras = s.get("nccl_ras", {})
            outcomes = ras.get("outcomes", {})
            yield ("fabricmon_agent_nccl_ras_queries", "counter",
                   "NCCL RAS queries the aggregator asked this agent to run, by outcome: ok, refused, unreachable, "
                   "timeout, old_protocol (NCCL < 2.28.7, no JSON), bad_reply, bad_json, too_large, not_local, "
                   "bad_address, busy, bad_query.", ("node", "outcome"),
                   [((node, o), float(outcomes.get(o, 0))) for o in QUERY_OUTCOMES])
            yield ("fabricmon_agent_nccl_ras_query_seconds", "counter",
                   "Seconds spent in NCCL RAS queries (on their own thread, off the poll loop).", _NODE,
                   [((node,), float(ras.get("seconds_total", 0.0)))])
        if self._threads is not None:
            st = self._threads()
            names = sorted(st)
            yield ("fabricmon_agent_thread_up", "gauge", "1 while the agent thread runs.", _NODE_THREAD,
                   [((node, n), float(st[n][0])) for n in names])
            yield ("fabricmon_agent_thread_restarts", "counter", "Times the supervisor restarted a dead agent thread.",
                   _NODE_THREAD, [((node, n), float(st[n][1])) for n in names])
        lw = self._link_watch() if self._link_watch is not None else {}
        if lw:  # only while the watch runs: a disabled watch has no series rather than zeros
            for key, name, kind, help_ in _LINK_WATCH:
                yield name, kind, help_, _NODE, [((node,), float(lw.get(key, 0)))]


_NODE = ("node",)
_NODE_REASON = ("node", "reason")
_NODE_THREAD = ("node", "thread")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class SelfExposition:
    """The collector's text exposition, the same bytes as prometheus_client's ``generate_latest``
    (a test holds them equal) at a fraction of its cost: read at each scrape (a count shows once
    its event happened), so each family's HELP/TYPE lines and each series' ``name{labels} `` are
    made once and a scrape only formats the values."""

    _MAX_PREFIXES = 4096  # series are fixed sets (reasons, threads): a bound against a leak, not a limit

    def __init__(self, collector: AgentSelfCollector) -> None:
        self._collector = collector
        self._heads: dict[str, str] = {}
        self._prefixes: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = {}

    def __call__(self) -> bytes:
        out: list[str] = []
        heads, prefixes = self._heads, self._prefixes
        if len(prefixes) > self._MAX_PREFIXES:
            prefixes.clear()
        for name, kind, help_, labels, samples in self._collector.rows():
            sample_name = name + "_total" if kind == "counter" else name
            head = heads.get(sample_name)
            if head is None:
                doc = help_.replace("\\", r"\\").replace("\n", r"\n")
                head = heads[sample_name] = f"# HELP {sample_name} {doc}\n# TYPE {sample_name} {kind}\n"
            out.append(head)
            for values, value in samples:
                key = (sample_name, labels, values)
                prefix = prefixes.get(key)
                if prefix is None:
                    pairs = sorted(zip(labels, values, strict=True))
                    prefix = prefixes[key] = (sample_name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
                                              + "} ")
                out.append(prefix + floatToGoString(value) + "\n")
        return "".join(out).encode("utf-8")


def self_exposition(collector: AgentSelfCollector) -> Callable[[], bytes]:
    return SelfExposition(collector)
