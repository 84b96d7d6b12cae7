"""Fault injection -> Prometheus alert firing, with deploy/prometheus's rules as shipped.

The baseline the aggregator's direct path is compared against.  A simulated RoCE cluster runs
its real agents at wall-clock speed (sample time = wall time, 1 s agent interval); a real
Prometheus scrapes them (honor_labels, `unit` target label, `cluster` external label, as
deploy/README.md says) and evaluates the recording and alert rules.  Each fault kind is
injected on its own node at ``--fault-at`` seconds (all kinds in one cluster: the rules are per
component, so they do not interfere); the run stops when every alert fired or at ``--cap``
seconds after injection.  The aggregator engine is fed the same agent batches, so its
incident time is shown beside Prometheus' (sample time of the tick that opened it).

    .venv/bin/python benchmarks/bench_prometheus_rules.py                      # 1 s scrape and evaluation
    .venv/bin/python benchmarks/bench_prometheus_rules.py --scrape 15s --cap 180
    .venv/bin/python benchmarks/bench_prometheus_rules.py --kinds flaky_cable,link_flap --out table.md

Columns: ``pending`` = injection -> the alert's expression first true (its ``activeAt``),
``firing`` = injection -> first seen firing in /api/v1/alerts (polled every 0.2 s),
``firing - for`` = what the windows, scrape and evaluation cost on top of ``for:``.
Needs the ``prometheus`` binary (Debian package ``prometheus``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


from fabricmon.sim.scenario import KINDS, ClusterSpec, Scenario
from support.promtools import PROMETHEUS, RULE_FILES, alert_for_seconds, find_binary, live_fabric

DEFAULT_KINDS = ("flaky_cable", "link_down", "pfc_storm", "nvlink_errors", "config_drift")
# Where each kind is injected (node index is the kind's position; rails/GPUs spread out).
FAULT_ARGS = {
    "flaky_cable": {"rail": 3},
    "link_down": {"rail": 6},
    "link_flap": {"rail": 4},
    "link_degraded": {"rail": 5},
    "pfc_storm": {"rail": 2},
    "rdma_retransmits": {"rail": 0},
    "nvlink_errors": {"gpu": 1, "link": 2},
    "nvlink_down": {"gpu": 4, "link": 7},
    "config_drift": {"rail": 1},
}


def build_scenario(kinds: list[str], fault_at: float, cap: float, nodes_per_unit: int = 4) -> Scenario:
    nodes = max(8, len(kinds))
    nodes += (-nodes) % nodes_per_unit
    scn = Scenario(ClusterSpec(nodes, "roce", nodes_per_unit, seed=5), fault_at + cap + 10)
    for i, kind in enumerate(kinds):
        scn = scn.with_fault(kind, node=f"node-{i:03d}", start=fault_at, **FAULT_ARGS[kind])
    return scn


def run(kinds: list[str], *, scrape: str, fault_at: float, cap: float, workdir: Path) -> tuple[list[dict], float]:
    scn = build_scenario(kinds, fault_at, cap)
    for_s = alert_for_seconds()
    truth = [g for g in scn.ground_truth() if g.alertname]
    t0 = time.monotonic()
    # One aggregator replica down: the fault rules are its fallback and speak only then.
    with live_fabric(scn, workdir, rule_files=RULE_FILES, scrape_interval=scrape, probe=False,
                     down_aggregator_replica=True) as lf:
        injected = lf.epoch + fault_at
        keys = {(g.alertname, g.component) for g in truth}
        end = injected + cap
        while time.time() < end:
            _, firing, _ = lf.watcher.snapshot()
            if keys <= firing.keys():
                break
            if lf.errors:
                raise RuntimeError(f"simulation failed: {lf.errors}")
            time.sleep(0.2)
        active, firing, _ = lf.watcher.snapshot()
        incidents = lf.engine.incidents() if lf.engine is not None else []
    rows = []
    for g in truth:
        k = (g.alertname, g.component)
        agg = [i.first_seen for i in incidents if i.alertname == g.alertname and i.component == g.component]
        rows.append({"kind": g.kind, "alert": g.alertname, "component": g.component, "for": for_s[g.alertname],
                     "pending": active[k] - injected if k in active else None,
                     "firing": firing[k] - injected if k in firing else None,
                     "aggregator": min(agg) - injected if agg else None})
    return rows, time.monotonic() - t0


def table(rows: list[dict], scrape: str, cap: float) -> str:
    def s(v: float | None) -> str:
        return f"{v:.1f}" if v is not None else f"> {cap:.0f}"

    out = [f"Injection -> Prometheus alert, {scrape} scrape and evaluation, rules as shipped "
           f"(aggregator: its incident, sample time):", "",
           "| fault | alert | component | for (s) | pending (s) | firing (s) | firing - for (s) | aggregator (s) |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        extra = r["firing"] - r["for"] if r["firing"] is not None else None
        agg = f"{r['aggregator']:.1f}" if r["aggregator"] is not None else "-"
        out.append(f"| {r['kind']} | {r['alert']} | `{r['component']}` | {r['for']:.0f} | {s(r['pending'])} | "
                   f"{s(r['firing'])} | {s(extra)} | {agg} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                    help=f"comma-separated fault kinds (of {', '.join(FAULT_ARGS)})")
    ap.add_argument("--scrape", default="1s", help="scrape and evaluation interval (default 1s)")
    ap.add_argument("--fault-at", type=float, default=5.0, help="injection time, simulated = wall seconds")
    ap.add_argument("--cap", type=float, default=90.0, help="stop this many seconds after injection")
    ap.add_argument("--out", help="also write the markdown table here")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in FAULT_ARGS or k not in KINDS]
    if bad:
        ap.error(f"unsupported kind(s) {bad}; choose from {', '.join(FAULT_ARGS)}")
    if find_binary(PROMETHEUS) is None:
        print("prometheus not installed (apt-get install prometheus)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="fabricmon-bench-prom-"))
    try:
        rows, wall = run(kinds, scrape=args.scrape, fault_at=args.fault_at, cap=args.cap, workdir=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = table(rows, args.scrape, args.cap) + f"\n\n({len(kinds)} faults in one run, {wall:.0f} s wall)\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
