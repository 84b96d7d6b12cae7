"""SlowRanksSharedComponent labels: what Alertmanager routes and inhibits on, per component type."""

from __future__ import annotations

import pytest

from fabricmon import components
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.correlator import Shared, shared_component_findings
from fabricmon.topology import generate_topology


@pytest.fixture(scope="module")
def topo():
    return generate_topology(16, layout="ib", nodes_per_unit=8, cluster="c1")


# the component ids of DESIGN.md, as the topology hands the components out
COMPONENTS = {
    "rail3": lambda t: components.rail(3),
    "spine-1": lambda t: components.spine("spine-1"),
    "leaf-u1-r5": lambda t: t.leaf("node-009", 5),
    "node-009/mlx5_2": lambda t: t.nic_component("node-009", t.nic("node-009", "mlx5_2")),
    "node-009/gpu2": lambda t: t.gpu("node-009", 2),
}


def _labels(topo, cid: str, jobs=("llm",)) -> dict:
    comp = COMPONENTS[cid](topo)
    shared = {comp: Shared(ranks={3, 11}, jobs=set(jobs), why=["comm late"], v=3.0)}
    (f,) = shared_component_findings(topo, DetectionSettings(), shared, "c1")
    assert (f.alertname, f.component, f.component.id) == ("SlowRanksSharedComponent", comp, cid)
    return f.labels


@pytest.mark.parametrize(("comp", "expected"), [
    # a rail is no node: no node label (it once read node="rail3"), the rail for rail-wide inhibitions
    ("rail3", {"cluster": "c1", "rail": "3", "hpc_job": "llm"}),
    ("spine-1", {"cluster": "c1", "hpc_job": "llm"}),
    ("leaf-u1-r5", {"cluster": "c1", "leaf": "leaf-u1-r5", "rail": "5", "hpc_job": "llm"}),
    ("node-009/mlx5_2", {"cluster": "c1", "node": "node-009", "rail": "2", "leaf": "leaf-u1-r2", "hpc_job": "llm"}),
    ("node-009/gpu2", {"cluster": "c1", "node": "node-009", "gpu": "2", "rail": "2", "leaf": "leaf-u1-r2",
                       "hpc_job": "llm"}),
])
def test_labels_name_what_the_component_is(topo, comp, expected):
    assert _labels(topo, comp) == expected


def test_two_jobs_name_no_job(topo):
    assert "hpc_job" not in _labels(topo, "rail3", jobs=("a", "b"))
