"""What /metrics keeps between scrapes (the topology's info families, metrics_text.freeze) is rendered
again when what it shows changes, and the body stays generate_latest's byte for byte."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from fabricmon.aggregator import topology_reload
from fabricmon.aggregator.http_api import HttpApi
from fabricmon.aggregator.metrics_text import freeze, render
from fabricmon.topology import generate_topology
from support.enginerig import Cluster


def _port_lines(body: bytes) -> list[str]:
    return [line for line in body.decode().splitlines() if line.startswith("fabricmon_topology_port_info{")]


def _api(c: Cluster) -> HttpApi:
    return HttpApi(c.engine, ("127.0.0.1", 0))  # not started: only its registry is read


def test_the_topology_series_are_derived_once_per_version():
    c = Cluster(nodes=4)
    views = c.engine.views
    first = views.topology_series()
    assert views.topology_series() is first  # kept: nothing changed
    topo = c.engine.topology
    topo.index.add(topo.nodes[next(iter(topo.nodes))])  # a hello's binding
    assert views.topology_series() is not first
    assert views.topology_series() == first  # derived again, the same NICs


def test_a_binding_that_renames_a_leaf_changes_the_cached_body():
    c = Cluster(nodes=4)
    api = _api(c)
    before = render(api.registry)
    assert _port_lines(render(api.registry)) == _port_lines(before)  # rendered from the kept families
    topo = c.engine.topology
    name = next(iter(topo.nodes))
    spec = topo.nodes[name]
    nic = spec.nics[0]
    new = replace(spec, nics=(replace(nic, leaf="leaf-rma-7"), *spec.nics[1:]))
    topo.nodes[name] = new  # as topology_binding does: the spec replaced, then indexed again
    topo.index.add(new)
    after = render(api.registry)
    want = f'fabricmon_topology_port_info{{device="{nic.device}",leaf="leaf-rma-7",node="{name}",port="{nic.port}"'
    assert any(line.startswith(want) for line in _port_lines(after)), _port_lines(after)[:3]
    assert not any(line.startswith(want) for line in _port_lines(before))


def test_a_topology_reload_changes_the_cached_body():
    c = Cluster(nodes=8)
    api = _api(c)
    before = _port_lines(render(api.registry))
    assert any('node="node-007"' in line for line in before)
    new = generate_topology(7, nodes_per_unit=8, layout="roce", cluster="test")
    topology_reload.apply(c.engine, topology_reload.plan(c.engine.topology, new, "topology.yaml"), c.t)
    after = _port_lines(render(api.registry))
    assert after and not any('node="node-007"' in line for line in after)
    assert len(after) == len(before) - len(c.topo.nodes["node-007"].nics)


class _Collector:
    def __init__(self) -> None:
        self.families: list = []

    def collect(self):
        return iter(self.families)


def test_a_frozen_family_renders_its_text_and_a_new_one_its_new_values():
    reg = CollectorRegistry()
    col = _Collector()
    reg.register(col)
    g = GaugeMetricFamily("fm_info", "info", labels=["node"])
    g.add_metric(["a"], 1.0)
    col.families = [freeze(g)]
    assert render(reg) == generate_latest(reg)
    g2 = GaugeMetricFamily("fm_info", "info", labels=["node"])
    g2.add_metric(["b"], 2.0)
    col.families = [freeze(g2)]  # the next version: built and frozen again
    body = render(reg)
    assert body == generate_latest(reg) and b'node="b"' in body and b'node="a"' not in body
