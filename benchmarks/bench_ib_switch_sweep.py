"""The switch sweep's cost on an ibsim fabric of 64 leaves (20 hosts + 20 uplinks each) and 20 spines of
64 ports: 84 switches, 3,840 cabled switch ports, 1,280 CAs (the research fabric of
../docs: switch-side sweep).  Runs the agent's own ``Sweeper`` (sources/ib_switches) with the real
infiniband-diags under ibsim's preload, opensm assigning LIDs, and reports per sweep kind the wall time
and the MADs sent, counted from the sweeping port's own PortXmitPkts delta (``perfquery -x`` of the
local port, its own query subtracted).  Not a test: prints a table.

    PYTHONPATH=tests .venv/bin/python benchmarks/bench_ib_switch_sweep.py [--leaves 64] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fabricmon.config import IbSwitchesConfig  # noqa: E402
from fabricmon.sources.ib_switches.sweeper import Sweeper  # noqa: E402
from support.ibsimrig import IbSim, two_tier  # noqa: E402


def xmit_pkts(sim: IbSim) -> int:
    out = sim.run("perfquery", "-x").stdout
    m = re.search(r"^PortXmitPkts:\.+(\d+)", out, re.M)
    return int(m.group(1)) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leaves", type=int, default=64)
    ap.add_argument("--hosts", type=int, default=20)
    ap.add_argument("--spines", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    fabric = two_tier(args.leaves, args.hosts, args.spines, ports=args.hosts + args.spines,
                      spine_ports=max(64, args.leaves))
    with tempfile.TemporaryDirectory() as tmp, IbSim(fabric, Path(tmp), sm_sweep_s=30) as sim:
        os.environ.update({k: sim.env[k] for k in ("IBSIM_SOCKNAME", "LD_PRELOAD")})  # for the tools it spawns
        os.chdir(tmp)  # the preload writes a sys-<pid> tree into each tool's working directory
        cfg = IbSwitchesConfig(enabled=True, concurrency=args.concurrency, health_interval=10, full_interval=60)
        clock = [0.0]
        sweeper = Sweeper(cfg, monotonic=lambda: clock[0])
        rows = []
        probe = xmit_pkts(sim)
        probe_cost = xmit_pkts(sim) - probe  # the counting query's own MADs
        for kind in ("first (map + health + full)", "health only", "health + full"):
            before = xmit_pkts(sim)
            t0 = time.monotonic()
            snap = sweeper.sweep_once()
            wall = time.monotonic() - t0
            mads = xmit_pkts(sim) - before - probe_cost
            ports = sum(len(s.switch.cables) for s in snap.switches)
            rows.append((kind, wall, mads, len(snap.switches), ports, snap.unreachable))
            clock[0] += 10 if kind.startswith("first") else 60
        sweeper.stop()
    print("| sweep | wall s | MADs from the sweeping port | switches | cabled ports | unreachable |")
    print("|---|---|---|---|---|---|")
    for kind, wall, mads, sw, ports, bad in rows:
        print(f"| {kind} | {wall:.2f} | {mads} | {sw} | {ports} | {bad} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
