"""The ingest stage reads labels by name: positions come from metrics.SPECS, and the series agents send keep them.

``tests/sim/test_sim_inmemory.py`` shows the simulator's batches equal the real agent pipeline's; here
every series of a family the detectors read, in those batches, carries the labels the ingest
stage reads at the positions it resolved from ``metrics.SPECS``.  Reordering a family's labels in
SPECS moves the positions with it; a source that sent them in another order fails here instead of
blinding a detector silently.
"""

from __future__ import annotations

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.ingest import DELTA_ROUTES, GAUGE_ROUTES, Route, _at
from fabricmon.aggregator.state import GpuEvent, LinkEvent
from fabricmon.metrics import SPECS
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.inmemory import BatchBuilder
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.topology import generate_topology
from support.simrig import faults_for


def test_positions_are_resolved_by_name_from_specs():
    assert _at("fabricmon_fabric_config_ok", "device", "check") == (0, 2)
    assert _at("fabricmon_transceiver_rx_power_watts", "device", "port", "lane") == (0, 1, 2)
    for family, (_route, at) in {**DELTA_ROUTES, **GAUGE_ROUTES}.items():
        assert all(0 <= i < len(SPECS[family].labels) for i in at), family


def test_simulated_agent_series_carry_the_labels_ingest_reads_where_specs_puts_them():
    seen: set[str] = set()
    for layout in ("ib", "roce"):
        c = ClusterState(Scenario(ClusterSpec(4, layout, 2, seed=3), 30, faults_for(layout)))
        builder = BatchBuilder(c)
        for step in range(8):
            if step:
                c.advance(1.0)
            for b in builder.build():
                for series in (*b.deltas, *b.gauges):
                    if series.family in DELTA_ROUTES or series.family in GAUGE_ROUTES:
                        names = tuple(k for k, _ in series.labels)
                        assert names == SPECS[series.family].labels, (series.family, names)
                        seen.add(series.family)
    # the check covered the families the detectors live on, not an empty set
    assert {"fabricmon_ib_port_errors_total", "fabricmon_pfc_pause_seconds_total", "fabricmon_nvlink_errors_total",
            "fabricmon_ib_port_state", "fabricmon_nvlink_up"} <= seen, seen


def test_a_batch_becomes_typed_events_on_its_components():
    c = ClusterState(Scenario(ClusterSpec(4, "ib", 2, seed=3), 30, faults_for("ib")))
    builder = BatchBuilder(c)
    e = Engine(generate_topology(4, layout="ib", nodes_per_unit=2), DetectionSettings())
    for h in builder.hellos():
        e.hello(h)
    for step in range(6):
        if step:
            c.advance(1.0)
        for b in builder.build():
            e.ingest(b)
    ns = e.nodes["node-001"]
    flaky = ns.links[("mlx5_3", "1")]  # flaky_cable on rail 3 from t=2
    assert flaky.id.id == "node-001/mlx5_3/1" and flaky in e.active_links
    assert {k for _, k, _, _ in flaky.ev} >= {LinkEvent.ERR} and all(isinstance(k, LinkEvent) for _, k, _,
                                                                     _ in flaky.ev)
    gpu = ns.gpus["2"]  # nvlink_errors on GPU 2, NVLink 5
    assert any(k is GpuEvent.NVLINK_ERR and sub == 5 for _, k, _, sub in gpu.ev), list(gpu.ev)
    assert Route.PMA_ERRORS is DELTA_ROUTES["fabricmon_ib_port_errors_total"][0]
