"""Engine end to end on hand-built agent batches (no simulator): detection, folding, resets, quiet runs."""

from __future__ import annotations

import random

import pytest

from fabricmon.aggregator.engine import LATENESS_EXPORTED_PER_JOB
from fabricmon.batch import NodeBatch
from fabricmon.rank_timing import RankTiming
from support.enginerig import T0, Cluster, _port, _set_state, flaky, synced_ranks

PORT = (("device", ""), ("port", "1"))


@pytest.mark.parametrize("lag", [0.0, 8.0])
def test_nodes_polled_every_10s_keep_a_fault_open_between_their_batches(lag):
    """Evidence arrives once per 10 s poll (plus stream lag): the incident holds over the gaps,
    fires once and resolves once, some polls after the errors stop."""
    c = Cluster()
    for f in c.feeds.values():
        f.interval = 10.0
        c.engine.hello(f.hello())
    sick = flaky("node-003", "mlx5_3")
    t_stop = T0 + 200.0
    for k in range(1, 36):  # a batch every 10 s of sample time; ticks every second of wall time
        ts = T0 + 10.0 * k
        if ts <= t_stop:
            sick(c)
        for f in c.feeds.values():
            c.engine.ingest(f.batch(ts, first=(k == 1)))
        for tick in range(10):
            now = ts + lag + tick
            for inc in c.engine.tick(now):
                c.reported.append((now, inc.alertname, inc.component, inc.open))
    link = [(t, o) for t, a, comp, o in c.reported if a == "FabricLinkErrors"]
    assert [o for _, o in link] == [True, False], c.reported  # no resolve/fire between two batches
    assert link[1][0] - t_stop >= 3 * 10.0
    assert {comp for _, a, comp, _ in c.reported} == {"node-003/mlx5_3/1"}


def test_flaky_cable_detected_within_5s_and_resolved():
    c = Cluster()
    c.run(20)
    assert c.engine.incidents() == []
    start = c.t + 1
    c.run(60, flaky("node-003", "mlx5_3"))
    inc = c.incidents(alertname="FabricLinkErrors")
    assert len(inc) == 1, c.engine.incidents()
    i = inc[0]
    assert i.component == "node-003/mlx5_3/1" and i.component_type == "link"
    assert i.first_seen - start <= 5.0
    assert i.labels["rail"] == "3" and i.labels["leaf"] == "leaf-u0-r3" and i.labels["node"] == "node-003"
    assert any("symbol" in e for e in i.evidence)
    assert i.resolved_at is None
    end = c.t
    c.run(40)
    assert i.resolved_at is not None and end < i.resolved_at <= end + 20
    # nothing else was raised
    assert {x.alertname for x in c.engine.incidents()} == {"FabricLinkErrors"}


def test_leaf_degraded_is_one_incident_without_port_alerts():
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.run(10)
    unit1 = [n for n in c.topo.nodes if c.topo.unit_of(n) == 1]

    def inject(cl):
        for n in unit1:
            flaky(n, "mlx5_5")(cl)

    c.run(30, inject)
    incs = c.engine.incidents()
    assert [(i.alertname, i.component) for i in incs] == [("FabricLeafDegraded", "leaf-u1-r5")], incs
    assert incs[0].component_type == "leaf" and incs[0].severity == "critical"
    assert incs[0].labels["leaf"] == "leaf-u1-r5" and incs[0].labels["rail"] == "5"
    c.run(40)
    assert incs[0].resolved_at is not None
    assert [(i.alertname, i.component) for i in c.engine.incidents()] == [("FabricLeafDegraded", "leaf-u1-r5")]


def test_leaf_fold_with_staggered_onset():
    """Links of a leaf that start failing a second apart still fold into one leaf incident."""
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.run(10)
    unit1 = [n for n in c.topo.nodes if c.topo.unit_of(n) == 1]
    k = {"i": 0}

    def inject(cl):
        k["i"] += 1
        for j, n in enumerate(unit1):
            if j < 2 * k["i"]:
                flaky(n, "mlx5_2")(cl)

    c.run(20, inject)
    names = [(i.alertname, i.component) for i in c.engine.incidents()]
    assert names == [("FabricLeafDegraded", "leaf-u1-r2")], names


def _transitions(c: Cluster) -> dict[tuple[str, str], list[str]]:
    """Per alert, the open/resolved transitions tick() reported (updates of an open alert dropped)."""
    out: dict[tuple[str, str], list[str]] = {}
    for _, a, comp, is_open in c.reported:
        seq = out.setdefault((a, comp), [])
        state = "firing" if is_open else "resolved"
        if not seq or seq[-1] != state:
            seq.append(state)
    return out


def test_cable_failing_before_its_leaf_degrades_keeps_its_own_alert_and_resolves():
    """The overlap defect: a flaky cable (from t=10) under a leaf that degrades later (t=40..70) was
    folded into the leaf and its resolve never left tick(): Alertmanager kept it firing."""
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.run(10)
    unit0 = [n for n in c.topo.nodes if c.topo.unit_of(n) == 0]
    cable = flaky("node-003", "mlx5_2")
    t0 = c.t

    def inject(cl):
        t = cl.t - t0
        if t < 50:
            cable(cl)
        if 30 <= t < 60:
            for n in unit0:
                if n != "node-003":
                    flaky(n, "mlx5_2")(cl)

    c.run(60, inject)
    c.run(40)
    got = _transitions(c)
    assert got == {("FabricLinkErrors", "node-003/mlx5_2/1"): ["firing", "resolved"],
                   ("FabricLeafDegraded", "leaf-u0-r2"): ["firing", "resolved"]}, got
    cable_inc = c.incidents(alertname="FabricLinkErrors")[0]
    leaf_inc = c.incidents(alertname="FabricLeafDegraded")[0]
    assert cable_inc.first_seen - t0 <= 5 and 30 <= leaf_inc.first_seen - t0 <= 35
    # each resolved only once its own evidence stopped (the cable at t=50, the leaf's links at t=60)
    assert 50 < cable_inc.resolved_at - t0 <= 50 + 20 and 60 < leaf_inc.resolved_at - t0 <= 60 + 20
    assert c.engine.open_incidents() == []
    assert {i.component for i in c.engine.incidents()} == {"node-003/mlx5_2/1", "leaf-u0-r2"}


def test_link_outliving_its_leaf_gets_its_own_alert_after_the_leaf_resolves():
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.run(10)
    unit1 = [n for n in c.topo.nodes if c.topo.unit_of(n) == 1]
    t0 = c.t

    def inject(cl):
        t = cl.t - t0
        for n in unit1:
            if t < 30 or (n == "node-009" and t < 80):
                flaky(n, "mlx5_5")(cl)

    c.run(80, inject)
    c.run(40)
    got = _transitions(c)
    assert got == {("FabricLeafDegraded", "leaf-u1-r5"): ["firing", "resolved"],
                   ("FabricLinkErrors", "node-009/mlx5_5/1"): ["firing", "resolved"]}, got
    leaf_inc = c.incidents(alertname="FabricLeafDegraded")[0]
    link_inc = c.incidents(alertname="FabricLinkErrors")[0]
    # while the leaf fired the link was its evidence; it outlived the leaf, so it is its own fault
    assert link_inc.first_seen >= leaf_inc.resolved_at
    assert "node-009/mlx5_5/1" in leaf_inc.absorbed
    assert 80 < link_inc.resolved_at - t0 <= 80 + 20


def test_leaf_links_failing_again_during_the_leaf_hold_stay_its_evidence():
    """A degraded leaf's links pause, then two fail again while the leaf's alert holds: still the leaf."""
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.run(10)
    unit1 = [n for n in c.topo.nodes if c.topo.unit_of(n) == 1]
    t0 = c.t

    def inject(cl):
        t = cl.t - t0
        for n in unit1 if t < 20 else unit1[:2] if 24 <= t < 30 else ():
            flaky(n, "mlx5_5")(cl)

    c.run(40, inject)
    c.run(40)
    assert _transitions(c) == {("FabricLeafDegraded", "leaf-u1-r5"): ["firing", "resolved"]}, _transitions(c)


def test_counter_reset_and_quiet_30_minutes_raise_nothing():
    c = Cluster(nodes=16, nodes_per_unit=8)
    c.run(30)

    def reset(cl):
        f = cl.feeds["node-005"]
        for dev in ("mlx5_0", "mlx5_3"):
            lab = _port(dev)
            # a driver reload: counters restart, the agent reports the new values as reset deltas
            f.add("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),), 65535.0, reset=True)
            f.add("fabricmon_ib_port_errors_total", lab + (("counter", "link_error_recovery"),), 3.0)
            f.add("fabricmon_rdma_transport_retries_total", lab + (("counter", "out_of_sequence"),), 5e6, reset=True)
            f.add("fabricmon_ib_port_transmit_bytes_total", lab, 1e6, reset=True)

    c.step(reset)
    # and a reboot: new boot id, fresh counters, seq restarts at 1
    f = c.feeds["node-009"]
    c.engine.hello(f.hello(boot_id="boot-2"))
    f.seq = 0
    f.add("fabricmon_ib_port_errors_total", _port("mlx5_1") + (("counter", "symbol_error"),), 40000.0)
    c.run(1800)
    assert c.engine.incidents() == []
    assert c.engine.detection.suspicion == {}


def test_duplicate_and_old_batches_are_dropped():
    c = Cluster(nodes=2, nodes_per_unit=2)
    f = c.feeds["node-000"]
    b = f.batch(T0 + 1, first=True)
    assert c.engine.ingest(b) is True
    assert c.engine.ingest(b) is False
    old = NodeBatch("node-000", b.seq - 1 if b.seq > 1 else 0, T0, 1.0)
    assert c.engine.ingest(old) is False
    assert c.engine.admission.batches_dropped_total == 2


def test_link_down_critical_fast_then_resolves():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)
    start = c.t + 1

    def down(cl):
        _set_state(cl, "node-001", "mlx5_6", 1, 2)
        cl.feeds["node-001"].add("fabricmon_ib_port_errors_total", _port("mlx5_6") + (("counter", "link_downed"),), 1)

    c.step(down)
    c.run(10)
    inc = c.incidents(alertname="FabricLinkDown")
    assert len(inc) == 1 and inc[0].component == "node-001/mlx5_6/1" and inc[0].severity == "critical"
    assert inc[0].first_seen - start <= 2.0
    c.step(lambda cl: _set_state(cl, "node-001", "mlx5_6", 4, 5))
    c.run(15)
    assert inc[0].resolved_at is not None
    assert [i.alertname for i in c.engine.incidents()] == ["FabricLinkDown"]


def test_link_flapping():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)
    for _ in range(6):
        c.step(lambda cl: _set_state(cl, "node-002", "mlx5_1", 1, 2))
        c.step(lambda cl: _set_state(cl, "node-002", "mlx5_1", 4, 5))
    assert c.incidents(alertname="FabricLinkFlapping", component="node-002/mlx5_1/1")


def test_link_degraded_rate():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)
    c.step(lambda cl: cl.feeds["node-000"].gauge("fabricmon_ib_port_rate_bytes_per_second", _port("mlx5_4"), 25e9))
    c.run(5)
    inc = c.incidents(alertname="FabricLinkDegraded")
    assert len(inc) == 1 and inc[0].component == "node-000/mlx5_4/1"
    assert "200 Gb/s" in inc[0].evidence[0]


def test_pfc_storm_blames_the_emitter_not_victims():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)

    def storm(cl):
        cl.feeds["node-002"].add("fabricmon_pfc_pause_seconds_total",
                                 (("interface", "eth3"), ("priority", "3"), ("direction", "tx")), 0.85)
        cl.feeds["node-002"].add("fabricmon_pfc_pause_storm_events_total",
                                 (("interface", "eth3"), ("level", "warning")), 2)
        for victim in ("node-000", "node-001"):  # victims receive pauses and emit none
            cl.feeds[victim].add("fabricmon_pfc_pause_seconds_total",
                                 (("interface", "eth3"), ("priority", "3"), ("direction", "rx")), 0.6)

    c.run(6, storm)
    inc = c.incidents(alertname="FabricPFCStorm")
    assert [i.component for i in inc] == ["node-002/mlx5_3/1"]


def test_rdma_retransmits_and_congestion_and_nvlink_and_xid():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)

    def inject(cl):
        f = cl.feeds["node-001"]
        f.add("fabricmon_rdma_transport_retries_total", _port("mlx5_2") + (("counter", "local_ack_timeout_err"),), 300)
        f.add("fabricmon_rdma_transport_retries_total", _port("mlx5_2") + (("counter", "packet_seq_err"),), 500)
        f.add("fabricmon_roce_cnp_handled_total", _port("mlx5_7"), 2e5)
        f.add("fabricmon_ib_port_transmit_wait_total", _port("mlx5_7"), 3e5)
        f.add("fabricmon_nvlink_errors_total", (("gpu", "3"), ("link", "5"), ("type", "crc_flit")), 500)
        f.add("fabricmon_nvlink_errors_total", (("gpu", "3"), ("link", "5"), ("type", "replay")), 100)
        cl.feeds["node-002"].add("fabricmon_gpu_xid_errors_total", (("gpu", "6"), ("xid", "79")), 1)
        cl.feeds["node-002"].add("fabricmon_gpu_xid_errors_total", (("gpu", "5"), ("xid", "13")), 1)  # not fatal

    c.run(6, inject)
    got = {(i.alertname, i.component) for i in c.engine.incidents()}
    assert ("RDMARetransmits", "node-001/mlx5_2/1") in got
    assert ("FabricCongestion", "node-001/mlx5_7/1") in got
    assert ("NVLinkErrors", "node-001/gpu3/nvlink5") in got
    assert ("GPUXidFatal", "node-002/gpu6") in got
    assert not any(c == "node-002/gpu5" for _, c in got)


def test_nvlink_down_and_config_drift_node_and_nic():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(5)

    def inject(cl):
        cl.feeds["node-003"].gauge("fabricmon_nvlink_up", (("gpu", "1"), ("link", "7")), 0.0)
        for n in c.topo.nodes["node-000"].nics:
            cl.feeds["node-000"].gauge("fabricmon_fabric_config_ok",
                                       (("device", n.device), ("interface", f"eth{n.rail}"), ("check", "pfc")), 0.0)
        cl.feeds["node-001"].gauge("fabricmon_fabric_config_ok",
                                   (("device", "mlx5_4"), ("interface", "eth4"), ("check", "ecn_np")), 0.0)
        cl.feeds["node-001"].gauge("fabricmon_fabric_config_ok",
                                   (("device", "mlx5_4"), ("interface", "eth4"), ("check", "rate")), 0.0)

    c.step(inject)
    c.run(4)
    got = {(i.alertname, i.component_type, i.component) for i in c.engine.incidents()}
    assert got == {("NVLinkDown", "nvlink", "node-003/gpu1/nvlink7"),
                   ("FabricConfigDrift", "config", "node-000"),
                   ("FabricConfigDrift", "config", "node-001/mlx5_4")}, got


def test_agent_down_when_a_node_goes_silent():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(60)  # past the restart grace (agents_down.restart_grace: 60 s at 1 s polls)
    del c.feeds["node-002"]
    c.engine.disconnected("node-002")
    c.run(20)
    inc = c.incidents(alertname="FabricmonAgentDown")
    assert [i.component for i in inc] == ["node-002"]


# ------------------------------------------------------------------ stragglers through the engine


def test_slow_gpu_with_clean_fabric_is_a_gpu_straggler_without_fabric_blame():
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if (n, g) == ("node-006", 2) else 0.0)
    c.run(30)
    incs = c.engine.incidents()
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [
        ("StragglerRank", "gpu", "node-006/gpu2")], incs
    i = incs[0]
    assert "no fabric evidence" in i.full_description()
    assert i.ranks == [6 * 8 + 2] and i.jobs == ["llm"]
    assert i.labels["gpu"] == "2" and i.labels["node"] == "node-006" and i.labels["hpc_job"] == "llm"
    # /metrics carries the job's latest ranks, not one series per GPU: the slow one first
    exported = c.engine.views.metrics_snapshot()["lateness"]
    everyone = c.engine.stragglers.lateness_by_job()
    assert len(everyone) == 64 and len(exported) == LATENESS_EXPORTED_PER_JOB < 64
    assert exported[0][:3] == ("llm", "", 6 * 8 + 2)  # (job, job_id, rank, score): this job sends no job_id
    top = sorted((s for _, _, _, s in everyone), reverse=True)[:LATENESS_EXPORTED_PER_JOB]
    assert [s for _, _, _, s in exported] == top


def test_slow_rank_on_flaky_link_rides_on_the_link_alert_not_gpu():
    """One fault, one alert: the slow ranks are attached to the link's own incident."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.0,
                              slow_transfer=lambda step, n, g: 0.3 if (n, g) == ("node-005", 4) else 0.0)
    c.run(30, flaky("node-005", "mlx5_4"))
    got = {(i.alertname, i.component) for i in c.engine.incidents()}
    assert got == {("FabricLinkErrors", "node-005/mlx5_4/1")}, got
    link = c.incidents(alertname="FabricLinkErrors")[0]
    assert link.jobs == ["llm"] and 5 * 8 + 4 in link.ranks


def test_slow_gpu_on_a_node_with_a_bad_nic_on_its_rail_is_two_alerts():
    """Late compute is not what a flaky link does: the GPU straggler is its own fault beside the link's."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if (n, g) == ("node-005", 4) else 0.0)
    c.run(30, flaky("node-005", "mlx5_4"))
    got = {(i.alertname, i.component) for i in c.engine.incidents()}
    assert got == {("FabricLinkErrors", "node-005/mlx5_4/1"), ("StragglerRank", "node-005/gpu4")}, got
    gpu = c.incidents(alertname="StragglerRank")[0]
    assert "compute" in gpu.description and "node-005/mlx5_4/1" in gpu.description, gpu.description


def test_random_rank_late_each_step_raises_nothing():
    rng = random.Random(9)
    picks: dict = {}

    def slow(step, n, g):
        if step not in picks:
            picks[step] = (f"node-00{rng.randrange(8)}", rng.randrange(8))
        return 0.3 if picks[step] == (n, g) else 0.0

    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(slow)
    c.run(60)
    assert c.engine.incidents() == []


def test_periodic_pause_on_one_host_raises_nothing():
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.5 if n == "node-001" and step % 5 == 0 else 0.0)
    c.run(60)
    assert c.engine.incidents() == []


def test_whole_node_slow_with_clean_counters_is_a_software_straggler_not_a_page():
    """A dataloader or CPU problem: all ranks of one host late together, every component clean
    (DESIGN "Jobs, decoys and cost"): SoftwareStraggler (info) on the node, never StragglerRank."""
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if n == "node-004" else 0.0)
    c.run(30)
    got = [(i.alertname, i.component_type, i.component, i.severity) for i in c.engine.incidents()]
    assert got == [("SoftwareStraggler", "node", "node-004", "info")], got


def test_whole_node_slow_with_throttled_gpus_still_pages():
    c = Cluster(nodes=8, nodes_per_unit=4)
    c.ranks_fn = synced_ranks(lambda step, n, g: 0.3 if n == "node-004" else 0.0)

    def throttle(cl: Cluster) -> None:
        for g in range(8):
            cl.feeds["node-004"].gauge("fabricmon_gpu_throttle_reason",
                                       (("gpu", str(g)), ("reason", "HwThermalSlowdown")),
                                       1.0)
    c.run(30, throttle)
    got = {(i.alertname, i.component_type, i.component) for i in c.engine.incidents()}
    assert ("StragglerRank", "node", "node-004") in got, got


@pytest.mark.parametrize("with_group", [True, False])
def test_stage_imbalance_is_info_never_fabric(with_group):
    c = Cluster(nodes=8, nodes_per_unit=4)
    base = synced_ranks(lambda step, n, g: 0.4 if n in ("node-006", "node-007") else 0.0)

    def fn(cl, node):
        out = base(cl, node)
        if not with_group:
            return out
        return [RankTiming(r.job, r.rank, r.local_rank, r.step, r.step_seconds, r.comm_seconds, r.ts, r.node,
                           group=(("tp", r.local_rank), ("pp", r.rank // 16), ("dp", (r.rank // 8) % 2)))
                for r in out]

    c.ranks_fn = fn
    c.run(40)
    incs = c.engine.incidents()
    assert all(i.alertname == "StageImbalance" and i.severity == "info" for i in incs), incs
    if with_group:
        assert [i.component for i in incs] == ["llm/stage3"]


@pytest.mark.parametrize("interval", [1.0, 10.0, 60.0])
def test_steady_low_error_rate_never_fires_whatever_the_poll_interval(interval):
    """background_errors: 0.3 symbol errors/s on a healthy link.  Thresholds are rates, so a 60 s poll
    (18 errors per window) is as quiet as a 1 s one; a real flaky cable still fires at 10 s polls."""
    c = Cluster(nodes=4, nodes_per_unit=4)
    for f in c.feeds.values():
        f.interval = interval
        c.engine.hello(f.hello())
    feed = c.feeds["node-002"]
    steps = int(1800 / interval)
    for k in range(1, steps + 1):
        ts = T0 + interval * k
        feed.add("fabricmon_ib_port_errors_total", _port("mlx5_2") + (("counter", "symbol_error"),), 0.3 * interval)
        for f in c.feeds.values():
            c.engine.ingest(f.batch(ts, first=(k == 1)))
        c.engine.tick(ts)
    assert c.engine.incidents() == []
    if interval == 10.0:
        for k in range(steps + 1, steps + 13):
            ts = T0 + interval * k
            feed.add("fabricmon_ib_port_errors_total", _port("mlx5_2") + (("counter", "symbol_error"),), 500.0)
            for f in c.feeds.values():
                c.engine.ingest(f.batch(ts))
            c.engine.tick(ts)
        assert [i.alertname for i in c.engine.incidents()] == ["FabricLinkErrors"]
