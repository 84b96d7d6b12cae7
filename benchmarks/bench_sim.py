"""Simulator cost: tree mode (render + advance, and the real agents' polls) and in-memory batches.

    .venv/bin/python benchmarks/bench_sim.py [--tree-nodes 32] [--memory-nodes 4096] [--steps 10]
        [--switch-nodes 1024] [--json OUT]

Tree mode writes under /dev/shm when it exists (``tree.default_base_dir``);
``--disk DIR`` measures another file system.  Prints a table; ``--json``
also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.inmemory import BatchBuilder
from fabricmon.sim.job import JobSpec, SyntheticJob
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import default_scenario
from fabricmon.sim.tree import NodeTree, default_base_dir


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def bench_tree(nodes: int, steps: int, base: str | None, poll: bool) -> dict:
    scn = default_scenario(nodes, 600)
    own = base is None
    base = base or default_base_dir("fabricmon-bench-")
    try:
        c = ClusterState(scn)
        job = SyntheticJob(c.names, JobSpec(), epoch=c.epoch)
        trees = [NodeTree(c, i, f"{base}/{name}") for i, name in enumerate(c.names)]
        t0 = time.perf_counter()
        for tr in trees:
            tr.render()
        first = time.perf_counter() - t0
        adv, gen, ren, files = [], [], [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            job.advance_to(c.t + 1.0, c.effects(c.t + 1.0))
            c.advance(1.0, job.rail_bytes_per_second(), job.nvlink_activity())
            t1 = time.perf_counter()
            for tr in trees:
                tr.dynamic_files()  # content only (what a render costs before any write)
            t2 = time.perf_counter()
            files.append(sum(tr.render() for tr in trees))
            t3 = time.perf_counter()
            adv.append(t1 - t0)
            gen.append(t2 - t1)
            ren.append(t3 - t2)
        out = {"nodes": nodes, "first_render_s": first, "advance_s": med(adv), "content_s": med(gen),
               "render_s": med(ren), "render_per_node_ms": med(ren) / nodes * 1e3,
               "files_per_step": med(files), "files_per_node": med(files) / nodes}
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)
    if poll:
        polls = []
        with SimulatedCluster(scn) as sim:
            for _ in range(max(2, steps // 2)):
                st = sim.step()
                polls.append(st.poll_s)
        out["poll_s"] = med(polls)
        out["poll_per_node_ms"] = med(polls) / nodes * 1e3
    return out


def bench_memory(nodes: int, steps: int) -> dict:
    t0 = time.perf_counter()
    scn = default_scenario(nodes, 600)
    c = ClusterState(scn)
    job = SyntheticJob(c.names, JobSpec(), epoch=c.epoch)
    b = BatchBuilder(c)
    hellos = b.hellos()
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    b.build()
    first = time.perf_counter() - t0
    adv, jobs, bat, deltas, gauges, ranks = [], [], [], [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        timings = job.advance_to(c.t + 1.0, c.effects(c.t + 1.0))
        t1 = time.perf_counter()
        c.advance(1.0, job.rail_bytes_per_second(), job.nvlink_activity())
        t2 = time.perf_counter()
        by_node: dict = {}
        for r in timings:
            by_node.setdefault(r.node, []).append(r)
        batches = b.build(by_node)
        t3 = time.perf_counter()
        jobs.append(t1 - t0)
        adv.append(t2 - t1)
        bat.append(t3 - t2)
        deltas.append(sum(len(x.deltas) for x in batches))
        gauges.append(sum(len(x.gauges) for x in batches))
        ranks.append(len(timings))
    return {"nodes": nodes, "hellos": len(hellos), "setup_s": build, "first_batch_s": first,
            "job_s": med(jobs), "advance_s": med(adv), "batches_s": med(bat),
            "interval_total_s": med(jobs) + med(adv) + med(bat), "deltas_per_interval": med(deltas),
            "deltas_per_node": med(deltas) / nodes, "changed_gauges_per_interval": med(gauges),
            "rank_timings_per_interval": med(ranks),
            "us_per_delta": med(bat) / max(med(deltas), 1) * 1e6}


def bench_switch_sweep(nodes: int, sweeps: int, spines: int = 4, uplinks: int = 4) -> dict:
    """The simulated switch side at ``nodes`` (memory mode): one sweep's series every 10 simulated seconds,
    built as the sweeping node's agent builds them (sim/sweep_feed.py); the advance's share too."""
    from fabricmon.sim.scenario import scenario_from_dict
    from fabricmon.sim.sweep_feed import SweepFeed

    scn = scenario_from_dict({"cluster": {"nodes": nodes, "layout": "ib", "nodes_per_unit": 16, "seed": 7,
                                          "spines": spines, "uplinks_per_leaf": uplinks}, "duration": 600.0})
    t0 = time.perf_counter()
    c = ClusterState(scn)
    setup = time.perf_counter() - t0
    assert c.switches is not None
    feed = SweepFeed(c.switches, c.names[0])
    adv, sweep, deltas, gauges = [], [], [], []
    for _ in range(sweeps + 1):
        t0 = time.perf_counter()
        for _s in range(10):
            c.switches.advance(1.0, c.t + 1.0)  # the switch side's share of one simulated second
        t1 = time.perf_counter()
        d, g = feed.series(c.t, c.ts())
        t2 = time.perf_counter()
        adv.append((t1 - t0) / 10)
        sweep.append(t2 - t1)
        deltas.append(len(d))
        gauges.append(len(g))
    lay = c.switches.layout
    return {"nodes": nodes, "leaves": len(lay.leaves), "spines": len(lay.spines), "uplinks": len(lay.uplinks),
            "switch_ports": len(lay.host_ports) + 2 * len(lay.uplinks), "setup_s": setup,
            "advance_per_second_s": med(adv[1:]), "sweep_s": med(sweep[1:]), "first_sweep_s": sweep[0],
            "deltas_per_sweep": med(deltas[1:]), "changed_gauges_per_sweep": med(gauges[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree-nodes", type=int, default=32)
    ap.add_argument("--memory-nodes", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--disk", default=None, help="render trees here instead of a fresh /dev/shm directory")
    ap.add_argument("--no-poll", action="store_true", help="skip the real agents' poll timing")
    ap.add_argument("--switch-nodes", type=int, default=1024, help="nodes of the switch-side measure (0: skip)")
    ap.add_argument("--switch-sweeps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = {"tree": bench_tree(a.tree_nodes, a.steps, a.disk, not a.no_poll),
           "memory": bench_memory(a.memory_nodes, a.steps)}
    if a.switch_nodes:
        res["switch"] = bench_switch_sweep(a.switch_nodes, a.switch_sweeps)
    t, m = res["tree"], res["memory"]
    print(f"tree mode, {t['nodes']} nodes, per simulated second (median of {a.steps}):")
    print(f"  advance cluster + job        {t['advance_s'] * 1e3:8.1f} ms")
    print(f"  content of every file        {t['content_s'] * 1e3:8.1f} ms")
    print(f"  render (content + writes)    {t['render_s'] * 1e3:8.1f} ms  = {t['render_per_node_ms']:.2f} ms/node, "
          f"{t['files_per_node']:.0f} files written/node")
    if "poll_s" in t:
        print(f"  real agents' polls           {t['poll_s'] * 1e3:8.1f} ms  = {t['poll_per_node_ms']:.2f} ms/node")
    print(f"in-memory mode, {m['nodes']} nodes, per interval (median of {a.steps}):")
    print(f"  setup (state + catalog)      {m['setup_s'] * 1e3:8.1f} ms "
          f"(first batch {m['first_batch_s'] * 1e3:.0f} ms)")
    print(f"  job                          {m['job_s'] * 1e3:8.1f} ms ({m['rank_timings_per_interval']:.0f} rank "
          f"timings)")
    print(f"  advance cluster              {m['advance_s'] * 1e3:8.1f} ms")
    print(f"  batches                      {m['batches_s'] * 1e3:8.1f} ms ({m['deltas_per_interval']:.0f} deltas, "
          f"{m['deltas_per_node']:.0f}/node, {m['us_per_delta']:.2f} us/delta; "
          f"{m['changed_gauges_per_interval']:.0f} changed gauges)")
    print(f"  total                        {m['interval_total_s'] * 1e3:8.1f} ms")
    if "switch" in res:
        w = res["switch"]
        print(f"switch side, {w['nodes']} nodes ({w['leaves']} leaves, {w['spines']} spines, {w['uplinks']} uplinks, "
              f"{w['switch_ports']} switch ports), median of {a.switch_sweeps}:")
        print(f"  setup                        {w['setup_s'] * 1e3:8.1f} ms")
        print(f"  advance, per second          {w['advance_per_second_s'] * 1e3:8.1f} ms")
        print(f"  one sweep's series           {w['sweep_s'] * 1e3:8.1f} ms ({w['deltas_per_sweep']:.0f} deltas, "
              f"{w['changed_gauges_per_sweep']:.0f} changed gauges; first sweep {w['first_sweep_s'] * 1e3:.0f} ms)")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
