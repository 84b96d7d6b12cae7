"""FabricCableDegrading: a degrading cable warns minutes before it flaps, on its own link only; healthy
links with a wandering background BER, a step in BER, or a flat trend never warn."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from fabricmon import components
from fabricmon.aggregator.cable_health import CableHealth, theil_sen, thirds_rise
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.configload import ConfigError
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.drive import Drive
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import ClusterSpec, Scenario, scenario_from_dict
from support.paths import REPO as ROOT

T0 = 1764000000.0


def run_engine(scn: Scenario, interval: float = 5.0, until: float | None = None):
    """The in-memory simulator (no job) through the real engine; returns [(t, alertname, component, opened?)]."""
    sim = SimulatedCluster(scn, mode="memory", interval=interval, epoch=T0, job=None)
    e = Engine(sim.topology)
    events = []

    def on_step(_st, changed) -> None:
        for inc in changed:
            events.append((sim.t, inc.alertname, inc.component, inc.resolved_at is None, list(inc.evidence)))

    drive = Drive(sim, engine=e)
    drive.connect()
    drive.run(until, on_step=on_step)
    return events, e


def degrading(layout: str, seed: int, start=60.0, fails_at=900.0, duration=960.0, nodes=8) -> Scenario:
    return Scenario(ClusterSpec(nodes=nodes, layout=layout, nodes_per_unit=nodes, seed=seed), duration) \
        .with_fault("cable_degrading", node="node-003", rail=3, start=start, fails_at=fails_at)


@pytest.mark.parametrize("layout,seed", [("roce", 1), ("roce", 5), ("ib", 2)])
def test_warns_minutes_before_the_first_flap_on_that_link_only(layout, seed):
    events, _ = run_engine(degrading(layout, seed))
    link = "node-003/mlx5_3/1"
    warn = [ev for ev in events if ev[1] == "FabricCableDegrading" and ev[3]]
    assert [ev[2] for ev in warn] == [link], events  # one warning, on the right link, nowhere else
    assert warn[0][0] <= 900 - 300, f"warned at t={warn[0][0]}, less than 5 min before the flap"
    assert warn[0][0] >= 60  # not before the fault exists
    flap = [ev for ev in events if ev[2] == link and ev[1] in ("FabricLinkDown", "FabricLinkFlapping") and ev[3]]
    assert flap and flap[0][0] >= 900
    # no other alert anywhere before the cable fails
    assert all(ev[2] == link for ev in events), events
    text = " ".join(warn[0][4])
    if layout == "roce":
        assert "BER rising" in text or "lane" in text
    else:  # IB: no FEC counters in sysfs; the module's RX power is the evidence
        assert "RX power lane" in text and "dB/min" in text


def test_lane_evidence_names_the_bad_lane():
    scn = degrading("roce", 3)
    c = ClusterState(scn, epoch=T0)
    events, _ = run_engine(scn)
    lane = c.optics.bad_lane[id(scn.faults[0])]
    texts = [" ".join(ev[4]) for ev in events if ev[1] == "FabricCableDegrading"]
    assert texts
    # by the time the flaps start the lane share is overwhelming: the incident's evidence names it
    _, e = run_engine(scn, until=880)
    inc = e.manager.get_open("FabricCableDegrading", "node-003/mlx5_3/1")
    assert inc is not None
    assert any(f"lane {lane} carries" in x for x in inc.evidence), inc.evidence


def test_quiet_cluster_with_background_ber_never_warns():
    scn = Scenario(ClusterSpec(nodes=8, layout="roce", nodes_per_unit=8, seed=9), 1500.0)
    events, e = run_engine(scn)
    assert events == []
    assert len(e.cable.tracks) >= 8 * 8  # every rail link was judged


class _Link:
    def __init__(self, down=False):
        self.id = components.link("node-000", "mlx5_0", 1)
        self.labels = {"node": "node-000"}
        self._down = down

    def is_down(self):
        return self._down


def feed(ch: CableHealth, link, t0: float, seconds: int, log_ber) -> list:
    """5 s intervals of a 50 GB/s link at BER 10**log_ber(t); the findings of every tick."""
    out = []
    for k in range(0, seconds, 5):
        t = t0 + k
        bits = 10 ** log_ber(t) * 50e9 * 8 * 5
        ch.corrected(link, t, bits, 5.0)
        out.append((t, ch.evaluate(t)))
    return out


def test_flat_and_step_changes_do_not_warn_a_ramp_does_and_resolves_when_it_stops():
    s = DetectionSettings()
    ch = CableHealth(s)
    link = _Link()
    ch.data_rate(link, 50e9)
    # flat 10 minutes, then a step of 1.5 decades (a neighbour's traffic, a leaf problem), flat again
    res = feed(ch, link, T0, 600, lambda t: -7.0)
    res += feed(ch, link, T0 + 600, 600, lambda t: -5.5)
    assert not any(f.fire for _, fs in res for f in fs)
    # a steady climb of 0.25 decades per minute
    res = feed(ch, link, T0 + 1200, 600, lambda t: -5.5 + 0.25 * (t - T0 - 1200) / 60)
    fired = [t for t, fs in res if any(f.fire for f in fs)]
    assert fired and fired[0] - (T0 + 1200) <= 300
    # the climb stops: the evidence goes (keep false) so the incident resolves after its hold
    res = feed(ch, link, T0 + 1800, 600, lambda t: -3.0)
    assert res[-1][1] == []


def test_a_down_link_is_not_judged():
    ch = CableHealth(DetectionSettings())
    link = _Link(down=True)
    ch.data_rate(link, 50e9)
    res = feed(ch, link, T0, 600, lambda t: -7 + 0.3 * (t - T0) / 60)
    assert all(fs == [] for _, fs in res)


def test_robust_helpers():
    xs = [0, 1, 2, 3, 4, 5]
    assert theil_sen(xs, [0, 1, 2, 3, 100, 5]) == pytest.approx(1.0)
    assert thirds_rise([0, 0, 1, 1, 2, 2]) == (1, 1)
    assert math.isfinite(theil_sen([1], [1]))


def test_scenario_needs_fails_at_after_start():
    base = {"cluster": {"nodes": 4, "layout": "roce", "nodes_per_unit": 4}, "duration": 600}
    with pytest.raises(ConfigError, match=r"faults\[0\]\.fails_at: required for cable_degrading"):
        scenario_from_dict({**base, "faults": [{"kind": "cable_degrading", "node": "node-001", "rail": 1,
                                                "start": 10}]}, "s.yaml")
    with pytest.raises(ConfigError, match=r"faults\[0\]\.fails_at: must be after start"):
        scenario_from_dict({**base, "faults": [{"kind": "cable_degrading", "node": "node-001", "rail": 1,
                                                "start": 10, "fails_at": 5}]}, "s.yaml")
    with pytest.raises(ConfigError, match=r"faults\[0\]\.fails_at: does not apply to flaky_cable"):
        scenario_from_dict({**base, "faults": [{"kind": "flaky_cable", "node": "node-001", "rail": 1,
                                                "start": 10, "fails_at": 50}]}, "s.yaml")
    scn = scenario_from_dict({**base, "faults": [{"kind": "cable_degrading", "node": "node-001", "rail": 1,
                                                  "start": 10, "fails_at": 300}]}, "s.yaml")
    gt = scn.ground_truth()[0]
    assert (gt.alertname, gt.component, gt.fails_at) == ("FabricCableDegrading", "node-001/mlx5_1/1", 300)


@pytest.mark.integration
def test_demo_shows_the_warning_before_the_flap(tmp_path, tree_dir):
    """``fabricmon demo --scenario`` with real agents over simulated trees (RoCE: the BER path)."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "fabricmon", "demo", "--scenario",
           str(ROOT / "examples" / "scenarios" / "cable_degrading.yaml"), "--speed", "1000", "--interval", "5",
           "--workers", "1", "--no-alertmanager", "--report-json", str(report), "--workdir", str(tree_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = json.loads(report.read_text())
    link = "node-003/mlx5_3/1"
    incs = rep["incidents"]
    warn = [i for i in incs if i["alertname"] == "FabricCableDegrading"]
    assert [i["component"] for i in warn] == [link]
    assert warn[0]["first_seen"] <= 900 - 300
    flap = [i for i in incs if i["component"] == link and i["alertname"] in ("FabricLinkDown", "FabricLinkFlapping")]
    assert flap and min(i["first_seen"] for i in flap) >= 900
    assert all(i["component"] == link for i in incs)


# ------------------------------------------------------------------ a degraded leaf's links (issue 36)


@pytest.mark.parametrize("layout", ["roce", "ib"])
def test_a_degraded_leaf_whose_optics_drift_warns_on_no_link(layout):
    """Every port of the leaf drifts as a dying cable does (sim ``optics: true``: one lane's BER climbing,
    RX power falling) while the leaf is degraded: those trends are the leaf's evidence.  Before: one
    FabricCableDegrading per link of the leaf, open until two minutes after the leaf's recovery."""
    scn = Scenario(ClusterSpec(nodes=8, layout=layout, nodes_per_unit=8, seed=4), 700.0) \
        .with_fault("leaf_degraded", unit=0, rail=2, start=60.0, end=460.0, optics=True)
    events, _ = run_engine(scn)
    cable = sorted({ev[2] for ev in events if ev[1] == "FabricCableDegrading"})
    assert cable == [], f"cable warnings on the degraded leaf's links: {cable}"
    leaf = [(t, opened) for t, a, c, opened, _ in events if a == "FabricLeafDegraded"]
    assert [o for _, o in leaf] == [True, False] and leaf[0][0] <= 75 and leaf[1][0] >= 460, leaf


def test_a_cable_warning_open_before_its_leaf_degrades_ends_with_the_leaf():
    """A genuine degrading cable warned first; its leaf then degrades for 40 s: the warning ends while the
    leaf's incident is open (the leaf is what the on-call acts on), and comes back only from new data."""
    scn = degrading("roce", 1, start=60.0, fails_at=1500.0, duration=1000.0) \
        .with_fault("leaf_degraded", unit=0, rail=3, start=600.0, end=640.0)
    events, _ = run_engine(scn)
    link = "node-003/mlx5_3/1"
    cable = [(t, opened) for t, a, c, opened, _ in events if a == "FabricCableDegrading" and c == link]
    leaf = [(t, opened) for t, a, c, opened, _ in events if a == "FabricLeafDegraded"]
    assert [o for _, o in leaf] == [True, False], leaf
    assert cable[0][1] and cable[0][0] < leaf[0][0], (cable, leaf)  # warned before the leaf
    ended = [t for t, opened in cable if not opened]
    assert ended and leaf[0][0] <= ended[0] <= leaf[1][0], (cable, leaf)
    # after the leaf recovered, the window refills from the cable's own trend before it warns again
    again = [t for t, opened in cable[1:] if opened]
    assert all(t >= leaf[1][0] + 180 for t in again), (cable, leaf)
