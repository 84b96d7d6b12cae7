"""Lead time of FabricCableDegrading: how long before a degrading cable's first flap the warning opens.

    .venv/bin/python benchmarks/bench_cable_lead.py [--scenarios 30] [--nodes 8] [--interval 5]
        [--seed0 1000] [--out results.md]

Each scenario (fixed seeds ``--seed0 ..``) is a random cluster (layout ib or roce) with one
``cable_degrading`` fault on a random node and rail: start 30-120 s, ramp ``fails_at - start`` of
8-25 minutes, then flaps for 60 s.  The in-memory simulator (with the agents' module readings, no
job) feeds a fresh ``Engine`` through the drive harness (``sim.drive``), ticked every interval.  Measured: lead time
(``fails_at`` minus the warning's open time, on the faulted link; a warning after ``fails_at`` or
none is a miss), and every FabricCableDegrading on any other link (a healthy link warned), with the
healthy link-hours observed.  RoCE links give BER and lane evidence plus RX power; IB links have
no FEC counters in sysfs, so there the module's RX power is all there is.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fabricmon.aggregator.engine import Engine  # noqa: E402
from fabricmon.sim.drive import Drive  # noqa: E402
from fabricmon.sim.hw import NRAILS  # noqa: E402
from fabricmon.sim.runner import SimulatedCluster  # noqa: E402
from fabricmon.sim.scenario import ClusterSpec, Scenario  # noqa: E402
from fabricmon.topology import link_id, node_name  # noqa: E402


def one(seed: int, nodes: int, interval: float) -> dict:
    rng = random.Random(seed)
    layout = rng.choice(("ib", "roce"))
    start = round(rng.uniform(30, 120))
    fails_at = start + round(rng.uniform(8, 25) * 60)
    node = node_name(rng.randrange(nodes), nodes)
    rail = rng.randrange(NRAILS)
    scn = Scenario(ClusterSpec(nodes=nodes, layout=layout, nodes_per_unit=nodes, seed=seed), fails_at + 60.0)
    scn = scn.with_fault("cable_degrading", node=node, rail=rail, start=start, fails_at=fails_at)
    target = link_id(node, f"mlx5_{rail}", 1)
    sim = SimulatedCluster(scn, mode="memory", interval=interval, job=None)
    c = sim.cluster
    opened: float | None = None
    others: set[str] = set()

    def on_step(_st, changed) -> None:
        nonlocal opened
        for inc in changed:
            if inc.alertname != "FabricCableDegrading" or inc.resolved_at is not None:
                continue
            if inc.component == target:
                opened = c.t if opened is None else opened
            else:
                others.add(inc.component)

    drive = Drive(sim, engine=Engine(sim.topology))
    drive.connect()
    drive.run(on_step=on_step)
    sim.close()
    lead = fails_at - opened if opened is not None and opened < fails_at else None
    healthy_links = nodes * len(c.devs) - 1
    return {"seed": seed, "layout": layout, "ramp_s": fails_at - start, "lead_s": lead,
            "opened_after_start_s": None if opened is None else opened - start, "healthy_warned": len(others),
            "healthy_link_hours": healthy_links * scn.duration / 3600}


def table(rows: list[dict], wall: float) -> str:
    out = ["| layout | scenarios | warned before the flap | median lead | worst lead | median ramp | "
           "healthy links warned | healthy link-hours |", "|---|---|---|---|---|---|---|---|"]
    for layout in ("roce", "ib", "all"):
        sel = [r for r in rows if layout == "all" or r["layout"] == layout]
        if not sel:
            continue
        leads = [r["lead_s"] for r in sel if r["lead_s"] is not None]
        med = f"{statistics.median(leads) / 60:.1f} min" if leads else "-"
        worst = f"{min(leads) / 60:.1f} min" if leads else "-"
        ramp = statistics.median(r["ramp_s"] for r in sel) / 60
        out.append(f"| {layout} | {len(sel)} | {len(leads)} | {med} | {worst} | {ramp:.1f} min | "
                   f"{sum(r['healthy_warned'] for r in sel)} | {sum(r['healthy_link_hours'] for r in sel):.0f} |")
    out.append("")
    out.append(f"({len(rows)} scenarios in {wall:.0f} s wall)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=30)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for i in range(args.scenarios):
        r = one(args.seed0 + i, args.nodes, args.interval)
        rows.append(r)
        lead = "miss" if r["lead_s"] is None else f"{r['lead_s']:.0f}s"
        print(f"seed {r['seed']} {r['layout']:<4} ramp {r['ramp_s']:>5.0f}s lead {lead:>6} "
              f"healthy warned {r['healthy_warned']}", flush=True)
    text = table(rows, time.perf_counter() - t0)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
