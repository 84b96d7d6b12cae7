"""Layers the aggregator split (issue 39) keeps apart: the simulator never imports the demo, and no two
aggregator modules import each other, not even through a lazy import inside a function."""

from __future__ import annotations

from test_import_cycles import PACKAGE, cycles, import_graph


def test_the_simulator_never_imports_the_demo():
    lazy = import_graph(PACKAGE, lazy=True)
    assert lazy["fabricmon.sim.drive"], "the scan found the simulator's imports"
    found = {m: sorted(d for d in deps if d.startswith("fabricmon.demo"))
             for m, deps in lazy.items() if m.startswith("fabricmon.sim")}
    assert {m: deps for m, deps in found.items() if deps} == {}


def test_no_aggregator_import_circle_counting_lazy_imports():
    lazy = import_graph(PACKAGE, lazy=True)
    agg = {m: {d for d in deps if d.startswith("fabricmon.aggregator")}
           for m, deps in lazy.items() if m.startswith("fabricmon.aggregator")}
    assert "fabricmon.aggregator.credentials" in agg["fabricmon.aggregator.config"]
    assert cycles(agg) == []
