"""What straggler localization keeps between ticks (a GPU's path per NIC-map version, each job's groups
and their path components per report: correlator._Localized) is derived again when the topology changes,
and gives what a fresh derivation gives."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fabricmon.aggregator import correlator
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.correlator import fuse_evidence, localize_stragglers
from fabricmon.aggregator.stragglers import Straggler, StragglerReport
from fabricmon.components import Kind
from fabricmon.topology import generate_topology


def _topo():
    return generate_topology(8, nodes_per_unit=4, layout="roce", cluster="test")


def _report() -> StragglerReport:
    # one lone compute straggler (its GPU), and a comm-late group on rail 1 across two hosts of one leaf
    return StragglerReport([Straggler("train", 3, "node-000", 0, "compute", 6.0, 0.2),
                            Straggler("train", 9, "node-001", 1, "comm", 5.0, 0.1),
                            Straggler("train", 17, "node-002", 1, "comm", 5.0, 0.1)], [], {})


def _localize(topo, report):
    ev = fuse_evidence([], frozenset(), {})
    out, shared = localize_stragglers(topo, DetectionSettings(), report, {}, ev, set(topo.nodes), "test")
    return [(f.alertname, f.component, f.labels, f.evidence, f.description) for f in out], shared


def _rename_leaf(topo, node: str, gpu: int, leaf: str) -> None:
    """A switch RMA'd under a new name, bound as topology_binding does: the spec replaced, then indexed."""
    spec = topo.nodes[node]
    nics = tuple(replace(n, leaf=leaf) if n.gpu == gpu else n for n in spec.nics)
    topo.nodes[node] = new = replace(spec, nics=nics)
    topo.index.add(new)


def test_a_gpus_path_is_kept_until_the_nic_maps_change():
    topo = _topo()
    p = topo.path_of_gpu("node-000", 0)
    assert topo.path_of_gpu("node-000", 0) is p
    _rename_leaf(topo, "node-000", 0, "leaf-rma-1")
    q = topo.path_of_gpu("node-000", 0)
    assert q is not p and q[Kind.LEAF].id == "leaf-rma-1" and p[Kind.LEAF].id != "leaf-rma-1"


def test_groups_are_derived_once_per_report(monkeypatch):
    calls = []
    real = correlator._group
    monkeypatch.setattr(correlator, "_group", lambda topo, lst: calls.append(1) or real(topo, lst))
    topo, report = _topo(), _report()
    first = _localize(topo, report)
    for _ in range(3):  # the ticks until the next scored step reuse the report
        assert _localize(topo, report) == first
    assert len(calls) == 1
    _localize(topo, _report())  # a new report: derived again
    assert len(calls) == 2


@pytest.mark.parametrize("node,gpu", [("node-000", 0), ("node-001", 1)])
def test_a_changed_topology_localizes_as_a_fresh_report_does(node, gpu):
    topo, report = _topo(), _report()
    before = _localize(topo, report)
    _rename_leaf(topo, node, gpu, "leaf-rma-2")
    kept = _localize(topo, report)  # the same report, kept from before the change
    assert kept == _localize(topo, _report())  # what a fresh derivation gives
    assert kept != before and "leaf-rma-2" in repr(kept)
