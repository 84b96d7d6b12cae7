"""Agent vs node_exporter on the same 8-HCA node fixture, side by side in one run, with a verdict.

Measures /metrics latency (p50, p99) of a running `fabricmon agent` and of
`prometheus-node-exporter --collector.disable-defaults --collector.infiniband`
on the same generated tree, alternating scrapes so both see the same machine
load; then the agent's RSS and its CPU per full poll (8 HCAs + frontend NIC, 8
GPUs over the fake NVML backend, ethtool and config checks).

The agent runs as shipped: systemd/etc/fabricmon/agent.yaml (its sources, rank
intake and stream), pointed at the fixture and streaming to a real `fabricmon
aggregator` (the shipped aggregator.yaml's token auth) on loopback; only paths and
ports are changed.  ``--no-stream`` leaves the aggregator out.

The last line is the verdict against issue 39's goals: node_exporter's latency at
least 3x the agent's at p50 and at p99, and the agent's RSS under 50 MB; the exit
status is 1 when a goal is missed (2 when node_exporter is not installed).

    .venv/bin/python benchmarks/bench_agent.py [--scrapes 1000] [--no-stream] [--keep-alive [--gzip]] [--out results.md]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
SHIPPED_AGENT = REPO / "systemd" / "etc" / "fabricmon" / "agent.yaml"
SHIPPED_TOPOLOGY = REPO / "systemd" / "etc" / "fabricmon" / "topology.yaml"

RATIO_GOAL = 3.0  # node_exporter's latency over the agent's, at p50 and at p99
RSS_GOAL_BYTES = 50 * 10**6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, deadline_s: float = 30.0, want: str | None = None) -> None:
    """Until ``url`` answers 200 (and its body holds ``want``)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200 and (want is None or want in r.read().decode()):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up" + (f" with {want!r}" if want else ""))


def scrape(url: str) -> tuple[float, int]:
    """A new connection a scrape (urllib sends Connection: close)."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


class KeptScraper:
    """Scrapes over one kept-alive connection, as Prometheus does; ``gzip``: with Prometheus'
    Accept-Encoding (the size is then the compressed body's)."""

    def __init__(self, url: str, gzip: bool) -> None:
        u = urllib.parse.urlsplit(url)
        self._conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        self._path = u.path
        self._headers = {"Accept-Encoding": "gzip"} if gzip else {}

    def __call__(self) -> tuple[float, int]:
        t0 = time.perf_counter()
        self._conn.request("GET", self._path, headers=self._headers)
        r = self._conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"{self._path}: HTTP {r.status}")
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


def start_aggregator(tmp: Path, token: Path, log) -> tuple[subprocess.Popen, str]:
    """`fabricmon aggregator` with the shipped topology and token auth, on free loopback ports."""
    grpc_port, http_port = free_port(), free_port()
    cfg = tmp / "aggregator.yaml"
    cfg.write_text(yaml.safe_dump({
        "topology": str(SHIPPED_TOPOLOGY), "cluster": "prod-a", "grpc_listen": f"127.0.0.1:{grpc_port}",
        "http_listen": f"127.0.0.1:{http_port}", "state_file": str(tmp / "incidents.json"),
        "auth": {"token_file": str(token)}}))
    proc = subprocess.Popen([sys.executable, "-m", "fabricmon", "--log-format", "json", "--log-level", "warning",
                             "aggregator", "--config", str(cfg)], cwd=REPO, stdout=log, stderr=log)
    wait_http(f"http://127.0.0.1:{http_port}/healthz")
    return proc, f"127.0.0.1:{grpc_port}"


def agent_config(tmp: Path, root: Path, port: int, aggregator: str | None, token: Path) -> Path:
    """The shipped agent.yaml with the fixture's paths and this run's ports (nothing else changed)."""
    doc = yaml.safe_load(SHIPPED_AGENT.read_text())
    doc.update({"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                "nvml": f"fake:{root / 'nvml.json'}", "listen": f"127.0.0.1:{port}"})
    doc["log"] = {"format": "json", "level": "warning"}
    doc["intake"] = {**doc["intake"], "listen": f"127.0.0.1:{free_port()}", "socket": str(tmp / "ranks.sock")}
    doc["stream"] = {**doc["stream"], "token_file": str(token), "spool_dir": str(tmp / "spool")}
    if aggregator:
        doc["aggregator"] = aggregator
    else:
        doc.pop("aggregator", None)
    path = tmp / "agent.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=1000)
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--no-stream", action="store_true", help="no aggregator: the agent only exports")
    ap.add_argument("--keep-alive", action="store_true",
                    help="one kept-alive connection per target, as Prometheus scrapes (default: one a scrape)")
    ap.add_argument("--gzip", action="store_true", help="with --keep-alive: Accept-Encoding: gzip, as Prometheus")
    ap.add_argument("--out", help="write the markdown table here too")
    args = ap.parse_args()
    ne_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not ne_bin:
        print("verdict: not measured: node_exporter is not installed (apt-get install prometheus-node-exporter)")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="fm-bench-"))
    procs: list[subprocess.Popen] = []
    log = (tmp / "services.log").open("w")
    try:
        root = tmp / "node"
        sys.path.insert(0, str(REPO))
        from fabricmon.sim.fixture import write_fixture
        write_fixture(root, layout="ib", seed=1)
        token = tmp / "token"
        token.write_text("bench-" + os.urandom(16).hex() + "\n")
        aggregator = None
        if not args.no_stream:
            agg, aggregator = start_aggregator(tmp, token, log)
            procs.append(agg)
        ap_port = free_port()
        cfg = agent_config(tmp, root, ap_port, aggregator, token)
        agent = subprocess.Popen([sys.executable, "-m", "fabricmon", "agent", "--config", str(cfg)],
                                 cwd=REPO, stdout=log, stderr=log)
        procs.append(agent)
        ne_port = free_port()
        ne = subprocess.Popen([ne_bin, f"--path.sysfs={root / 'sys'}", "--collector.disable-defaults",
                               "--collector.infiniband", f"--web.listen-address=127.0.0.1:{ne_port}"],
                              stdout=log, stderr=log)
        procs.append(ne)
        agent_url = f"http://127.0.0.1:{ap_port}/metrics"
        targets = {"fabricmon agent": agent_url,
                   "node_exporter --collector.infiniband": f"http://127.0.0.1:{ne_port}/metrics"}
        wait_http(f"http://127.0.0.1:{ap_port}/readyz")
        if aggregator:  # streaming for real before anything is measured
            wait_http(agent_url, want='fabricmon_stream_connected{node="node-000"} 1.0')
        for url in targets.values():
            wait_http(url)
        load_before = os.getloadavg()
        lat: dict[str, list[float]] = {k: [] for k in targets}
        size: dict[str, int] = {}
        scrapers = {name: KeptScraper(url, args.gzip) if args.keep_alive else (lambda u=url: scrape(u))
                    for name, url in targets.items()}
        gc.disable()  # the client's own collections are not either server's latency
        try:
            for _ in range(args.scrapes):  # alternate so both see the same load
                for name, scraper in scrapers.items():
                    dt, n = scraper()
                    lat[name].append(dt)
                    size[name] = n
        finally:
            gc.enable()
        load_after = os.getloadavg()
        rss_agent = psutil.Process(agent.pid).memory_info().rss
        rss_ne = psutil.Process(ne.pid).memory_info().rss
        if agent.poll() is not None:
            raise RuntimeError(f"the agent exited ({agent.returncode}): see {tmp / 'services.log'}")
        rows = [(name, pct(lat[name], 50) * 1e3, pct(lat[name], 99) * 1e3, size[name]) for name in targets]
        cpu, wall = cpu_per_poll(root, args.polls) if args.polls else (0.0, 0.0)
        (_, a50, a99, _), (_, n50, n99, _) = rows
        r50, r99 = n50 / a50, n99 / a99
        mode = "streaming to a real aggregator" if aggregator else "no stream (--no-stream)"
        mode += ("; one kept-alive connection per target" + (", gzip" if args.gzip else "") if args.keep_alive
                 else "; a new connection a scrape")
        lines = [
            f"Scrapes: {args.scrapes} per target, alternating, same 8-HCA (+1 frontend) fixture, one run; "
            f"agent: shipped agent.yaml, {mode}.",
            f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
            f"after: {', '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs).",
            "",
            "| target | p50 ms | p99 ms | exposition bytes | RSS MiB |",
            "|---|---:|---:|---:|---:|",
            *[f"| {n} | {p50:.2f} | {p99:.2f} | {b} | {rss / 2**20:.1f} |"
              for (n, p50, p99, b), rss in zip(rows, (rss_agent, rss_ne), strict=True)],
            "",
            f"p50 ratio node_exporter/agent: {r50:.1f}x; p99 ratio: {r99:.1f}x",
        ]
        if args.polls:
            lines.append(f"Agent full poll (9 NICs, 8 GPUs x 18 NVLinks, ethtool, config checks): "
                         f"{cpu * 1e3:.2f} ms CPU, {wall * 1e3:.2f} ms wall per poll ({args.polls} polls)")
        lines.append(f"Agent RSS after {args.scrapes} scrapes: {rss_agent / 2**20:.1f} MiB ({rss_agent / 1e6:.1f} MB)")
        missed = [what for ok, what in (
            (r50 >= RATIO_GOAL, f"p50 ratio {r50:.1f}x < {RATIO_GOAL:.0f}x"),
            (r99 >= RATIO_GOAL, f"p99 ratio {r99:.1f}x < {RATIO_GOAL:.0f}x"),
            (rss_agent < RSS_GOAL_BYTES, f"RSS {rss_agent / 1e6:.1f} MB >= {RSS_GOAL_BYTES / 1e6:.0f} MB"),
        ) if not ok]
        lines.append(f"verdict: {'FAIL: ' + '; '.join(missed) if missed else 'PASS'} "
                     f"(goals: node_exporter/agent >= {RATIO_GOAL:.0f}x at p50 and p99, "
                     f"agent RSS < {RSS_GOAL_BYTES / 1e6:.0f} MB)")
        text = "\n".join(lines)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 1 if missed else 0
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
