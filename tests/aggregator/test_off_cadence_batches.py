"""An off-cadence batch (the agent's link watch: a full poll between two regular ones, its
``interval_seconds`` shorter than the cadence) through the real Engine: the link-down evidence counts
at its own sample time, while the node's cadence (windows, lateness bound, holds, the agents-down
silence) stays what its hello announced, and a sub-threshold error rate stays below threshold."""

from __future__ import annotations

from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.lateness import LATE_INTERVALS, node_time
from support.enginerig import T0, Cluster, _port

IV = 5.0
SICK, DOWN_DEV, ERR_DEV = "node-003", "mlx5_3", "mlx5_1"


def _cluster() -> Cluster:
    c = Cluster()
    for f in c.feeds.values():
        f.interval = IV
        c.engine.hello(f.hello())
    return c


def _errors(c: Cluster, seconds: float, fraction: float) -> None:
    """symbol errors on SICK's ERR_DEV at ``fraction`` of the threshold rate, over ``seconds``."""
    s = c.engine.settings
    per_s = fraction * s.link_errors_min / s.window_s
    c.feeds[SICK].add("fabricmon_ib_port_errors_total", _port(ERR_DEV) + (("counter", "symbol_error"),),
                      round(per_s * seconds))


def _regular(c: Cluster, ts: float, first: bool = False) -> None:
    for f in c.feeds.values():
        c.engine.ingest(f.batch(ts, first=first))
    for inc in c.engine.tick(ts):
        c.reported.append((ts, inc.alertname, inc.component, inc.open))


def _run(off_cadence: bool, fraction: float = 0.6) -> tuple[Cluster, float]:
    """Regular batches every 5 s; the link goes down at T0+21.5.  With ``off_cadence`` SICK's link
    watch polls at T0+22 (interval 1 s), and its next regular batch at T0+25 covers 3 s."""
    c = _cluster()
    sick = c.feeds[SICK]
    last = T0
    for k in range(1, 9):
        ts = T0 + IV * k
        if off_cadence and k == 5:  # between T0+20 and T0+25
            t_off = T0 + 22.0
            _errors(c, t_off - last, fraction)
            sick.gauge("fabricmon_ib_port_state", _port(DOWN_DEV), 1.0)
            sick.gauge("fabricmon_ib_port_physical_state", _port(DOWN_DEV), 2.0)
            sick.add("fabricmon_ib_port_errors_total", _port(DOWN_DEV) + (("counter", "link_downed"),), 1.0)
            sick.interval = t_off - last
            assert c.engine.ingest(sick.batch(t_off))
            for inc in c.engine.tick(t_off):
                c.reported.append((t_off, inc.alertname, inc.component, inc.open))
            assert c.engine.nodes[SICK].interval == IV  # the cadence, not the 2 s since the last poll
            last = t_off
        elif not off_cadence and k == 5:
            sick.gauge("fabricmon_ib_port_state", _port(DOWN_DEV), 1.0)
            sick.gauge("fabricmon_ib_port_physical_state", _port(DOWN_DEV), 2.0)
            sick.add("fabricmon_ib_port_errors_total", _port(DOWN_DEV) + (("counter", "link_downed"),), 1.0)
        _errors(c, ts - last, fraction)
        sick.interval = ts - last
        _regular(c, ts, first=(k == 1))
        sick.interval = IV
        last = ts
    return c, last


def test_link_down_counts_at_the_off_cadence_batch_and_the_cadence_stays():
    c, _ = _run(off_cadence=True)
    down = [i for i in c.engine.incidents() if i.alertname == "FabricLinkDown"]
    assert [(i.component, i.first_seen) for i in down] == [(f"{SICK}/{DOWN_DEV}/1", T0 + 22.0)]
    assert c.engine.nodes[SICK].interval == IV  # after the 3 s regular batch that followed too
    # without the watch the same link is first seen at the next regular poll
    c2, _ = _run(off_cadence=False)
    assert [i.first_seen for i in c2.engine.incidents() if i.alertname == "FabricLinkDown"] == [T0 + 25.0]


def test_a_sub_threshold_error_rate_stays_below_threshold_across_an_off_cadence_batch():
    # 60 % of the threshold rate: the window that holds both the 5 s batch before the off-cadence one
    # and the off-cadence batch sums 7 s of errors in a 5 s window (x1.4), still under threshold once,
    # and persistence (2 of 3 windows) needs more than one window
    for fraction in (0.6, 0.9):
        c, _ = _run(off_cadence=True, fraction=fraction)
        errs = [i for i in c.engine.incidents() if i.alertname == "FabricLinkErrors"]
        assert errs == [], [(i.component, i.first_seen) for i in errs]
    # and the rate that is over threshold still fires, off-cadence batch or not
    c, _ = _run(off_cadence=True, fraction=3.0)
    assert [i.component for i in c.engine.incidents() if i.alertname == "FabricLinkErrors"] == [f"{SICK}/{ERR_DEV}/1"]


def test_agents_down_silence_and_lateness_use_the_cadence_not_the_short_batch():
    c, last = _run(off_cadence=True)
    s: DetectionSettings = c.engine.settings
    silence = max(s.agent_down_s, 5 * IV)  # 25 s at a 5 s cadence (15 s had the 2 s batch set it)
    assert silence > s.agent_down_s
    # every other node keeps reporting; SICK stops after ``last``
    t = last
    down_at = None
    while t < last + silence + 2 * IV:
        t += IV
        for name, f in c.feeds.items():
            if name != SICK:
                c.engine.ingest(f.batch(t))
        for inc in c.engine.tick(t):
            if inc.alertname == "FabricmonAgentDown" and inc.open and down_at is None:
                down_at = t
    assert down_at is not None and down_at - last >= silence, (down_at, last)
    # a batch up to 3 cadence intervals late is judged at its own time
    assert node_time(last + LATE_INTERVALS * IV, last, c.engine.nodes[SICK].interval) == last


def test_ingest_counts_the_off_cadence_batch_once():
    c, _ = _run(off_cadence=True)
    c2, _ = _run(off_cadence=False)
    assert c.engine.admission.batches_total == c2.engine.admission.batches_total + 1
    assert c.engine.admission.admission_snapshot() == {} == c2.engine.admission.admission_snapshot()
