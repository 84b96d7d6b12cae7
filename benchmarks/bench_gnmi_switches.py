"""The gnmi_switches source's cost: 64 switches x 64 ports streaming SAMPLE every 10 s, as the agent
serves them (the source's subscription thread plus the agent's 1 s poll of it).  The switches are the
in-process gNMI target of the tests (tests/support/gnmitarget.py) in a child process, so their CPU is not
counted; every counter of every port changes every sample (the worst case: each value decoded and a new
Reading built).  Reports the source's CPU (process CPU seconds per wall second over the measured window),
its resident memory growth, the series served and the poll's time.  Not a test: prints a table.

    PYTHONPATH=tests .venv/bin/python benchmarks/bench_gnmi_switches.py [--switches 64] [--ports 64]
        [--interval 10] [--measure 60] [--profile sonic|openconfig]
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fabricmon.agent.poller import Poller  # noqa: E402
from fabricmon.config import GnmiSwitchesConfig, GnmiTargetConfig  # noqa: E402
from fabricmon.sources.gnmi_switches.source import GnmiSwitchesSource  # noqa: E402
from fabricmon.sources.inventory import Inventory  # noqa: E402
from support.gnmitarget import ScriptedTarget, TargetServer, load_fixture  # noqa: E402


def _scaled(profile: str, ports: int) -> list[dict]:
    """The profile's fixture with its first port's notifications repeated for ``ports`` ports."""
    base = load_fixture(profile)
    out: list[dict] = []
    if profile == "sonic":
        for n in base:
            upd = dict(n["updates"])
            for path, value in n["updates"].items():
                if path == "COUNTERS/Ethernet0":
                    for p in range(ports):
                        upd[f"COUNTERS/Ethernet{p * 4}"] = copy.deepcopy(value)
                    upd.pop("COUNTERS/Ethernet4", None)
                elif isinstance(value, dict):
                    first = {k: v for k, v in value.items() if k.startswith("Ethernet0")}
                    rows = {}
                    for p in range(ports):
                        for k, v in first.items():
                            rows[k.replace("Ethernet0", f"Ethernet{p * 4}", 1)] = copy.deepcopy(v)
                    upd[path] = rows if rows else value
            out.append({**n, "updates": upd})
        return out
    for n in base:
        if "Ethernet1/1" not in n["prefix"]:
            continue
        for p in range(ports):
            out.append({**copy.deepcopy(n), "prefix": n["prefix"].replace("Ethernet1/1", f"Ethernet1/{p + 1}")})
    return out


def _bump(obj, k: int):
    """Every counter-like value advanced (strings of digits as RFC 7951 writes uint64, and integers)."""
    if isinstance(obj, dict):
        return {key: _bump(v, k) for key, v in obj.items()}
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return obj + k
    if isinstance(obj, str) and obj.isdigit():
        return str(int(obj) + k)
    return obj


def serve(profile: str, switches: int, ports: int, interval: float, ready, stop) -> None:
    notes = _scaled(profile, ports)
    servers = []
    for _ in range(switches):
        t = ScriptedTarget(profile)
        t.notifications = copy.deepcopy(notes)
        servers.append(TargetServer(t))
    ready.send([s.address for s in servers])
    k = 0
    while not stop.wait(interval):
        k += 1
        for s in servers:
            with s.target.lock:
                s.target.notifications = [{**n, "updates": _bump(n["updates"], 1)} for n in s.target.notifications]
    for s in servers:
        s.stop()


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--switches", type=int, default=64)
    ap.add_argument("--ports", type=int, default=64)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--measure", type=float, default=60.0)
    ap.add_argument("--profile", choices=("sonic", "openconfig"), default="sonic")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    stop = ctx.Event()
    proc = ctx.Process(target=serve, args=(args.profile, args.switches, args.ports, args.interval, child, stop),
                       daemon=True)
    proc.start()
    addresses = parent.recv()
    rss0 = rss_kib()
    cfg = GnmiSwitchesConfig(enabled=True, interval=args.interval, targets=tuple(
        GnmiTargetConfig(name=f"leaf-{i:02d}", address=a, profile=args.profile, insecure=True)
        for i, a in enumerate(addresses)))
    source = GnmiSwitchesSource(cfg)
    poller = Poller("bench", [source], lambda: Inventory(sysfs_root="/nonexistent"))
    poller.poll_once()
    t0 = time.monotonic()
    while True:  # every switch synced and delivering
        snap = poller.poll_once()
        up = sum(1 for s in snap.samples if s.family == "fabricmon_switch_gnmi_up" and s.value == 1)
        if up == args.switches or time.monotonic() - t0 > 120:
            break
        time.sleep(0.5)
    sync_s = time.monotonic() - t0
    time.sleep(args.interval)  # one sample after sync, so the measured window is steady state
    cpu0, wall0 = time.process_time(), time.monotonic()
    polls: list[float] = []
    while time.monotonic() - wall0 < args.measure:
        p0 = time.monotonic()
        snap = poller.poll_once()
        polls.append(time.monotonic() - p0)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - p0)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    series = sum(1 for s in snap.samples if s.family.startswith("fabricmon_switch"))
    updates = sum(s.value for s in snap.samples if s.family == "fabricmon_switch_gnmi_updates_total")
    failures = sum(s.value for s in snap.samples if s.family == "fabricmon_switch_gnmi_failures_total")
    rss1 = rss_kib()
    source.close()
    stop.set()
    proc.join(10)
    polls.sort()
    load = os.getloadavg()[0]
    print(f"| {args.profile} | {args.switches} x {args.ports} | {args.interval:g} s | {up}/{args.switches} in "
          f"{sync_s:.1f} s | {series:,} | {cpu / wall * 100:.1f}% of a core | {(rss1 - rss0) / 1024:.0f} MiB | "
          f"{polls[len(polls) // 2] * 1000:.1f} / {polls[-1] * 1000:.1f} ms | {failures:g} | load {load:.1f} |")
    print(json.dumps({"updates_total": updates, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      / 1024}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
