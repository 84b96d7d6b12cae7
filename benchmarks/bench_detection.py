"""Detection quality on randomized scenarios: precision, recall and time to detect, per fault kind.

    .venv/bin/python benchmarks/bench_detection.py [--scenarios 60] [--overlap 30] [--nodes 32]
        [--duration 240] [--am-subset 10] [--out results.md] [--json results.json]

Each scenario comes from ``fabricmon.sim.scenario.random_scenario(seed)`` (fixed seeds
``--seed0 .. --seed0 + scenarios - 1``), followed by ``--overlap`` scenarios of overlapping
faults (``overlap_scenario(seed)``, seeds after those): a fault on a link under a leaf that
degrades later (the link fault ending while the leaf is degraded, or outliving it), or a slow GPU
on a node whose NIC is bad (on the GPU's own rail or another).  Overlapping faults are where
incident ownership goes wrong (a link alert folded into its leaf and never resolved, a compute
straggler blamed on the bad NIC beside it): both faults must be found.  The simulator runs in memory
mode (the NodeBatches the agents would stream), a fresh ``Engine`` ingests them and is ticked every interval at the
newest sample time, and ``fabricmon.demo.scoring.score`` scores the incidents against the
ground truth.  Precision and recall are micro-averaged over all scenarios (incidents and
faults summed), the delays are sample seconds from injection to incident open.

For the first ``--am-subset`` scenarios with faults the incidents also go through the real
``AlertmanagerClient`` to a real Alertmanager on 127.0.0.1 (group_wait 0s, group_interval 1s)
and a local webhook receiver: the wall latency from ``submit`` to webhook arrival is measured
and added to the sample-time detection delay (injection -> notification at the receiver).
Without the Alertmanager binary that column says so and the rest still runs.

``--scenario FILE`` (repeatable) adds scenario files (``benchmarks/scenarios/``), run after the others.
Every run counts the ``FabricCableDegrading`` incidents on links of a leaf that a ``leaf_degraded`` fault
degrades (the leaf's own evidence, never a cable ticket each; goal 0).

``--cost K`` adds K scenarios where cost goes wrong (``cost_scenario``): two jobs, a lone slow GPU on one
(every rank waits for it), a bad NIC and a slow GPU overlapping in time on the other; each (fault, job)
pair's estimate is held to its standalone truth (the bound and cases below).

``--workload K`` adds K scenarios of several jobs with software decoys (``workload_scenario``:
two or three jobs, idle nodes between, one to three of the seven decoy kinds of DESIGN "Jobs,
decoys and cost", zero to two faults away from the decoys).  Precision counts pages (warning or
critical), decoys must page nobody and raise at most one info finding each.  ``--mode tree`` runs
real agents over rendered node trees instead of the in-memory batches.  The run ends with one line,
``detection verdict: ok ...`` or ``detection verdict: FAIL <why>`` (exit 1), against the goals:
precision >= 0.97, recall >= 0.95, hard faults (link_down, link_flap, link_degraded, nvlink_down,
flaky_cable) first seen <= 3 s after the first poll that could see them and the others <= 12 s (at
1 s polls; at a longer interval plus the confirming window's extra time, ``(persist_windows - 1) x
(interval - window_s)``: 4 s at 5 s polls), zero decoy pages, at most one info finding per decoy,
cost within bounds for >= 90% of the (fault, hurt job) pairs (a fault not localized counts its pairs
out of bounds).

``--switch K`` adds K scenarios of one switch-side fault each (``switch_scenario``: ``uplink_flaky``,
``uplink_down``, ``spine_degraded``, ``switch_congestion`` and ``flaky_cable`` counting at both ends, in
turn) on a ``--switch-nodes`` cluster (1,024 by default) with 4 spines and 4 uplinks per leaf, one job on
every node; the simulated sweep is streamed by the first node (memory mode).  Goals there: precision and
recall as above, switch-side faults first seen <= 40 s after injection (a sweep every 10 s, then the
detectors' windows of one sweep each), and no StragglerRank or SlowRanksSharedComponent page for the
victims of an uplink or spine (their stragglers ride on its alert).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fabricmon.aggregator.alertmanager import AlertmanagerClient  # noqa: E402
from fabricmon.aggregator.config import DetectionSettings  # noqa: E402
from fabricmon.aggregator.engine import Engine  # noqa: E402
from fabricmon.aggregator.runtime import AggregatorRuntime  # noqa: E402
from fabricmon.atomic import atomic_write_text  # noqa: E402
from fabricmon.demo.local_alertmanager import WebhookReceiver  # noqa: E402
from fabricmon.demo.scoring import score  # noqa: E402
from fabricmon.sim.drive import Drive  # noqa: E402
from fabricmon.sim.hw import NGPU, NRAILS  # noqa: E402
from fabricmon.sim.impact import fault_impacts  # noqa: E402
from fabricmon.sim.runner import SimulatedCluster  # noqa: E402
from fabricmon.sim.scenario import (  # noqa: E402
    SWITCH_KINDS,
    ClusterSpec,
    Fault,
    Scenario,
    load_scenario,
    random_scenario,
    scenario_from_dict,
)
from fabricmon.topology import node_name  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection_verdict import (  # noqa: E402
    HARD_S,
    OTHER_S,
    confirm_s,
    judge_cost,
    late_detections,
    pair_table,
)

LINK_UNDER_LEAF = ("flaky_cable", "link_down", "link_flap", "link_degraded", "rdma_retransmits")
BAD_NIC = ("flaky_cable", "rdma_retransmits", "link_degraded")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _rel(inc, epoch: float) -> dict:
    d = inc.to_dict()
    out = {k: d[k] for k in ("id", "alertname", "component_type", "component", "severity", "impact")}
    for k in ("first_seen", "last_seen", "resolved_at"):
        out[k] = None if d[k] is None else d[k] - epoch
    return out


class AmRig:
    """A real Alertmanager + webhook receiver; latency of each submitted incident to the webhook."""

    CONFIG = {
        "route": {"receiver": "hook", "group_by": ["cluster", "alertname", "component"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": "", "send_resolved": True}]}],
    }

    def __init__(self) -> None:
        # tests/support imports its siblings as the top-level package ``support`` (tests/ on the path)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from support.promtools import start_alertmanager

        self.receiver = WebhookReceiver()
        self.receiver.start()
        cfg = json.loads(json.dumps(self.CONFIG))
        cfg["receivers"][0]["webhook_configs"][0]["url"] = self.receiver.url
        self._dir = tempfile.TemporaryDirectory(prefix="fabricmon-bench-am-")
        self.am = start_alertmanager(cfg, Path(self._dir.name))

    @property
    def url(self) -> str:
        return self.am.url

    def arrivals(self) -> dict[str, float]:
        """incident_id -> wall time the first firing notification for it arrived."""
        out: dict[str, float] = {}
        for t, status, a in self.receiver.alerts():
            iid = (a.get("annotations") or {}).get("incident_id")
            if status == "firing" and iid and iid not in out:
                out[iid] = t
        return out

    def close(self) -> None:
        self.am.stop()
        self.receiver.stop()
        self._dir.cleanup()


def overlap_scenario(seed: int, nodes: int, duration: float, nodes_per_unit: int) -> Scenario:
    """Two overlapping faults on one path: a link fault then its leaf degrading, or a slow GPU on a
    node with a bad NIC (half the time the NIC of the GPU's own rail)."""
    rng = random.Random(seed)
    layout = rng.choice(("ib", "roce"))
    scn = Scenario(ClusterSpec(nodes=nodes, layout=layout, nodes_per_unit=nodes_per_unit, seed=seed),
                   float(duration))
    idx = rng.randrange(nodes)
    node, unit = node_name(idx, nodes), idx // nodes_per_unit
    r = lambda lo, hi: float(round(rng.uniform(lo, hi) * duration))  # noqa: E731
    if rng.random() < 0.5:
        rail = rng.randrange(NRAILS)
        link_start = r(0.08, 0.2)
        leaf_start = link_start + r(0.12, 0.2)
        leaf_end = leaf_start + r(0.2, 0.3)
        # the link fault ends while its leaf is degraded, or outlives the leaf
        link_end = leaf_start + r(0.08, 0.15) if rng.random() < 0.5 else leaf_end + r(0.08, 0.15)
        kind = rng.choice(LINK_UNDER_LEAF)
        return (scn.with_fault(kind, node=node, rail=rail, start=link_start, end=min(link_end, duration))
                .with_fault("leaf_degraded", unit=unit, rail=rail, start=leaf_start, end=min(leaf_end, duration)))
    gpu = rng.randrange(NGPU)
    rail = gpu if rng.random() < 0.5 else rng.choice([x for x in range(NRAILS) if x != gpu])
    nic_start, gpu_start = r(0.1, 0.3), r(0.1, 0.3)
    return (scn.with_fault(rng.choice(BAD_NIC), node=node, rail=rail, start=nic_start,
                           end=min(nic_start + r(0.3, 0.5), duration))
            .with_fault("slow_gpu", node=node, gpu=gpu, start=gpu_start, end=min(gpu_start + r(0.3, 0.5), duration)))


def cost_scenario(seed: int, nodes: int, duration: float, nodes_per_unit: int) -> Scenario:
    """Where cost goes wrong (issue: a lone straggler costed 0, an overlap split one slowdown): two jobs
    (three quarters of the nodes and the rest); on the big job a lone slow GPU (one rank +20..60%, every
    rank waits) alone in time; on the small job a bad NIC and a slow GPU on another node that overlap in
    time (the issue's cable fault during a straggler's slowdown)."""
    rng = random.Random(seed)
    layout = rng.choice(("ib", "roce"))
    big = (3 * nodes) // 4
    scn = scenario_from_dict({"cluster": {"nodes": nodes, "layout": layout, "nodes_per_unit": nodes_per_unit,
                                          "seed": seed},
                              "duration": duration,
                              "jobs": [{"name": "llm-70b", "nodes": [0, big - 1]},
                                       {"name": "vlm-13b", "nodes": [big, nodes - 1]}]}, f"<cost seed {seed}>")
    r = lambda lo, hi: float(round(rng.uniform(lo, hi) * duration))  # noqa: E731
    lone_start = r(0.25, 0.35)
    lone = Fault("slow_gpu", start=lone_start, end=lone_start + r(0.2, 0.3), node=node_name(rng.randrange(big), nodes),
                 gpu=rng.randrange(NGPU), magnitude=round(rng.uniform(1.2, 1.6), 2))
    # two nodes of the job (a slow GPU behind its own bad NIC is the link's incident, overlap_scenario's case)
    a, b = rng.sample(range(big, nodes), 2)
    gpu = rng.randrange(NGPU)
    rail = gpu if rng.random() < 0.5 else rng.choice([x for x in range(NRAILS) if x != gpu])
    nic_start = r(0.25, 0.35)
    gpu_start = nic_start + r(0.05, 0.15)
    nic = Fault(rng.choice(BAD_NIC), start=nic_start, end=min(nic_start + r(0.3, 0.45), duration),
                node=node_name(a, nodes), rail=rail)
    slow = Fault("slow_gpu", start=gpu_start, end=min(gpu_start + r(0.2, 0.35), duration), node=node_name(b, nodes),
                 gpu=gpu, magnitude=round(rng.uniform(1.2, 1.6), 2))
    out = replace(scn, faults=(lone, nic, slow))
    out.validate("", f"<cost seed {seed}>")
    return out


DECOY_KINDS = ("stage_imbalance", "seqlen_imbalance", "host_pause", "dataloader_slow", "checkpoint",
               "job_restart", "background_errors")


def workload_scenario(seed: int, nodes: int, duration: float, nodes_per_unit: int) -> Scenario:
    """Two or three jobs with idle nodes between, one to three software decoys, zero to two faults on
    nodes no decoy touches (a fault there is the fault's, a decoy there the decoy's)."""
    rng = random.Random(seed)
    layout = rng.choice(("ib", "roce"))
    names = [node_name(i, nodes) for i in range(nodes)]
    a_n = max(4, (nodes * rng.choice((2, 3))) // 4 // 4 * 4)
    a_pp = rng.choice([p for p in (1, 2, 4) if a_n % p == 0 and a_n // p >= 2])
    rest = nodes - a_n - 1  # one idle node at least
    jobs = [{"name": "llm-70b", "nodes": [0, a_n - 1], "pp": a_pp}]
    if rest >= 3:
        b_n = rng.randint(3, max(3, rest - 1))
        jobs.append({"name": "vlm-13b", "nodes": names[a_n + 1:a_n + 1 + b_n],
                     "start": float(round(rng.uniform(0, 0.1) * duration))})
    by_job = {j["name"]: (names[j["nodes"][0]:j["nodes"][1] + 1] if isinstance(j["nodes"][0], int) else j["nodes"])
              for j in jobs}
    in_job = [n for v in by_job.values() for n in v]
    idle = [n for n in names if n not in in_job]
    decoys: list[dict] = []
    touched: set[str] = set()
    r = lambda lo, hi: float(round(rng.uniform(lo, hi) * duration))  # noqa: E731
    for kind in rng.sample(DECOY_KINDS, rng.randint(1, 3)):
        job = rng.choice(list(by_job))
        if kind == "stage_imbalance":
            pp = next(j.get("pp", 1) for j in jobs if j["name"] == job)
            if pp < 2:
                continue
            d = {"job": job, "stage": rng.randrange(pp), "magnitude": round(rng.uniform(1.1, 1.2), 2)}
        elif kind == "seqlen_imbalance":
            d = {"job": job, "magnitude": round(rng.uniform(1.15, 1.3), 2), "start": r(0, 0.3)}
        elif kind == "host_pause":
            node = rng.choice(by_job[job])
            d = {"node": node, "every": float(rng.randint(15, 30)), "pause": round(rng.uniform(1.0, 2.0), 1),
                 "start": r(0.1, 0.3)}
            touched.add(node)
        elif kind == "dataloader_slow":
            node = rng.choice(by_job[job])
            d = {"node": node, "magnitude": round(rng.uniform(1.1, 1.2), 2), "start": r(0, 0.3)}
            touched.add(node)
        elif kind == "checkpoint":
            d = {"job": job, "every": float(rng.randint(60, 120)), "pause": float(rng.randint(8, 20)),
                 "start": r(0.05, 0.2)}
        elif kind == "job_restart":
            d = {"job": job, "start": r(0.3, 0.5), "down": float(rng.randint(20, 40))}
            if len(idle) >= len(by_job[job]) and rng.random() < 0.5:
                d["nodes"] = idle[:len(by_job[job])]
        else:  # background_errors: anywhere, idle nodes included
            node = rng.choice(names)
            d = {"node": node, "rail": rng.randrange(NRAILS), "rate": round(rng.uniform(0.2, 0.5), 2)}
            touched.add(node)
        decoys.append({"kind": kind, **d})
    scn = scenario_from_dict({"cluster": {"nodes": nodes, "layout": layout, "nodes_per_unit": nodes_per_unit,
                                          "seed": seed},
                              "duration": duration, "jobs": jobs, "decoys": decoys}, f"<workload seed {seed}>")
    free = [n for n in names if n not in touched]
    base = random_scenario(seed, nodes=nodes, duration=duration, nodes_per_unit=nodes_per_unit, p_none=0.2)
    faults = tuple(f for f in base.faults if f.node is None or f.node in free)
    if base.cluster.layout != layout:
        faults = tuple(f for f in faults if f.kind not in ("config_drift", "pfc_storm"))
    # a fault only a running job can show (a slow GPU, a hung rank) is not put on a job that restarts:
    # it would be invisible while the job is down, which measures the scenario, not the detector
    restarting = {n for d in decoys if d["kind"] == "job_restart" for n in by_job[d["job"]]}
    faults = tuple(f for f in faults if not (f.kind in ("slow_gpu", "rank_hang") and f.node in restarting))
    # nor on an idle node: a slow GPU that runs no rank slows nothing (only its throttle reason shows)
    faults = tuple(f for f in faults if not (f.kind == "slow_gpu" and f.node not in in_job))
    if rng.random() < 0.4:  # a hung rank on a job's node no decoy touches (JobHung within 60 s)
        hosts = [n for n in in_job if n in free and n not in restarting and not any(f.node == n for f in faults)]
        if hosts:
            start = r(0.3, 0.55)
            faults += (Fault("rank_hang", start=start, end=start + float(rng.randint(90, 150)),
                             node=rng.choice(hosts), gpu=rng.randrange(NGPU)),)
    out = replace(scn, faults=faults)
    out.validate("", f"<workload seed {seed}>")
    return out


SWITCH_FAULTS = ("uplink_flaky", "uplink_down", "spine_degraded", "switch_congestion", "flaky_cable")
STRAGGLER_PAGES = ("StragglerRank", "SlowRanksSharedComponent")


def switch_scenario(seed: int, k: int, nodes: int, duration: float, nodes_per_unit: int, spines: int = 4,
                    uplinks: int = 4) -> Scenario:
    """One switch-side fault on a cluster with spines (``cluster: {spines, uplinks_per_leaf}``): an uplink
    flaky or down (by port or by spine), a spine whose every uplink counts errors, transmit wait on an
    uplink's switch port, or a flaky host cable (counting at both ends).  One job on every node, so every
    rail's rings cross the uplinks: the victims' stragglers must ride on the uplink or spine."""
    rng = random.Random(seed)
    cluster = {"nodes": nodes, "layout": "ib", "nodes_per_unit": nodes_per_unit, "seed": seed, "spines": spines,
               "uplinks_per_leaf": uplinks}
    spec = scenario_from_dict({"cluster": cluster, "duration": duration}, f"<switch seed {seed}>").cluster
    lay = spec.switch_layout()
    assert lay is not None
    kind = SWITCH_FAULTS[k % len(SWITCH_FAULTS)]  # the k-th switch scenario: every kind in turn
    start = float(round(rng.uniform(0.2, 0.35) * duration))
    fault: dict = {"kind": kind, "start": start, "end": float(round(start + rng.uniform(0.35, 0.45) * duration))}
    up = rng.choice(lay.uplinks)
    if kind in ("uplink_flaky", "uplink_down"):
        fault.update({"leaf": up.leaf, "port": up.port} if rng.random() < 0.5 else {"leaf": up.leaf, "spine": up.spine})
    elif kind == "spine_degraded":
        fault["spine"] = rng.choice(lay.spines)
    elif kind == "switch_congestion":
        fault.update(leaf=up.leaf, port=up.port)
    else:
        fault.update(node=node_name(rng.randrange(nodes), nodes), rail=rng.randrange(NRAILS))
    return scenario_from_dict({"cluster": cluster, "duration": duration, "faults": [fault]}, f"<switch seed {seed}>")


def make_scenario(i: int, args) -> Scenario:
    seed = args.seed0 + i
    n_generated = args.scenarios + args.overlap + args.workload + args.cost
    if n_generated <= i < n_generated + args.switch:
        return switch_scenario(seed, i - n_generated, args.switch_nodes, args.switch_duration,
                               args.switch_nodes_per_unit)
    n_generated += args.switch
    if i >= n_generated:
        return load_scenario(args.scenario[i - n_generated])
    if i < args.scenarios:
        return random_scenario(seed, nodes=args.nodes, duration=args.duration, nodes_per_unit=args.nodes_per_unit)
    if i < args.scenarios + args.overlap:
        return overlap_scenario(seed, args.nodes, args.duration, args.nodes_per_unit)
    if i < args.scenarios + args.overlap + args.workload:
        return workload_scenario(seed, args.nodes, args.duration, args.nodes_per_unit)
    return cost_scenario(seed, args.nodes, args.duration, args.nodes_per_unit)


def run_one(seed: int, scn: Scenario, args, rig: AmRig | None) -> dict:
    # sample time behind the wall clock (agents' clocks in the past, never in Alertmanager's future)
    epoch = float(int(time.time() - args.duration - 120)) if rig else 1764000000.0
    sim = SimulatedCluster(scn, mode=args.mode, interval=args.interval, epoch=epoch, link_watch=args.link_watch,
                           nccl_ras=True)
    cluster = f"bench-{seed}"
    engine = Engine(sim.topology, cluster=cluster)
    # every job's NCCL RAS on loopback, asked on suspicion through the agent's querier (sim/ras_link.py)
    if sim.ras is not None:
        sim.ras.attach(engine.ras_waiting, engine.take_ras_queries, engine.ras_report)
    sender = AlertmanagerClient([rig.url], cluster=cluster, resend_seconds=300.0) if rig is not None else None
    submitted: dict[str, float] = {}

    def on_changed(changed, now) -> None:
        t_sub = time.time()
        for inc in changed:
            if inc.open and inc.id not in submitted:
                submitted[inc.id] = t_sub

    # the service's runtime without gRPC or HTTP: the simulator hands batches over in memory
    rt = AggregatorRuntime(engine, sender=sender, on_changed=on_changed).start()
    wall0 = time.perf_counter()
    try:
        drive = Drive(sim, rt)
        drive.connect()
        drive.run()
        if sender is not None:
            sender.flush(5.0)
    finally:
        sim.close()
    wall = time.perf_counter() - wall0
    ground = sim.ground_truth()
    # every scenario's faults are costed (without ``jobs:`` one job runs on every node): overlapping faults
    # and lone slow GPUs are where the cost goes wrong
    for g, impact in zip(ground, fault_impacts(scn, args.interval), strict=True):
        g["impact"] = impact
    decoys = sim.decoys_truth()
    incidents = [_rel(i, epoch) for i in engine.incidents()]
    sc = score(ground, incidents, duration=scn.duration, decoys=decoys)
    # cable warnings on the links of a degraded leaf: that leaf's evidence, never a ticket per link
    bad_leaves = {g["component"] for g in ground if g["kind"] == "leaf_degraded"}
    cable_under_leaf = sorted(i.component for i in engine.incidents()
                              if i.alertname == "FabricCableDegrading" and i.labels.get("leaf") in bad_leaves)
    am_lat: dict[str, float] = {}
    if rig is not None:
        want = set(submitted)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            got = rig.arrivals()
            if want <= set(got):
                break
            time.sleep(0.05)
        got = rig.arrivals()
        am_lat = {iid: got[iid] - t for iid, t in submitted.items() if iid in got}
    rt.stop(grace=0, flush=1.0, final_tick=False)
    if rt.tick_errors_total:
        raise RuntimeError(f"scenario seed {seed}: {rt.tick_errors_total} detection ticks raised")
    return {"seed": seed, "scenario": scn, "ground": ground, "decoys": decoys, "incidents": incidents, "score": sc,
            "am_latency": am_lat, "wall": wall, "overlap": False, "workload": bool(scn.jobs),
            "cable_under_leaf": cable_under_leaf,
            "nccl_ras": {k: v for k, v in engine.ras.outcomes.items() if v}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=60)
    ap.add_argument("--overlap", type=int, default=30, help="extra scenarios of two overlapping faults")
    ap.add_argument("--workload", type=int, default=0,
                    help="extra scenarios of several jobs with software decoys (and 0-2 faults)")
    ap.add_argument("--cost", type=int, default=0,
                    help="extra scenarios for cost: a lone slow GPU on one job, a bad NIC and a slow GPU overlapping "
                         "on another")
    ap.add_argument("--scenario", action="append", default=[], metavar="FILE",
                    help="a scenario file to run after the generated ones (repeatable)")
    ap.add_argument("--switch", type=int, default=0,
                    help="extra scenarios of one switch-side fault each (uplink, spine, switch port, both ends of a "
                         "host cable) on a cluster with spines")
    ap.add_argument("--switch-nodes", type=int, default=1024, help="nodes of the --switch scenarios' cluster")
    ap.add_argument("--switch-nodes-per-unit", type=int, default=16)
    ap.add_argument("--switch-duration", type=float, default=120.0)
    ap.add_argument("--mode", choices=("memory", "tree"), default="memory",
                    help="memory: the agents' batches built in memory; tree: real agents poll rendered node trees")
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--nodes-per-unit", type=int, default=8)
    ap.add_argument("--duration", type=float, default=240.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--link-watch", type=float, default=1.0,
                    help="agents' link_watch_interval in seconds (0: off; only acts when shorter than --interval)")
    ap.add_argument("--am-subset", type=int, default=10, help="scenarios (with faults) measured through Alertmanager")
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--json", help="write the raw numbers here")
    args = ap.parse_args(argv)
    generated = args.scenarios + args.overlap + args.workload + args.cost + args.switch
    if min(args.scenarios, args.overlap, args.workload, args.cost, args.switch) < 0 or \
            generated + len(args.scenario) < 1:
        ap.error("--scenarios, --overlap, --workload, --cost and --switch must be >= 0, together with --scenario "
                 "files >= 1")

    rig = None
    am_note = ""
    if args.am_subset > 0:
        try:
            rig = AmRig()
        except BaseException as exc:  # pytest.skip (binary missing) is a BaseException
            am_note = f"no Alertmanager ({type(exc).__name__}: {exc})"
            rig = None
    results = []
    am_done = 0
    t_all = time.perf_counter()
    try:
        n_before_files = generated
        for i in range(n_before_files + len(args.scenario)):
            seed = args.seed0 + i
            scn = make_scenario(i, args)
            use_am = rig is not None and am_done < args.am_subset and any(
                g.component for g in scn.ground_truth())
            r = run_one(seed, scn, args, rig if use_am else None)
            r["overlap"] = args.scenarios <= i < args.scenarios + args.overlap
            r["switch"] = n_before_files - args.switch <= i < n_before_files
            am_done += use_am
            results.append(r)
            sc = r["score"]
            tag = " (overlap)" if r["overlap"] else (" (workload)" if r["workload"] else "")
            if args.scenarios + args.overlap + args.workload <= i < n_before_files - args.switch:
                tag = " (cost)"
            tag += " (switch)" if r["switch"] else ""
            if i >= n_before_files:
                tag += f" ({Path(args.scenario[i - n_before_files]).name})"
            print(f"seed {seed}{tag}: {len(r['ground'])} fault(s) {[g['kind'] for g in r['ground']]}, "
                  f"{len(r['decoys'])} decoy(s) {[d['kind'] for d in r['decoys']]} -> {sc['pages']} page(s), "
                  f"{sc['info_findings']} info, P {sc['precision']:.2f} R {sc['recall']:.2f}, "
                  f"{r['wall']:.1f} s", flush=True)
            if args.json:  # every scenario so far: a run stopped early (a long 1,024-node series) keeps them
                atomic_write_text(args.json, json.dumps({"partial": True, "scenarios": [
                    {"seed": x["seed"], "faults": x["ground"], "decoys": x["decoys"], "incidents": x["incidents"],
                     "score": x["score"]} for x in results]}, default=str))
    finally:
        if rig is not None:
            rig.close()
    total_wall = time.perf_counter() - t_all

    # ---- aggregate
    tp = sum(r["score"]["true_positives"] for r in results)
    n_inc = sum(r["score"]["pages"] for r in results)
    n_faults = sum(r["score"]["faults"] for r in results)
    n_det = sum(r["score"]["faults_detected"] for r in results)
    precision = tp / n_inc if n_inc else 1.0
    recall = n_det / n_faults if n_faults else 1.0
    ov = [r for r in results if r["overlap"]]
    ov_tp = sum(r["score"]["true_positives"] for r in ov)
    ov_inc = sum(r["score"]["pages"] for r in ov)
    ov_faults = sum(r["score"]["faults"] for r in ov)
    ov_det = sum(r["score"]["faults_detected"] for r in ov)
    per_kind: dict[str, dict] = defaultdict(lambda: {"faults": 0, "detected": 0, "delays": [], "am": [],
                                                     "alertname_ok": 0, "fp": 0})
    delays: list[float] = []
    pipeline: list[float] = []
    am_only: list[float] = []
    misses: list[str] = []
    fps: list[str] = []
    for r in results:
        sc, ground, incs = r["score"], r["ground"], r["incidents"]
        by_id = {i["id"]: i for i in incs}
        for fi, g in enumerate(ground):
            k = per_kind[g["kind"]]
            if not g.get("component"):
                continue
            k["faults"] += 1
            d = sc["detection_delay_s"].get(str(fi))
            if d is None:
                misses.append(f"seed {r['seed']}: MISSED {g['kind']} {g['component']} t={g['start']:.0f}..{g['end']}"
                              f" (incidents: {[(i['alertname'], i['component']) for i in incs]})")
                continue
            k["detected"] += 1
            k["delays"].append(d)
            delays.append(d)
            # the earliest matching incident: did its alertname agree, and its Alertmanager latency
            hits = sorted((i for i in incs if i["component"] == g["component"]), key=lambda i: i["first_seen"])
            if hits:
                h = hits[0]
                k["alertname_ok"] += h["alertname"] == g.get("alertname")
                lat = r["am_latency"].get(h["id"])
                if lat is not None:
                    k["am"].append(d + lat)
                    pipeline.append(d + lat)
                    am_only.append(lat)
        for iid in sc["unmatched_incidents"]:
            i = by_id[iid]
            kinds = ",".join(g["kind"] for g in ground) or "none"
            per_kind["(false positive)"]["fp"] += 1
            fps.append(f"seed {r['seed']}: FALSE POSITIVE {i['alertname']} {i['component_type']} {i['component']} "
                       f"t={i['first_seen']:.0f} (faults: {kinds}; "
                       f"{[(g['kind'], g['component'], g['start'], g['end']) for g in ground]})")

    # ---- decoys and the goals
    wl = [r for r in results if r["workload"]]
    decoy_pages = sum(r["score"]["decoy_pages"] for r in results)
    n_decoys = sum(len(r["decoys"]) for r in results)
    info_counts = [len(d["info_ids"]) for r in results for d in r["score"]["per_decoy"]]
    det = DetectionSettings()
    confirm = confirm_s(args.interval, det.persist_windows, det.window_s)
    slow = late_detections(results, args.interval, det.persist_windows, det.window_s, SWITCH_KINDS)
    # ---- hangs and cost (DESIGN "Jobs, decoys and cost")
    hang_delays = [r["score"]["detection_delay_s"].get(str(fi)) for r in results for fi, g in enumerate(r["ground"])
                   if g["kind"] == "rank_hang"]
    hang_named = [d for d in hang_delays if d is not None]
    cj = judge_cost([{**r, "duration": r["scenario"].duration} for r in results])
    cost_err, judged, within, phantom, off, by_case = cj.errors, cj.judged, cj.within, cj.phantom, cj.off, cj.by_case
    why = []
    if judged and within / judged < 0.9:
        why.append(f"cost within bounds for {within}/{judged} (fault, job) pairs < 90%")
    if phantom:
        why.append(f"{len(phantom)} job(s) listed >= 0.03 with truth < 0.01")
    if precision < 0.97:
        why.append(f"precision {precision:.3f} < 0.97")
    if recall < 0.95:
        why.append(f"recall {recall:.3f} < 0.95")
    if decoy_pages:
        why.append(f"{decoy_pages} decoy page(s)")
    cable_under_leaf = [f"seed {r['seed']}: FabricCableDegrading {c} under a degraded leaf"
                        for r in results for c in r["cable_under_leaf"]]
    if cable_under_leaf:
        why.append(f"{len(cable_under_leaf)} cable warning(s) under a degraded leaf")
    if info_counts and max(info_counts) > 1:
        why.append(f"a decoy raised {max(info_counts)} info findings")
    if slow:
        why.append(f"{len(slow)} fault(s) seen later than their goal")
    # switch-side faults: their victims' stragglers ride on the uplink or spine, never a page of their own
    sw = [r for r in results if r.get("switch")]
    sw_straggler_pages = [f"seed {r['seed']}: {i['alertname']} {i['component']} t={i['first_seen']:.0f}"
                          for r in sw for i in r["incidents"]
                          if i["alertname"] in STRAGGLER_PAGES and i["severity"] in ("warning", "critical")]
    if sw_straggler_pages:
        why.append(f"{len(sw_straggler_pages)} straggler page(s) for an uplink's or spine's victims")
    sw_tp = sum(r["score"]["true_positives"] for r in sw)
    sw_pages = sum(r["score"]["pages"] for r in sw)
    sw_det = sum(r["score"]["faults_detected"] for r in sw)
    sw_faults = sum(r["score"]["faults"] for r in sw)
    lines = [
        "# fabricmon detection benchmark",
        "",
        f"{len(results)} scenarios (seeds {args.seed0}..{args.seed0 + len(results) - 1}: {args.scenarios} random, "
        f"{len(ov)} of two overlapping faults"
        + (f", {args.workload} workload" if args.workload else "")
        + (f", {args.cost} cost (a lone slow GPU; a bad NIC and a slow GPU overlapping)" if args.cost else "")
        + "".join(f", {Path(f).name}: {r['scenario'].cluster.nodes} nodes ({r['scenario'].cluster.nodes_per_unit} "
                  f"per unit), {r['scenario'].duration:.0f} s"
                  for f, r in zip(args.scenario, results[len(results) - len(args.scenario):], strict=True))
        + (f", {args.switch} switch-side ({args.switch_nodes} nodes, {args.switch_nodes_per_unit} per unit, "
           f"{args.switch_duration:.0f} s)" if args.switch else "") + "), "
        + (f"{args.nodes} nodes ({args.nodes_per_unit} per unit), {args.duration:.0f} s simulated each, "
           if args.scenarios + args.overlap + args.workload else "")
        + f"at a {args.interval:g} s agent interval, "
        + ("tree-mode simulator (agents poll rendered node trees)" if args.mode == "tree" else "in-memory simulator")
        + ", fresh Engine per scenario ticked every interval"
        + (f" and after each off-cadence batch (agents' link watch every {args.link_watch:g} s)"
           if 0 < args.link_watch < args.interval else "")
        + f"; {total_wall:.0f} s wall in all.",
        "",
        "| metric | value | target |",
        "|---|---|---|",
        f"| precision (localized incidents) | {precision:.3f} ({tp}/{n_inc}) | >= 0.95 |",
        f"| recall (faults localized) | {recall:.3f} ({n_det}/{n_faults}) | >= 0.95 |",
        f"| precision, overlapping-fault scenarios | "
        f"{(ov_tp / ov_inc if ov_inc else 1.0):.3f} ({ov_tp}/{ov_inc}) | >= 0.95 |",
        f"| recall, overlapping-fault scenarios | "
        f"{(ov_det / ov_faults if ov_faults else 1.0):.3f} ({ov_det}/{ov_faults}) | >= 0.95 |",
        f"| workload scenarios (several jobs, decoys) | {len(wl)} with {n_decoys} decoys | |",
        f"| decoy pages | {decoy_pages} | 0 |",
        *([f"| switch-side scenarios ({args.switch_nodes} nodes, {args.switch_duration:.0f} s, memory mode) | "
           f"{len(sw)} | |",
           f"| precision, switch-side scenarios | {(sw_tp / sw_pages if sw_pages else 1.0):.3f} ({sw_tp}/{sw_pages}) "
           f"| >= 0.95 |",
           f"| recall, switch-side scenarios | {(sw_det / sw_faults if sw_faults else 1.0):.3f} ({sw_det}/{sw_faults}) "
           f"| >= 0.95 |",
           f"| straggler pages for an uplink's or spine's victims | {len(sw_straggler_pages)} | 0 |"] if sw else []),
        f"| cable warnings (FabricCableDegrading) on links of a degraded leaf | {len(cable_under_leaf)} | 0 |",
        f"| info findings per decoy, max | {max(info_counts) if info_counts else '-'} "
        f"(total {sum(info_counts)}) | <= 1 |",
        f"| faults seen later than {HARD_S + confirm:g} s (hard) / {OTHER_S + confirm:g} s (others) / 60 s (hangs) "
        f"/ 40 s (switch side) after the first poll that could see them | {len(slow)} | 0 |",
        f"| hung ranks named (JobHung on the rank), time to name median / max (s) | "
        f"{len(hang_named)}/{len(hang_delays)}, {fmt(pct(hang_named, 0.5))} / {fmt(max(hang_named, default=None))}"
        f" | all, <= 60 |",
        f"| cost: abs(estimated - true) step slowdown, median / p90 ({len(cost_err)} (fault, job) pairs) | "
        f"{fmt(pct(cost_err, 0.5), 3)} / {fmt(pct(cost_err, 0.9), 3)} | |",
        f"| cost: pairs with truth >= 0.03 within max(0.25 x truth, 0.02) | {within}/{judged} | >= 90% |",
        *(f"| cost within bounds, {case} | {w}/{n} | |" for case, (w, n) in sorted(by_case.items())),
        f"| cost: jobs listed >= 0.03 whose truth is < 0.01 | {len(phantom)} | 0 |",
        f"| injection -> incident open, median (sample s) | {fmt(pct(delays, 0.5))} | |",
        f"| injection -> incident open, p90 (sample s) | {fmt(pct(delays, 0.9))} | |",
        f"| submit -> webhook (wall s), median, {len(am_only)} alerts in {am_done} scenarios | "
        f"{fmt(pct(am_only, 0.5), 2)} | |",
        f"| injection -> Alertmanager webhook, median (sample delay + wall latency) | {fmt(pct(pipeline, 0.5))} | |",
        f"| injection -> Alertmanager webhook, p90 | {fmt(pct(pipeline, 0.9))} | |",
        "",
        "| fault kind | faults | localized | recall | alertname agrees | open delay median (s) | p90 (s) "
        "| to webhook median (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in sorted(per_kind):
        k = per_kind[kind]
        if kind == "(false positive)":
            continue
        if not k["faults"]:
            lines.append(f"| {kind} | (not a fault) | | | | | | |")
            continue
        lines.append(f"| {kind} | {k['faults']} | {k['detected']} | {k['detected'] / k['faults']:.2f} | "
                     f"{k['alertname_ok']}/{k['detected']} | {fmt(pct(k['delays'], 0.5))} | "
                     f"{fmt(pct(k['delays'], 0.9))} | {fmt(pct(k['am'], 0.5))} |")
    fp = per_kind['(false positive)']['fp']
    lines.append(f"| false positives (incidents matching no fault) | | {fp} | | | | | |")
    if cj.pairs:
        lines += ["", "Cost per judged (fault, job) pair:", ""] + pair_table(cj)
    if am_note:
        lines += ["", f"Alertmanager latency not measured: {am_note}"]
    if misses or fps or slow or phantom or cable_under_leaf or off or sw_straggler_pages:
        lines += ["", "Misses, false positives, late detections, phantom costs and costs out of bounds:", ""] + [
            f"- {m}" for m in misses + fps + slow + phantom + cable_under_leaf + off + sw_straggler_pages]
    verdict = (f"detection verdict: ok precision {precision:.3f} recall {recall:.3f} decoy pages 0, "
               f"{len(results)} scenarios in {total_wall:.0f} s wall" if not why
               else "detection verdict: FAIL " + "; ".join(why))
    lines += ["", verdict]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "precision": precision, "recall": recall, "delays": delays, "pipeline": pipeline, "am_latency": am_only,
            "per_kind": {k: {kk: vv for kk, vv in v.items()} for k, v in per_kind.items()},
            "misses": misses, "false_positives": fps,
            "scenarios": [{"seed": r["seed"], "faults": r["ground"], "decoys": r["decoys"], "incidents": r["incidents"],
                           "score": r["score"]} for r in results]}, indent=2, default=str))
    return 0 if not why else 1


if __name__ == "__main__":
    raise SystemExit(main())
