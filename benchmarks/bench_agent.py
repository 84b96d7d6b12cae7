"""Agent vs node_exporter on the same 8-HCA node fixture, side by side in one run.

Measures /metrics latency (p50, p99) of a running `fabricmon agent` and of
`prometheus-node-exporter --collector.disable-defaults --collector.infiniband`
on the same generated tree, alternating scrapes so both see the same machine
load; then the agent's CPU per full poll (8 HCAs + frontend NIC, 8 GPUs over
the fake NVML backend, ethtool and config checks) and its RSS.

    .venv/bin/python benchmarks/bench_agent.py [--scrapes 300] [--out results.md]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, deadline_s: float = 15.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def scrape(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def cpu_per_poll(root: Path, polls: int) -> tuple[float, float]:
    sys.path.insert(0, str(REPO))
    from fabricmon.agent.runtime import build_agent
    from fabricmon.config import load_agent_config

    cfg = load_agent_config(None, {"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                                   "nvml": f"fake:{root / 'nvml.json'}"})
    agent = build_agent(cfg)
    agent.poller.poll_once()  # warm: inventory caches, string tables
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(polls):
        agent.poller.poll_once()
    cpu = (time.process_time() - c0) / polls
    wall = (time.perf_counter() - w0) / polls
    agent.poller.close()
    return cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--out", help="write the markdown table here too")
    args = ap.parse_args()
    ne_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    tmp = Path(tempfile.mkdtemp(prefix="fm-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        root = tmp / "node"
        sys.path.insert(0, str(REPO))
        from fabricmon.sim.fixture import write_fixture
        write_fixture(root, layout="ib", seed=1)
        ap_port = free_port()
        agent = subprocess.Popen(
            [sys.executable, "-m", "fabricmon", "--log-format", "json", "--log-level", "warning", "agent",
             "--sysfs-root", str(root / "sys"), "--ethtool-dir", str(root / "ethtool"),
             "--nvml", f"fake:{root / 'nvml.json'}", "--listen", f"127.0.0.1:{ap_port}", "--interval", "1"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(agent)
        targets = {"fabricmon agent": f"http://127.0.0.1:{ap_port}/metrics"}
        if ne_bin:
            ne_port = free_port()
            ne = subprocess.Popen([ne_bin, f"--path.sysfs={root / 'sys'}", "--collector.disable-defaults",
                                   "--collector.infiniband", f"--web.listen-address=127.0.0.1:{ne_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(ne)
            targets["node_exporter --collector.infiniband"] = f"http://127.0.0.1:{ne_port}/metrics"
        wait_http(f"http://127.0.0.1:{ap_port}/readyz")
        for url in targets.values():
            wait_http(url)
        lat: dict[str, list[float]] = {k: [] for k in targets}
        size: dict[str, int] = {}
        for _ in range(args.scrapes):  # alternate so both see the same load
            for name, url in targets.items():
                dt, n = scrape(url)
                lat[name].append(dt)
                size[name] = n
        rss_agent = psutil.Process(agent.pid).memory_info().rss
        rows = []
        for name in targets:
            rows.append((name, pct(lat[name], 50) * 1e3, pct(lat[name], 99) * 1e3, size[name]))
        cpu, wall = cpu_per_poll(root, args.polls)
        lines = [
            f"Scrapes: {args.scrapes} per target, alternating, same 8-HCA (+1 frontend) fixture, one run.",
            "",
            "| target | p50 ms | p99 ms | exposition bytes |",
            "|---|---:|---:|---:|",
            *[f"| {n} | {p50:.2f} | {p99:.2f} | {b} |" for n, p50, p99, b in rows],
        ]
        if len(rows) == 2:
            lines += ["", f"p50 ratio node_exporter/agent: {rows[1][1] / rows[0][1]:.1f}x; "
                          f"p99 ratio: {rows[1][2] / rows[0][2]:.1f}x"]
        lines += ["", f"Agent full poll (9 NICs, 8 GPUs x 18 NVLinks, ethtool, config checks): "
                      f"{cpu * 1e3:.2f} ms CPU, {wall * 1e3:.2f} ms wall per poll ({args.polls} polls)",
                  f"Agent RSS after {args.scrapes} scrapes: {rss_agent / 2**20:.1f} MiB"]
        text = "\n".join(lines)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 0
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
