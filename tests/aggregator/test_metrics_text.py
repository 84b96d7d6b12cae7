"""The aggregator's /metrics body (metrics_text.render) is generate_latest's, byte for byte."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)

from fabricmon.aggregator.http_api import HttpApi
from fabricmon.aggregator.metrics_text import render
from support.enginerig import Cluster, flaky


class _Every:
    """One family of every kind, with what the text format escapes or spells specially."""

    def collect(self):
        g = GaugeMetricFamily("fm_gauge", 'help with \\ and\nnewline and "quotes"', labels=["node", "odd-name"])
        g.add_metric(["node-000", 'a "quoted"\\ value\nwith a newline'], 1.5)
        g.add_metric(["node-001", ""], math.nan)
        g.add_metric(["node-002", "x"], math.inf, timestamp=1_764_000_000.25)
        g.add_metric(["node-003", "y"], -math.inf)
        g.add_metric(["node-004", "z"], 123456789.0)
        yield g
        yield GaugeMetricFamily("fm_plain", "no labels", value=0.0)
        c = CounterMetricFamily("fm_things", "counted", labels=["kind"], created=1_700_000_000.0)
        c.add_metric(["a"], 3.0, created=1_700_000_001.0)
        yield c
        yield InfoMetricFamily("fm_build", "build", value={"version": "0.2.0", "cluster": "c\u00e9"})
        yield StateSetMetricFamily("fm_state", "state", value={"up": True, "down": False})
        yield HistogramMetricFamily("fm_hist", "hist", buckets=[("1.0", 2.0), ("+Inf", 3.0)], sum_value=4.0)
        yield GaugeHistogramMetricFamily("fm_ghist", "ghist", buckets=[("1.0", 2.0), ("+Inf", 3.0)], gsum_value=5.0)
        yield SummaryMetricFamily("fm_sum", "summary", count_value=2, sum_value=1.0)
        yield UnknownMetricFamily("fm_unknown", "unknown", value=7.0)


def test_every_family_kind_and_escape_renders_as_generate_latest():
    reg = CollectorRegistry()
    reg.register(_Every())
    assert render(reg) == generate_latest(reg)
    assert render(reg) == generate_latest(reg)  # again, with every name remembered


class _Frozen:
    """One collection of a registry, rendered as often as asked: the process collector's CPU and memory
    move between two collections."""

    def __init__(self, registry) -> None:
        self.metrics = list(registry.collect())

    def collect(self):
        return iter(self.metrics)


def test_a_real_aggregators_exposition_renders_as_generate_latest():
    c = Cluster(nodes=16)
    node = next(iter(c.feeds))
    c.run(40, inject=flaky(node, "mlx5_0"))  # incidents open: their series are in the exposition too
    api = HttpApi(c.engine, ("127.0.0.1", 0))  # not started: only its registry is read
    frozen = _Frozen(api.registry)
    body = generate_latest(frozen)
    assert body.count(b"\n") > 300 and b'alertname="' in body
    assert render(frozen) == body
