"""`fabricmon demo`: run a simulated rail-optimized cluster end to end and report what was found.

Every node runs the real agent code (sources, poller, counter tracker) on a
generated sysfs/ethtool/NVML tree that the simulator rewrites each simulated
second; the training ranks' lines go through each node's real rank intake, each
snapshot becomes the same NodeBatch the stream client sends, crosses the stream
codec as bytes (``sim.drive``, ``--no-wire`` skips codec and intake), and the
real aggregator engine ingests it, detects, localizes and opens incidents.
When the Debian Alertmanager is installed, incidents go to a local
Alertmanager and a webhook receiver, as they would in production.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import time

import structlog

from ..aggregator.alertmanager import AlertmanagerClient
from ..aggregator.engine import Engine
from ..aggregator.runtime import AggregatorRuntime
from ..atomic import atomic_write_text
from ..configload import ConfigError
from ..sim.collector import LongRunCollector
from ..sim.drive import Drive, Pace
from ..sim.impact import fault_impacts
from ..sim.parallel import ParallelTreeCluster
from ..sim.parallel_memory import ParallelMemoryCluster
from ..sim.runner import ClusterSim, SimulatedCluster
from ..sim.scenario import Scenario, default_scenario, load_scenario
from .scoring import score

log = structlog.get_logger("fabricmon.demo")


def _fault_line(g: dict, t0: float = 0.0) -> str:
    end = f"{g['end']:.0f}" if g.get("end") is not None else "end"
    what = g.get("component") or "(no component: must raise nothing)"
    return f"{g['kind']:<16} {what:<26} t={g['start']:.0f}..{end}s  expect {g.get('alertname') or 'nothing'}"


def _scenario(args: argparse.Namespace) -> Scenario:
    if args.scenario:
        return load_scenario(args.scenario)
    return default_scenario(nodes=args.nodes, duration=args.duration, layout=args.layout, seed=args.seed)


def run_demo(args: argparse.Namespace, out=sys.stdout) -> int:
    try:
        scenario = _scenario(args)
    except ConfigError as exc:
        print(f"fabricmon: error: {exc}", file=sys.stderr)
        return 2
    if args.speed <= 0 or args.interval <= 0:
        print("fabricmon: error: --speed and --interval must be > 0", file=sys.stderr)
        return 2
    # sample times = epoch + simulated seconds, all in the wall clock's past even at --speed > 1:
    # Alertmanager sees real dates and takes a resolve's endsAt (the sample time it resolved) as past
    epoch = float(int(time.time() - scenario.duration - 60))
    workers = args.workers if args.workers is not None else min(os.cpu_count() or 1, 4)
    memory = getattr(args, "mode", "tree") == "memory"
    wired = not getattr(args, "no_wire", False)  # the codec and the rank intake, as in production
    sim: ClusterSim
    if memory and wired and workers > 1:
        # the agents' side of the wire in a worker process, the aggregator's here (sim/parallel_memory.py)
        sim = ParallelMemoryCluster(scenario, interval=args.interval, epoch=epoch,
                                    log_level=args.log_level or "warning", nccl_ras=True)
    elif memory:
        sim = SimulatedCluster(scenario, mode="memory", interval=args.interval, epoch=epoch, rank_intake=wired,
                               nccl_ras=True)
    elif workers > 1:
        sim = ParallelTreeCluster(scenario, interval=args.interval, base_dir=args.workdir, epoch=epoch,
                                  workers=workers, log_level=args.log_level or "warning", rank_intake=wired)
    else:
        sim = SimulatedCluster(scenario, mode="tree", interval=args.interval, base_dir=args.workdir, epoch=epoch,
                               rank_intake=wired, nccl_ras=True)
    engine = Engine(sim.topology, cluster=sim.topology.cluster)
    # each job's NCCL RAS on loopback (sim/ras_link.py), asked when the engine suspects a hang; the
    # multi-process tree mode's jobs live in its workers, which run no RAS
    ras = getattr(sim, "ras", None)
    if ras is not None:
        ras.attach(engine.ras_waiting, engine.take_ras_queries, engine.ras_report)
    sim.start()  # worker processes build their node trees while Alertmanager starts
    am = receiver = None
    if not args.no_alertmanager:
        from .local_alertmanager import LocalAlertmanager, WebhookReceiver

        try:
            receiver = WebhookReceiver()
            receiver.start()
            am = LocalAlertmanager(receiver.url)
            am.wait_ready()
        except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
            print(f"  (no Alertmanager: {exc}; showing the aggregator's incidents only)", file=out)
            if am is not None:
                am.stop()
            am = None
    sender = AlertmanagerClient([am.url] if am else [], cluster=sim.topology.cluster, resend_seconds=30.0)
    rt = AggregatorRuntime(engine, http_listen=("127.0.0.1", 0), sender=sender).start()
    http = rt.http
    assert http is not None  # http_listen was given
    c = scenario.cluster
    ground = sim.ground_truth()

    def p(*a: object) -> None:
        print(*a, file=out, flush=True)

    p(f"fabricmon demo: {c.nodes} nodes ({c.layout}, {c.nodes_per_unit} per unit, 8 GPUs and 8 rail NICs each), "
      f"{scenario.duration:.0f} s simulated at {args.speed:g}x, agent interval {args.interval:g} s")
    if memory:
        p("  mode memory: in-memory simulator batches -> stream codec bytes -> the server's decoder -> "
          "aggregator runtime (no sysfs trees, no gRPC framing)"
          + ("; the agents' side in a worker process" if isinstance(sim, ParallelMemoryCluster) else ""))
    elif wired:
        p("  mode tree: real agents poll rendered trees; rank lines through each node's rank intake; "
          "batches -> stream codec bytes -> the server's decoder -> aggregator runtime (no gRPC framing)")
    p(f"  aggregator: http://127.0.0.1:{http.port}/api/incidents"
      + (f"   alertmanager: {am.url}" if am else ""))
    p("  injected faults:")
    for g in ground:
        p(f"    {_fault_line(g)}")
    wall0 = time.monotonic()
    collector = LongRunCollector()  # paused while every node connects and sends its first batch (sim/collector.py)
    collector.pause()
    try:
        drive = Drive(sim, rt, wire=wired)
        drive.connect()
        wire = drive.wire
        next_progress = [0.0]
        shown: dict[str, bool] = {}
        ras_shown: set[tuple[str, str]] = set()
        pace = SimPace(args.speed)

        def on_step(st, changed) -> None:
            collector.settle()  # after the first step: the long-lived state is built
            pace.mark(sim.t)
            for inc in changed:
                if shown.get(inc.id) == inc.open:
                    continue  # an update of an incident already shown in this state
                shown[inc.id] = inc.open
                state = "OPEN    " if inc.open else "RESOLVED"
                detail = (inc.evidence[0] if inc.evidence else inc.description)[:90]
                p(f"  [t={sim.t:6.0f}s] {state} {inc.alertname:<24} {inc.component_type:<5} "
                  f"{inc.component:<24} {detail}")
            if engine.ras.jobs:  # a suspect job's RAS answer joins its JobHung's evidence when it comes
                for inc in engine.open_incidents():
                    for line in inc.evidence:
                        if line.startswith("NCCL RAS") and (inc.id, line) not in ras_shown:
                            ras_shown.add((inc.id, line))
                            p(f"  [t={sim.t:6.0f}s]          {inc.alertname:<24} {inc.component:<30} {line[:160]}")
            if sim.t < next_progress[0]:
                return
            next_progress[0] += max(scenario.duration / 10, args.interval)
            what = "node batches over the codec" if memory else "agents polled"
            wired_mb = f" ({wire.bytes_total / 1e6:.0f} MB so far)" if wire is not None else ""
            split = (f"batches + wire + ingest {st.batch_s * 1e3:.0f}" if memory else
                     f"render {st.render_s * 1e3:.0f}, poll {st.poll_s * 1e3:.0f}")
            p(f"  [t={sim.t:6.0f}s] {c.nodes} {what}{wired_mb}, {st.rank_timings} rank timings, "
              f"{len(engine.open_incidents())} open incident(s), step {st.total_s * 1e3:.0f} ms ({split})")

        steps = drive.run(pace=Pace(args.speed), on_step=on_step)
        wall = time.monotonic() - wall0
        sender.flush(timeout=3.0)
        if am is not None and receiver is not None:
            _await_webhook(engine, sender, receiver, deadline_s=10.0)
        incidents = [_rel(i.to_dict(), epoch) for i in engine.incidents()]
        decoys = sim.decoys_truth()
        jobs = sim.jobs_truth()  # step times are simulated seconds since the scenario started
        for g, impact in zip(ground, fault_impacts(scenario, args.interval), strict=True):
            g["impact"] = impact  # each fault's standalone cost to each job (sim/impact.py)
        scores = score(ground, incidents, duration=scenario.duration, decoys=decoys)
        notes = notifications(receiver, pace) if receiver is not None and am is not None else None
        _report(p, ground, incidents, scores, notes, wall, steps, jobs, decoys)
        if args.report_json:
            report = {"scenario": scenario.to_dict() if hasattr(scenario, "to_dict") else None,
                      "faults": ground, "jobs": jobs, "decoys": decoys, "incidents": incidents, "scores": scores,
                      "alertmanager_notifications": notes,
                      "wall_seconds": round(wall, 2)}
            atomic_write_text(args.report_json, json.dumps(report, indent=2, default=str) + "\n")
            p(f"  report written to {args.report_json}")
        return 0
    finally:
        collector.restore()
        rt.stop(grace=0, flush=1.0, final_tick=False)
        sim.close()
        if am is not None:
            am.stop()
        if receiver is not None:
            receiver.stop()


def _await_webhook(engine: Engine, sender: AlertmanagerClient, receiver, deadline_s: float) -> None:
    """Wait (bounded) until the webhook has heard the last state of every incident sent.

    Alertmanager notifies within its group_interval (1 s here); waiting for exactly what is
    expected ends the demo as soon as the report is complete.
    """
    want = {(i.alertname, i.component): "firing" if i.open else "resolved" for i in engine.incidents()}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not sender.pending():
            last: dict = {}
            for _, status, alert in receiver.alerts():
                lab = alert.get("labels", {})
                last[(lab.get("alertname"), lab.get("component"))] = status
            if all(last.get(k) == v for k, v in want.items()):
                return
        time.sleep(0.05)


class SimPace:
    """Wall time -> simulated seconds, from the wall time each simulated step finished."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.walls: list[float] = []
        self.sims: list[float] = []

    def mark(self, sim_t: float) -> None:
        self.walls.append(time.time())
        self.sims.append(sim_t)

    def sim_at(self, wall: float) -> float:
        i = bisect.bisect_right(self.walls, wall) - 1
        if i < 0:
            return 0.0
        t = self.sims[i] + (wall - self.walls[i]) * self.speed
        return min(t, self.sims[i + 1]) if i + 1 < len(self.sims) else t


def notifications(receiver, pace: SimPace) -> list[dict]:
    """Every alert of every webhook notification, in arrival order, ``at`` in simulated seconds."""
    out = []
    for arrival, status, alert in sorted(receiver.alerts(), key=lambda x: x[0]):
        lab = alert.get("labels", {})
        out.append({"status": status, "alertname": lab.get("alertname"), "component": lab.get("component"),
                    "at": round(pace.sim_at(arrival), 1)})
    return out


def still_firing(notes: list[dict]) -> list[tuple[str, str]]:
    """Alerts whose last notification was firing: what Alertmanager still shows."""
    last: dict[tuple[str, str], str] = {}
    for n in notes:
        last[(n["alertname"], n["component"])] = n["status"]
    return sorted(k for k, v in last.items() if v == "firing")


def _rel(d: dict, epoch: float) -> dict:
    out = {k: d[k] for k in ("id", "alertname", "component_type", "component", "evidence", "ranks", "jobs",
                             "impact")}
    out["severity"] = d.get("severity")
    out["description"] = d.get("description")
    for k in ("first_seen", "last_seen", "resolved_at"):
        out[k] = None if d[k] is None else round(d[k] - epoch, 3)
    return out


def _report(p, ground, incidents, scores, notes, wall, steps, jobs=(), decoys=()) -> None:
    p("")
    p(f"Report ({steps} steps in {wall:.1f} s wall)")
    for j in jobs:
        p(f"  job {j['name']}: {j['gpus']} GPUs on {len(j['nodes'])} nodes, {len(j['step_times'])} steps")
    for k, d in enumerate(decoys):
        where = d.get("job") or d.get("node")
        per = scores["per_decoy"][k]
        found = [i for i in incidents if i["id"] in per["info_ids"]]
        what = ", ".join(f"{i['alertname']} {i['component']}" for i in found[:2]) or "nothing raised"
        p(f"  decoy {d['kind']:<18} {where:<24} {what} ({len(found)} info finding(s), {len(per['page_ids'])} page(s))")
    p("  injected fault                             detected as                                   delay  resolved")
    for g in ground:
        hits = [i for i in incidents if g.get("component") and i["component"] == g["component"]]
        if not g.get("component"):
            p(f"  {g['kind']:<16} (not a fault)              {'nothing raised, as expected' if not incidents else ''}")
            continue
        if not hits:
            p(f"  {g['kind']:<16} {g['component']:<26} MISSED")
            continue
        h = min(hits, key=lambda i: i["first_seen"])
        if h["resolved_at"] is not None:
            res = f"{h['resolved_at']:.0f}s"
        elif g.get("end") is not None:
            res = "open (clears after 10-15 s of clean counters)"  # the hold that keeps alerts from flapping
        else:
            res = "open"
        p(f"  {g['kind']:<16} {g['component']:<26} {h['alertname']:<24} {h['component_type']:<6} "
          f"{h['first_seen'] - g['start']:+6.1f}s  {res}")
        if h.get("impact"):  # what the aggregator measured (alerts carry it as the impact annotation)
            p("    incident impact: " + "; ".join(
                f"{x['job']} " + ("stopped" if x["stopped"] else "no clean baseline" if x["step_slowdown"] is None
                                  else f"{x['step_slowdown'] * 100:.1f}% slower")
                + f" ({x['gpu_hours_per_hour']:.0f} GPU-hours/hour)" for x in h["impact"]))
        if g.get("impact"):
            p("    truth (standalone): " + "; ".join(f"{x['job']} {x['step_slowdown'] * 100:.1f}% slower"
                                                   for x in g["impact"]))
    extra = [i for i in incidents if i["id"] in scores["unmatched_incidents"]]  # pages only (info: per decoy)
    for i in extra:
        p(f"  (unexpected) {i['alertname']} {i['component_type']} {i['component']} at t={i['first_seen']:.0f}s")
    p(f"  pages {scores['pages']}  precision {scores['precision']:.2f}  recall {scores['recall']:.2f}  "
      f"median detection delay {scores['median_detection_delay_s']} s (simulated)")
    if notes:
        firing = sum(1 for n in notes if n["status"] == "firing")
        resolved = sum(1 for n in notes if n["status"] == "resolved")
        p(f"  Alertmanager webhook: {firing} firing and {resolved} resolved notifications received")
        for n in notes:
            p(f"    [t={n['at']:6.0f}s] {n['status']:<8} {n['alertname']:<24} {n['component']}")
        stuck = still_firing(notes)
        if stuck:
            p("  still firing at Alertmanager: " + ", ".join(f"{a} {c}" for a, c in stuck))
