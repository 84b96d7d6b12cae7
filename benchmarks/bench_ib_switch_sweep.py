"""The switch sweep's cost on an ibsim fabric of 64 leaves (20 hosts + 20 uplinks each) and 20 spines of
64 ports: 84 switches, 3,840 cabled switch ports, 1,280 CAs (the research fabric of
docs/benchmarks.md "Switch sweep").  Runs the agent's own ``Sweeper`` (sources/ib_switches) with the real
infiniband-diags under ibsim's preload, opensm assigning LIDs (then not sweeping, so its SMPs leave the
count alone), and reports:

- per sweep kind and per ``port_state`` mode (``walk``: one ``iblinkinfo`` per health sweep; ``smpquery``:
  one process per port) the wall time and the MADs sent, counted from the sweeping port's own
  PortXmitPkts delta (``perfquery -x`` of the local port, its own query subtracted);
- the agent's poll duration (``Poller.poll_once``, the 1 s host poll, wall) on a generated 8-HCA host
  without the sweep, against the same host with ``sources.ib_switches`` enabled while it sweeps the fabric
  back to back (every sweep a full one) in the same process.

Not a test: prints tables.

    PYTHONPATH=tests .venv/bin/python benchmarks/bench_ib_switch_sweep.py [--leaves 64] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fabricmon.config import IbSwitchesConfig, load_agent_config  # noqa: E402
from fabricmon.sources.ib_switches.sweeper import Sweeper  # noqa: E402
from support.ibsimrig import IbSim, two_tier  # noqa: E402

KINDS = ("first (map + health + full)", "health only", "health + full")


def xmit_pkts(sim: IbSim) -> int:
    out = sim.run("perfquery", "-x").stdout
    m = re.search(r"^PortXmitPkts:\.+(\d+)", out, re.M)
    return int(m.group(1)) if m else 0


def sweep_rows(sim: IbSim, mode: str, concurrency: int) -> list[tuple]:
    cfg = IbSwitchesConfig(enabled=True, concurrency=concurrency, health_interval=10, full_interval=60,
                           port_state=mode)
    clock = [0.0]
    sweeper = Sweeper(cfg, monotonic=lambda: clock[0])
    probe = xmit_pkts(sim)
    probe_cost = xmit_pkts(sim) - probe  # the counting query's own MADs
    rows = []
    for kind in KINDS:
        before = xmit_pkts(sim)
        t0 = time.monotonic()
        snap = sweeper.sweep_once()
        wall = time.monotonic() - t0
        mads = xmit_pkts(sim) - before - probe_cost
        ports = sum(len(s.switch.cables) for s in snap.switches)
        states = sum(len(s.states) for s in snap.switches)
        rows.append((mode, kind, wall, mads, len(snap.switches), ports, states, snap.unreachable))
        clock[0] += 10 if kind.startswith("first") else 60
    sweeper.stop()
    return rows


def poll_walls(agent, polls: int, gap_s: float) -> list[float]:
    out = []
    for _ in range(polls):
        t0 = time.perf_counter()
        agent.poller.poll_once()
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(gap_s)
    return out


def host_agent(tmp: Path, root: Path, ib_switches: dict | None):
    from fabricmon.agent.runtime import build_agent

    data: dict = {"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                  "nvml": f"fake:{root / 'nvml.json'}"}
    if ib_switches is not None:
        data["sources"] = {"ib_switches": ib_switches}
    path = tmp / f"agent-{'sweep' if ib_switches else 'host'}.yaml"
    path.write_text(yaml.safe_dump(data))
    return build_agent(load_agent_config(path))


def poll_rows(tmp: Path, concurrency: int, mode: str, polls: int) -> list[tuple]:
    from fabricmon.sim.fixture import write_fixture

    root = tmp / "node"
    write_fixture(root, layout="ib", seed=1)
    rows = []
    host = host_agent(tmp, root, None)
    host.poller.poll_once()  # warm: inventory caches, string tables
    rows.append(("host poll, no sweep", poll_walls(host, polls, 0.2), len(host.poller.latest.samples)))
    host.poller.close()
    sweeping = host_agent(tmp, root, {"enabled": True, "concurrency": concurrency, "health_interval": 1,
                                      "full_interval": 1, "port_state": mode})
    sweeping.poller.poll_once()  # starts the sweep thread
    src = next(st.source for st in sweeping.poller._states if st.source.name == "ib_switches")
    sweeper = src._sweeper
    deadline = time.monotonic() + 300
    while not sweeper.snapshot().ended_at and time.monotonic() < deadline:
        time.sleep(0.5)
    sweeps_before = sweeper.snapshot().ended_at
    walls = poll_walls(sweeping, polls, 0.2)
    swept = sweeper.snapshot().ended_at != sweeps_before  # at least one sweep ended while polling
    rows.append((f"host poll + ib_switches ({mode}), {'sweeping' if swept else 'NO sweep ended'}", walls,
                 len(sweeping.poller.latest.samples)))
    sweeping.poller.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leaves", type=int, default=64)
    ap.add_argument("--hosts", type=int, default=20)
    ap.add_argument("--spines", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--modes", default="walk,smpquery")
    ap.add_argument("--polls", type=int, default=50)
    args = ap.parse_args()
    fabric = two_tier(args.leaves, args.hosts, args.spines, ports=args.hosts + args.spines,
                      spine_ports=max(64, args.leaves))
    rows: list[tuple] = []
    with tempfile.TemporaryDirectory() as tmp, IbSim(fabric, Path(tmp), sm_sweep_s=0) as sim:
        os.environ.update({k: sim.env[k] for k in ("IBSIM_SOCKNAME", "LD_PRELOAD")})  # for the tools it spawns
        os.chdir(tmp)  # the preload writes a sys-<pid> tree into each tool's working directory
        modes = [m for m in args.modes.split(",") if m]
        for mode in modes:
            rows += sweep_rows(sim, mode, args.concurrency)
        polls = poll_rows(Path(tmp), args.concurrency, modes[0], args.polls)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")
    print("| port_state | sweep | wall s | MADs from the sweeping port | switches | cabled ports | port states read "
          "| unreachable |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for mode, kind, wall, mads, sw, ports, states, bad in rows:
        print(f"| {mode} | {kind} | {wall:.2f} | {mads} | {sw} | {ports} | {states} | {bad} |")
    print()
    print("| agent poll | polls | samples per poll | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, walls, samples in polls:
        q = statistics.quantiles(walls, n=100, method="inclusive")
        print(f"| {label} | {len(walls)} | {samples} | {statistics.median(walls):.1f} | {q[98]:.1f} "
              f"| {max(walls):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
