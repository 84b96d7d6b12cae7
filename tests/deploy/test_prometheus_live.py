"""Deploy and view, end to end: real agents (simulated cluster) -> real Prometheus with the
repository's recording and alert rules -> every dashboard query, and the alerts on the faults.

One scenario, 8 RoCE nodes in 2 units of 4, run at wall-clock speed (sample time = wall time,
1 s agent interval, 1 s scrape and rule evaluation), with the aggregator engine's HTTP API
(fed the same agent batches) and a probe agent on node-000 (host source, rank intake fed the
synthetic job's step timings, NCCL Inspector tail, a fake-NVML GPU with PCIe replays and a
non-fatal XID, which the simulator's NVML leaves out) as further scrape targets, so every
dashboard panel has a real exporter behind it.  Faults from t=5 s:

    flaky_cable   node-002 rail 3        FabricLinkErrors   (for: 1m)
    config_drift  node-005 rail 1        FabricConfigDrift  (for: 1m)
    link_down     node-006 rail 6        FabricLinkDown     (for: 15s)
    pfc_storm     node-003 rail 2        FabricPFCStorm     (for: 30s)
    nvlink_down   node-007 gpu 1 link 2  NVLinkDown         (for: 15s)
    slow_gpu      node-001 gpu 2         (aggregator only; gives the throttle panel data)

Checked: every panel query and template variable of dashboards/json runs without error; every
panel outside ``MAY_BE_EMPTY`` returns data; every metric a dashboard names is present in this
Prometheus (agents, probe agent, aggregator, recording rules); every alert rule evaluates
healthily; each fault's alert goes active on the faulted component within ``ACTIVE_BOUND_S``,
and the alerts whose ``for:`` fits the test (<= 30 s) fire within ``FIRING_BOUND_S``; no alert
fires on a healthy component.  The injection -> pending/firing times are printed (``-s``);
benchmarks/bench_prometheus_rules.py measures firing with the full ``for:`` for more kinds.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path

import pytest

from support.dashboards import _panels, metric_names
from support.promlive import substitute
from support.promtools import REPO, RULE_FILES, alert_for_seconds, http, live_fabric, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DASHBOARDS = sorted((REPO / "dashboards" / "json").glob("*.json"))
FAULT_START = 5.0
ACTIVE_BOUND_S = 30.0   # injection -> alert pending (expression true) on the faulted component
FIRING_BOUND_S = 60.0   # injection -> firing, for alerts with for: <= 30s

# Panels allowed to return nothing in this scenario, with the reason (title -> why).
MAY_BE_EMPTY = {
    "Saturated counters (rate unknown)": "no PMA counter pins at its maximum in 60 s of simulated errors",
    "Collectors up (nodes failing per collector)": "no collector fails (count of collectors == 0)",
    "Spines and rails: worst open incident": "no spine or whole-rail fault in this scenario (present only while one is "
                                             "open)",
    "Software findings (info, never paged)": "no software decoy in this one-job scenario "
                                             "(tests/deploy/test_dashboard_jobs.py runs two jobs with decoys)",
    "Stragglers and hangs (pages)": "the slow GPU's StragglerRank needs most of 10 slow steps, the panels are "
                                    "read 8 s after injection (tests/deploy/test_dashboard_jobs.py has one open)",
    **dict.fromkeys((
        "Uplinks: worst open incident, leaf x spine", "Uplinks: error rate, leaf x spine", "Switch ports down",
        "Switch ports: most errors", "Switch ports: most transmit wait", "Leaf port errors (switch end)",
        "Leaf port transmit wait (switch end)", "Leaf port state (switch end)"),
        "no switch sweep in this cluster (tests/deploy/test_dashboards_uplinks_live.py reads them with one)"),
}
# Families a dashboard names that this cluster does not export, by why (their names are checked against
# the real collectors in tests/deploy/test_dashboards.py and test_dashboard_jobs.py).
EXPORTED_ONLY_WITH = (
    "fabricmon_stream_",  # an agent's stream to an aggregator: these agents are scraped, they do not stream
    "fabricmon_switch",  # the switch sweep (sources.ib_switches), off by default
)
# Alerts a fault may legitimately raise besides its own (component ids are checked for those).
SECONDARY = {"FabricCongestion"}  # a PFC storm pauses its partner: congestion there is the symptom
# May go pending (never fire) on a loaded test machine: one 1 s scrape that timed out is up == 0.
# FabricmonAggregatorDown: pending from Prometheus' start until the aggregator's first scrape (no `up` yet).
TRANSIENT = {"FabricmonAgentDown", "FabricmonAggregatorDown"}
# FabricmonCollectorFailing may go pending where one poll overran its deadline on a loaded machine (the agent
# logs source_timeout and reports collector_up 0 for that poll): allowed only where that collector is up again
# and was down in at most this many of its samples, so a collector that fails for real is still a stray.
COLLECTOR_BLIPS = 3


def _scenario():
    from fabricmon.sim.scenario import ClusterSpec, Scenario

    scn = Scenario(ClusterSpec(8, "roce", 4, seed=11), 150.0)
    scn = scn.with_fault("flaky_cable", node="node-002", rail=3, start=FAULT_START)
    scn = scn.with_fault("config_drift", node="node-005", rail=1, start=FAULT_START)
    scn = scn.with_fault("link_down", node="node-006", rail=6, start=FAULT_START)
    scn = scn.with_fault("pfc_storm", node="node-003", rail=2, start=FAULT_START)
    scn = scn.with_fault("nvlink_down", node="node-007", gpu=1, link=2, start=FAULT_START)
    return scn.with_fault("slow_gpu", node="node-001", gpu=2, start=FAULT_START)


def panel_queries() -> list[tuple[str, str, str, dict]]:
    """(dashboard, panel title, expr, field defaults) for every target of every panel."""
    out = []
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        for p in _panels(d):
            for t in p.get("targets", []):
                out.append((path.stem, p["title"], t["expr"], p["fieldConfig"]["defaults"]))
    return out


def variable_queries() -> list[tuple[str, str, str, str, bool]]:
    """(dashboard, variable, metric selector or instant query, label, instant) of every query variable:
    label_values(selector, label), or query_result(query) with the value taken from a label by its regex."""
    out = []
    for path in DASHBOARDS:
        for v in json.loads(path.read_text())["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"])
            if m:
                out.append((path.stem, v["name"], substitute(m.group(1)), m.group(2), False))
                continue
            q = re.fullmatch(r"query_result\((.*)\)", v["definition"])
            lab = re.fullmatch(r'/(\w+)="\(\[\^"\]\+\)"/', v["regex"])
            assert q and lab, f"{path.name}: variable {v['name']}: neither label_values(selector, label) nor " \
                              f"query_result(query) with a label regex: {v['definition']} {v['regex']}"
            out.append((path.stem, v["name"], substitute(q.group(1)), lab.group(1), True))
    return out


def _label_values(prom, label: str, match: str | None = None) -> list[str]:
    q = f"?match[]={urllib.parse.quote(match)}" if match else ""
    status, body = http("GET", f"{prom.url}/api/v1/label/{label}/values{q}")
    assert status == 200 and body["status"] == "success", body
    return body["data"]


def wait_for_alerts(lf, want: dict[tuple[str, str], dict], injected: dict[tuple[str, str], float],
                    deadline: float) -> None:
    """Until every wanted (alertname, component) went pending and, where ``must_fire``, fired (or the
    deadline), then fill each record's ``pending``/``firing`` seconds after injection."""
    def done() -> bool:
        active, firing, _ = lf.watcher.snapshot()
        return all(k in active and (k in firing or not r["must_fire"]) for k, r in want.items())

    end = time.monotonic() + deadline
    while not done() and time.monotonic() < end:
        time.sleep(0.2)
    active, firing, _ = lf.watcher.snapshot()
    for k, r in want.items():
        if k in active:
            r["pending"] = active[k] - injected[k]
        if k in firing:
            r["firing"] = firing[k] - injected[k]


def test_dashboards_and_alerts_on_live_data(tmp_path: Path) -> None:
    scn = _scenario()
    truth = [g for g in scn.ground_truth() if g.alertname and g.kind != "slow_gpu"]
    for_s = alert_for_seconds()
    t0 = time.monotonic()
    # One aggregator replica down: the fault rules, the aggregator's fallback, speak (with every
    # replica up they are silent: tests/aggregator/test_one_sender.py).
    with live_fabric(scn, tmp_path, rule_files=RULE_FILES, down_aggregator_replica=True) as lf:
        prom = lf.prom
        injected = {(g.alertname, g.component): lf.epoch + g.start for g in truth}
        want = {(g.alertname, g.component): {"kind": g.kind, "must_fire": for_s[g.alertname] <= 30,
                                             "labels": {k: str(v) for k, v in (("node", g.node), ("rail", g.rail),
                                                        ("leaf", g.leaf), ("gpu", g.gpu)) if v is not None}}
                for g in truth}

        # Data: every scrape target up, a [4s] rate exists, the fault is a few samples old.
        targets = len(lf.sim.tree_agents.http_ports) + 2  # + probe agent + aggregator
        wait_until(lambda: len(prom.query("up == 1")) == targets, 20.0, f"{targets} targets up", interval=0.2)
        wait_until(lambda: time.time() - lf.epoch > FAULT_START + 8, 30.0, "8 s of faulted samples", interval=0.2)
        wait_until(lambda: prom.query("fabricmon:ib_port:info{leaf!=''}")
                   and prom.query('fabricmon_fabric_config_ok == 0')
                   and prom.query("rate(fabricmon_pfc_pause_seconds_total[4s]) > 0")
                   and prom.query("fabricmon_rank_step_seconds")
                   and prom.query("fabricmon_nccl_bus_bandwidth_bytes_per_second")
                   and prom.query("fabricmon_component_suspicion")
                   and prom.query('fabricmon_incident_open{leaf!=""}'),
                   20.0, "fault data, rank timings, NCCL and aggregator series in Prometheus", interval=0.5)

        # A panel that joins two series (a job's NCCL bandwidth on the nodes of its rank timings) has data
        # once both sides share a scrape: on a busy machine a few seconds after each side alone.  Wait for
        # every panel outside MAY_BE_EMPTY to have some (bounded: 45 s, as a 2-core CI machine running the
        # whole suite on both cores once took over 20 s for the job's NCCL bandwidth join), then check
        # them all below.
        # A panel counts as having data once any of these checks saw some: a per-poll gauge (the NCCL bus
        # bandwidth of the collectives seen that poll) is absent from a scrape whose poll saw none, so a
        # later instant query can miss what an earlier one showed.
        seen: set[tuple[str, str]] = set()

        def _panels_with_data() -> bool:
            ok = True
            for dash, title, expr, _ in panel_queries():
                if title in MAY_BE_EMPTY or (dash, title) in seen:
                    continue
                try:
                    if prom.query(substitute(expr)):
                        seen.add((dash, title))
                    else:
                        ok = False
                except RuntimeError:
                    pass  # a failing query is reported by the checks below
            return ok

        end = time.monotonic() + 45.0
        while not _panels_with_data() and time.monotonic() < end:
            time.sleep(0.5)

        # 1) every dashboard query runs; panels outside MAY_BE_EMPTY have data.
        #    Values respect the panel's axis: >= min, and shares (percentunit) within 0..1.
        errors, empty, counts, out_of_range = [], [], {}, []
        for dash, title, expr, defaults in panel_queries():
            try:
                res = prom.query(substitute(expr))
            except RuntimeError as exc:
                errors.append(f"{dash} / {title}: {exc}")
                continue
            counts[(dash, title)] = counts.get((dash, title), 0) + len(res)
            lo = defaults.get("min")
            hi = 1.0 if defaults["unit"] == "percentunit" else defaults.get("max")
            for r in res:
                v = float(r["value"][1])
                # A 4 s rate() over 1 s scrapes of a 1 s poll sees 3 or 5 polls' worth of counter in
                # a 4 s window when scrape and poll phases drift (busy 2-core CI): allow that jitter.
                if (lo is not None and v < lo - 1e-9) or (hi is not None and v > hi * 1.5):
                    out_of_range.append(f"{dash} / {title}: {r['metric']} = {v} (axis {lo}..{hi})")
        for (dash, title), n in counts.items():
            if n == 0 and title not in MAY_BE_EMPTY and (dash, title) not in seen:
                empty.append(f"{dash} / {title}")
        assert not errors, "dashboard queries failing in Prometheus:\n" + "\n".join(errors)
        assert not empty, "panels with no data on a live cluster:\n" + "\n".join(empty)
        assert not out_of_range, "panel values off their axis:\n" + "\n".join(out_of_range[:20])
        for path in DASHBOARDS:  # incident annotations: run, and show the open incidents
            for a in json.loads(path.read_text())["annotations"]["list"]:
                if a.get("expr"):
                    assert prom.query(substitute(a["expr"])), f"{path.stem}: annotation {a['name']!r} has no data"
        for title in MAY_BE_EMPTY:
            assert any(t == title for _, t in counts), f"MAY_BE_EMPTY names no panel: {title!r}"
        for dash, var, match, label, instant in variable_queries():
            values = ([r["metric"][label] for r in prom.query(match) if label in r["metric"]] if instant
                      else _label_values(prom, label, match))
            if var in ("cluster", "job_id"):
                # cluster: an external label in a single Prometheus; job_id: this job sends none.
                # Absent either way, and "All" (.*) matches
                continue
            assert values, f"{dash}: variable ${var} has no values ({label} of {match})"
        assert set(_label_values(prom, "leaf", "fabricmon:ib_port:info")) == {
            f"leaf-u{u}-r{r}" for u in range(2) for r in range(8)}

        # 2) every metric a dashboard names is exported by something Prometheus scrapes here
        #    (or recorded by the rules, which then also produced it from the live data).
        present = set(_label_values(prom, "__name__"))
        named = set()
        for _, _, expr, _ in panel_queries():
            named |= metric_names(expr)
        for _, _, match, _, _ in variable_queries():
            named |= metric_names(match)
        missing = {n for n in named - present if not n.startswith(EXPORTED_ONLY_WITH)}
        assert missing == set(), f"dashboards name metrics nothing exports: {sorted(missing)}"
        agg_instance = [t for t in prom.query("up == 1") if t["metric"]["job"] == "fabricmon-aggregator"]
        agg_names = set(_label_values(prom, "__name__", f'{{instance="{agg_instance[0]["metric"]["instance"]}"}}'))
        from support.dashboards import AGGREGATOR_METRICS

        assert AGGREGATOR_METRICS <= agg_names, f"not from the aggregator: {AGGREGATOR_METRICS - agg_names}"

        # 3) the rules are healthy on real data, and the alerts find the faults.
        wait_for_alerts(lf, want, injected, deadline=max(5.0, FIRING_BOUND_S + FAULT_START - (time.time() - lf.epoch)))
        _, body = http("GET", f"{prom.url}/api/v1/rules")
        bad = [(r["name"], r.get("lastError")) for g in body["data"]["groups"] for r in g["rules"]
               if r["health"] != "ok"]
        assert not bad, f"rules failing on live data: {bad}"
        _, fired, seen = lf.watcher.snapshot()
        down_replica = {(t["metric"]["job"], t["metric"]["instance"]) for t in prom.query("up == 0")}
        still_down = {t["metric"]["node"] for t in prom.query("fabricmon_collector_up == 0")}
        blipped = {t["metric"]["node"] for t in prom.query(
            f"max by (node) (count_over_time((fabricmon_collector_up == 0)[10m:1s])) <= {COLLECTOR_BLIPS}")}
        stray = sorted(k for k in seen if k not in want and k[0] not in SECONDARY
                       and not (k[0] in TRANSIENT and k not in fired)
                       and not (k[0] == "FabricmonCollectorFailing" and k not in fired
                                and k[1] in blipped - still_down)
                       # the replica this test keeps down, on purpose
                       and not (k[0] == "FabricmonAggregatorDown"
                                and ("fabricmon-aggregator", k[1]) in down_replica))
        secondary = sorted(k for k in seen if k not in want and k not in stray)
        missed = prom.query('min_over_time(up[10m]) == 0')
        assert lf.errors == [], lf.errors
    wall = time.monotonic() - t0

    lines = [f"{'fault':<14} {'alert':<18} {'component':<22} {'for':>5} {'pending_s':>9} {'firing_s':>8}"]
    for (alert, comp), r in want.items():
        lines.append(f"{r['kind']:<14} {alert:<18} {comp:<22} {for_s[alert]:>5.0f} "
                     f"{r.get('pending', float('nan')):>9.1f} {r.get('firing', float('nan')):>8.1f}")
    print("\ninjection -> Prometheus alert (1 s scrape/eval, rules as shipped), test wall "
          f"{wall:.1f} s\n" + "\n".join(lines) + (f"\nalso pending (allowed): {secondary}" if secondary else "")
          + (f"\ntargets with a missed scrape: {[m['metric']['instance'] for m in missed]}" if missed else ""))
    assert not stray, f"alerts on components without a fault: {stray}"
    for key, r in want.items():  # the DESIGN contract labels Alertmanager groups and inhibits on
        got = {k: seen.get(key, {}).get(k) for k in r["labels"]}
        assert got == r["labels"], f"{key}: alert labels {got}, ground truth {r['labels']}"
    for (alert, comp), r in want.items():
        assert "pending" in r and r["pending"] <= ACTIVE_BOUND_S, \
            f"{alert} on {comp} not active within {ACTIVE_BOUND_S} s of injection: {r}"
        if r["must_fire"]:
            assert "firing" in r and r["firing"] <= FIRING_BOUND_S, \
                f"{alert} on {comp} not firing within {FIRING_BOUND_S} s of injection: {r}"
