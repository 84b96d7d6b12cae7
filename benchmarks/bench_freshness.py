"""Central cost, side by side: a real Prometheus scraping N nodes at 1 s vs the aggregator streaming them.

    .venv/bin/python benchmarks/bench_freshness.py [--nodes 32] [--seconds 60] [--warmup 15]
                                                   [--profile OUT.prof] [--json OUT]

One run, three kinds of process:

* nodes (one process): the simulator in tree mode advanced in real time (1 s); every node
  is a real agent (Poller over its rendered sysfs/ethtool/NVML tree) whose real HTTP
  exporter serves the full ``/metrics`` exposition, and whose snapshots go to a real
  ``StreamClient`` (codec, spool, acks) over real gRPC on loopback, rank timings included;
* Prometheus (the installed binary) scraping every node's ``/metrics`` every 1 s;
* the aggregator (``python -m fabricmon aggregator``, its own process) ingesting every
  node's stream and ticking.

Measured for each central process over ``--seconds`` after ``--warmup``: CPU seconds per
second (utime + stime from /proc/<pid>/stat), RSS (VmRSS), and freshness: the age of the
newest data at a query, for the median node (Prometheus: query time minus the median of the
scraped ``fabricmon_snapshot_timestamp_seconds``, the nodes' own sample times; aggregator, run
with ``clock.mode: sample``: wall time minus ``fabricmon_cluster_clock_timestamp_seconds``,
the median of the nodes' newest ingested sample times).  Extrapolation to 1,024 and 4,096 nodes is linear in the
measured per-node cost.  The last line is ``central CPU ratio aggregator/prometheus = X``.

``--compare-gate`` runs a second aggregator beside the first with ``grpc_limits.connection_gate: false``
(gRPC listening itself, no relay), every node streaming to both, and prints the connection gate's
CPU cost: the difference between the two on the same streams in the same run.

``--against TREE`` runs the second aggregator from another source tree instead (a ``git worktree`` of
the commit to compare with), configured as shipped (gate on), on the same streams: before and after a
change side by side in one run, on the same load; it prints the two and their ratio.

Every aggregator line says how many batches it ingested per node-second over the measured window: the
nodes' simulator runs in real time only while the machine has the CPU for it, and a slower batch rate
makes the aggregator's cost look smaller beside Prometheus, which scrapes every second regardless.

``--floor`` runs, as the second central process on the same streams, a gRPC server that does only
what no aggregator can skip: it takes each node's hello, sends the aggregator's own subscription (so the
nodes send exactly what they send the aggregator) and acks every batch, decoding nothing past gRPC's
message parse, ingesting nothing, never ticking, no connection gate, no /metrics.  Its CPU beside
Prometheus' is the floor of the central CPU ratio on this machine with grpcio, in the same run.

``--together`` puts a relay in the nodes' process between every stream and the central processes that holds
what the nodes send until they have sent nothing for ``QUIET_S`` (at most ``HOLD_S``) and then writes it all
at once (acks and everything toward the nodes pass at once): the 32 clients in one process encode under one GIL, one
after another, so without it a second's batches reach the aggregator over tens of milliseconds, one at a
time; with it they arrive as a large cluster's aligned agents send them, many to a wake-up.  The relay's
CPU is the nodes' process's; freshness is up to ``HOLD_S`` later.

``--profile OUT`` runs the aggregator under cProfile instead (its gRPC event loop thread
and the tick thread, from the end of the warm-up on: the steady state, not the first
connections; the CPU numbers then include the profiler's overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMETHEUS = shutil.which("prometheus")
CLK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------- /proc readings


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of the same name summed): where a process spends it."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / CLK
    return out


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
        return r.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench_freshness: timed out waiting for {what}")


# --------------------------------------------------------------------- role: nodes


class _Intake:
    """The agent intake's interface for the stream client: rank timings the simulated job wrote."""

    def __init__(self) -> None:
        self._ranks: list = []
        self._layouts: list = []
        self._lock = threading.Lock()

    def add(self, ranks, layouts=()) -> None:
        with self._lock:
            self._ranks.extend(ranks)
            self._layouts.extend(layouts)

    def drain(self):
        with self._lock:
            r, lay = self._ranks, self._layouts
            self._ranks, self._layouts = [], []
        return r, lay


# --together: a second's batches leave the 32 clients over 70-92 ms, 2-3 ms apart
QUIET_S = 0.03
HOLD_S = 0.3


class _Together:
    """``--together``: a TCP relay per central target; what nodes send is held and written all at once."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self._first = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="together-relay", daemon=True)
        self._thread.start()

    def relay(self, target: str) -> str:
        """A local address whose connections are relayed to ``target``."""
        host, port = target.rsplit(":", 1)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: bool) -> None:
            while data := await reader.read(256 * 1024):
                if hold:
                    self._hold(writer, data)
                else:
                    writer.write(data)
            writer.close()

        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_r, up_w = await asyncio.open_connection(host, int(port))
            except OSError:  # not listening yet: the client sees its connection closed and retries
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False), return_exceptions=True)

        async def listen() -> int:
            server = await asyncio.start_server(conn, "127.0.0.1", 0)
            return server.sockets[0].getsockname()[1]

        return f"127.0.0.1:{asyncio.run_coroutine_threadsafe(listen(), self.loop).result(10)}"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)

    def _hold(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        now = self.loop.time()
        if not self._held:
            self._first = now
        self._held.append((writer, data))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(min(now + QUIET_S, self._first + HOLD_S), self._flush)

    def _flush(self) -> None:
        self._timer = None
        held, self._held = self._held, []
        for writer, data in held:
            if not writer.is_closing():
                writer.write(data)


def role_nodes(a: argparse.Namespace) -> int:
    from fabricmon.agent.stream import StreamClient
    from fabricmon.logs import configure_logging
    from fabricmon.sim.runner import SimulatedCluster
    from fabricmon.sim.scenario import default_scenario

    configure_logging("console", "error")  # connect retries before the aggregator is up are expected
    scn = default_scenario(a.nodes, 1e6, nodes_per_unit=min(16, a.nodes))
    clients: dict[str, StreamClient] = {}
    intakes: dict[str, _Intake] = {}

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    twins: dict[str, tuple[StreamClient, _Intake]] = {}  # --compare-gate/--against: each node streams to both

    def on_snapshot(node, snap, ranks) -> None:
        c = clients.get(node)
        if c is not None:
            intakes[node].add(ranks)
            c.offer(snap)
        twin = twins.get(node)
        if twin is not None:
            twin[1].add(ranks)
            twin[0].offer(snap)

    target, target2 = a.aggregator, a.aggregator2
    relay = None
    if a.together:
        relay = _Together()
        target = relay.relay(target)
        target2 = relay.relay(target2) if target2 else target2
    with SimulatedCluster(scn, epoch=time.time(), http=True, on_snapshot=on_snapshot, poll_workers=2) as sim:
        sim.write_topology(a.topology_out)
        sim.start()
        for node in sim.cluster.names:
            intakes[node] = _Intake()
            clients[node] = StreamClient(target, node, intake=intakes[node]).start()
            if target2:
                twin_intake = _Intake()
                twins[node] = (StreamClient(target2, node, intake=twin_intake).start(), twin_intake)
        tmp = a.ports_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(sim.tree_agents.http_ports, f)
        os.replace(tmp, a.ports_out)
        sim.run(speed=1.0, stop=stop)
        for c in [*clients.values(), *(t[0] for t in twins.values())]:
            c.stop(timeout=2.0)
        if relay is not None:
            relay.close()
        acked = sum(c.stats().get("batches_acked_total", 0) for c in clients.values())
        print(json.dumps({"steps": sim.steps, "batches_acked": acked}), flush=True)
    return 0


# --------------------------------------------------------------------- role: profiled aggregator


def role_aggregator(a: argparse.Namespace) -> int:
    """The aggregator service as ``fabricmon aggregator`` runs it, with cProfile in its busy threads."""
    import cProfile
    import pstats

    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.aggregator.service import build_runtime
    from fabricmon.logs import configure_logging

    configure_logging("console", "warning")
    cfg = load_aggregator_config(a.config)
    rt = build_runtime(cfg).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # thread CPU time, not wall time: a loaded machine must not charge waiting to the code
    loop_prof, tick_prof = cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)
    rt.grpc.loop.call_soon_threadsafe(rt.grpc.loop.call_later, a.profile_after, loop_prof.enable)
    tick_from = time.monotonic() + a.profile_after

    def between() -> None:
        if tick_from is not None and time.monotonic() >= tick_from and not ticking.is_set():
            ticking.set()
            tick_prof.enable()

    ticking = threading.Event()
    try:
        rt.run(stop, log_incidents=False, between=between)
    finally:
        tick_prof.disable()
        done = threading.Event()

        def _off() -> None:
            loop_prof.disable()
            done.set()

        rt.grpc.loop.call_soon_threadsafe(_off)
        done.wait(5)
        rt.stop(grace=1.0, flush=0.5)
    st = pstats.Stats(loop_prof)
    st.add(tick_prof)
    st.dump_stats(a.profile)
    return 0


# --------------------------------------------------------------------- role: the transport floor


def role_floor(a: argparse.Namespace) -> int:
    """A FabricStream server that answers the hello and acks each batch, nothing else (see ``--floor``)."""
    import grpc

    from fabricmon.aggregator.engine import Engine
    from fabricmon.proto import fabricmon_pb2 as pb
    from fabricmon.proto.subscription import Subscription

    subscription = Subscription(frozenset(Engine.read_delta_families),
                                frozenset(Engine.read_gauge_families)).to_pb()
    acked = 0

    async def stream(_requests, context) -> None:
        nonlocal acked
        first = await context.read()
        if first is grpc.aio.EOF:  # type: ignore[comparison-overlap]
            return
        await context.write(subscription)
        await context.write(pb.AggregatorMessage(ack=pb.Ack(seq=0)))
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:  # type: ignore[comparison-overlap]
                return
            if msg.WhichOneof("msg") == "batch":
                acked += 1
                await context.write(pb.AggregatorMessage(ack=pb.Ack(seq=msg.batch.seq)))

    async def serve() -> None:
        handler = grpc.method_handlers_generic_handler("fabricmon.v1.FabricStream", {
            "Stream": grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=pb.AgentMessage.FromString,
                response_serializer=pb.AggregatorMessage.SerializeToString)})
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(a.listen)
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0.5)

    asyncio.run(serve())
    print(json.dumps({"floor_batches_acked": acked}), flush=True)
    return 0


# --------------------------------------------------------------------- orchestration


def prometheus_config(ports: dict[str, int], path: Path) -> None:
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports.values())
    path.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: fabricmon-agent\n    static_configs: [{{targets: [{targets}]}}]\n")


def prom_query(port: int, q: str) -> float:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    data = json.loads(http_get(url))
    res = data["data"]["result"]
    if not res:
        return float("nan")
    return float(res[0]["value"][1])


def agg_clock(port: int) -> float:
    for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith("fabricmon_cluster_clock_timestamp_seconds"):
            return float(line.split()[-1])
    return float("nan")


def ingested(port: int) -> float:
    """The aggregator's fabricmon_ingest_batches_total."""
    return next((float(line.split()[-1]) for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines()
                 if line.startswith("fabricmon_ingest_batches_total ")), float("nan"))


def _median(xs: list[float]) -> float:
    xs = sorted(x for x in xs if x == x)
    return xs[len(xs) // 2] if xs else float("nan")


def orchestrate(a: argparse.Namespace) -> int:
    if PROMETHEUS is None:
        print("bench_freshness: the prometheus binary is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="fabricmon-fresh-"))
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        grpc_port, http_port, prom_port = free_port(), free_port(), free_port()
        grpc_port2, http_port2 = free_port(), free_port()
        topo, ports_file = work / "topology.yaml", work / "ports.json"
        second = a.compare_gate or a.against or a.floor
        twin = ["--aggregator2", f"127.0.0.1:{grpc_port2}"] if second else []
        nodes = subprocess.Popen(
            [sys.executable, __file__, "--role", "nodes", "--nodes", str(a.nodes), "--aggregator",
             f"127.0.0.1:{grpc_port}", "--topology-out", str(topo), "--ports-out", str(ports_file), *twin,
             *(["--together"] if a.together else [])],
            env=env, stdout=subprocess.PIPE, text=True)
        procs.append(nodes)
        wait_for(ports_file.exists, 120, "the simulated nodes")
        ports = json.loads(ports_file.read_text())
        cfg = work / "aggregator.yaml"
        cfg.write_text(f"topology: {topo}\ngrpc_listen: 127.0.0.1:{grpc_port}\nhttp_listen: 127.0.0.1:{http_port}\n"
                       "auth: {insecure: true}\nclock: {mode: sample}\n")
        if a.profile:
            agg_cmd = [sys.executable, __file__, "--role", "aggregator", "--config", str(cfg),
                       "--profile", str(Path(a.profile).resolve()), "--profile-after", str(a.warmup)]
        else:
            agg_cmd = [sys.executable, "-m", "fabricmon", "--log-level", "warning", "aggregator", "--config", str(cfg)]
        agg = subprocess.Popen(agg_cmd, env=env, stdout=subprocess.DEVNULL)
        procs.append(agg)
        agg2: subprocess.Popen | None = None
        if a.against:  # another source tree's aggregator, configured as shipped, on the same streams
            cfg2 = work / "aggregator-against.yaml"
            cfg2.write_text(f"topology: {topo}\ngrpc_listen: 127.0.0.1:{grpc_port2}\n"
                            f"http_listen: 127.0.0.1:{http_port2}\nauth: {{insecure: true}}\nclock: {{mode: sample}}\n")
            agg2 = subprocess.Popen([sys.executable, "-m", "fabricmon", "--log-level", "warning", "aggregator",
                                     "--config", str(cfg2)], cwd=a.against,
                                    env=dict(os.environ, PYTHONPATH=str(Path(a.against).resolve())),
                                    stdout=subprocess.DEVNULL)
            procs.append(agg2)
        elif a.floor:  # the transport floor on the same streams (role_floor)
            agg2 = subprocess.Popen([sys.executable, __file__, "--role", "floor", "--listen",
                                     f"127.0.0.1:{grpc_port2}"], env=env, stdout=subprocess.PIPE, text=True)
            procs.append(agg2)
        elif a.compare_gate:  # the same, with gRPC listening itself: no connection gate
            cfg2 = work / "aggregator-nogate.yaml"
            cfg2.write_text(f"topology: {topo}\ngrpc_listen: 127.0.0.1:{grpc_port2}\n"
                            f"http_listen: 127.0.0.1:{http_port2}\nauth: {{insecure: true}}\nclock: {{mode: sample}}\n"
                            "grpc_limits: {connection_gate: false}\n")
            agg2 = subprocess.Popen([sys.executable, "-m", "fabricmon", "--log-level", "warning", "aggregator",
                                     "--config", str(cfg2)], env=env, stdout=subprocess.DEVNULL)
            procs.append(agg2)
        pcfg = work / "prometheus.yml"
        prometheus_config(ports, pcfg)
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={pcfg}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(prom)
        wait_for(lambda: http_get(f"http://127.0.0.1:{http_port}/readyz") == b"ready\n", 60, "the aggregator")
        wait_for(lambda: b"ready" in http_get(f"http://127.0.0.1:{prom_port}/-/ready").lower(), 60, "Prometheus")
        if agg2 is not None and not a.floor:
            wait_for(lambda: http_get(f"http://127.0.0.1:{http_port2}/readyz") == b"ready\n", 60,
                     "the second aggregator")
        elif a.floor:  # a floor that never listened would read as a floor of 0 cores
            wait_for(lambda: socket.create_connection(("127.0.0.1", grpc_port2), timeout=1).close() is None,
                     60, "the floor server")
        time.sleep(a.warmup)
        second_name = "aggregator_against" if a.against else "floor" if a.floor else "aggregator_nogate"
        ingested0 = {name: ingested(port) for name, port in (("aggregator", http_port), (second_name, http_port2))
                     if name == "aggregator" or (agg2 is not None and not a.floor)}
        th0 = thread_cpu(agg.pid)
        pids = {"aggregator": agg.pid, "prometheus": prom.pid, "nodes": nodes.pid}
        if agg2 is not None:
            pids[second_name] = agg2.pid
        c0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
        t0 = time.monotonic()
        ages: dict[str, list[float]] = {"aggregator": [], "prometheus": [], second_name: []}
        up: list[float] = []
        end = t0 + a.seconds
        while time.monotonic() < end:
            time.sleep(min(1.37, max(0.0, end - time.monotonic())))  # off the 1 s grid on purpose
            now = time.time()
            try:
                ages["prometheus"].append(now - prom_query(prom_port,
                                                           "quantile(0.5, fabricmon_snapshot_timestamp_seconds)"))
                up.append(prom_query(prom_port, "sum(up)"))
            except Exception:  # a slow query is a missed reading, not a failure
                pass
            # the second aggregator is asked as often: rendering /metrics is part of what each one costs
            for name, port in (("aggregator", http_port), (second_name, http_port2 if agg2 and not a.floor else 0)):
                if not port:
                    continue
                try:
                    ages[name].append(time.time() - agg_clock(port))
                except Exception:
                    pass
        wall = time.monotonic() - t0
        c1 = {k: cpu_seconds(pid) for k, pid in pids.items()}
        acked = {name: ingested(port) for name, port in (("aggregator", http_port), (second_name, http_port2))
                 if name in ingested0}
        # batches per node-second over the window: what the CPU figures were spent on
        rate = {name: (acked[name] - ingested0[name]) / wall / a.nodes for name in acked}
        th1 = thread_cpu(agg.pid)
        rss = {"aggregator": rss_mib(agg.pid), "prometheus": rss_mib(prom.pid)}
        series = next((float(line.split()[-1]) for line in http_get(f"http://127.0.0.1:{prom_port}/metrics")
                       .decode().splitlines() if line.startswith("prometheus_tsdb_head_series ")), float("nan"))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    node_out = nodes.stdout.read() if nodes.stdout else ""
    floor_out = agg2.stdout.read() if a.floor and agg2 is not None and agg2.stdout else ""
    cpu = {k: (c1[k] - c0[k]) / wall for k in c0}
    n = a.nodes
    ratio = cpu["aggregator"] / cpu["prometheus"] if cpu["prometheus"] > 0 else float("nan")
    lines = [
        f"nodes {n}, measured {wall:.0f} s after {a.warmup:.0f} s warm-up, 1 s interval"
        + (f"; --together: the nodes' bytes held until {QUIET_S * 1000:.0f} ms without any (at most "
           f"{HOLD_S * 1000:.0f} ms), then sent at once" if a.together else ""),
        "real: Prometheus binary scraping each node's full agent /metrics over HTTP; aggregator process "
        "(`fabricmon aggregator`) fed by each node's StreamClient over gRPC on loopback (codec, acks); agents "
        "(Poller over simulated sysfs/ethtool/NVML trees) - simulated: the hardware behind the trees",
        f"prometheus: {cpu['prometheus']:.3f} cores, RSS {rss['prometheus']:.0f} MiB, head series {series:.0f}, "
        f"targets up {_median(up):.0f}/{n}, freshness median {_median(ages['prometheus']):.2f} s "
        f"(max {max(ages['prometheus'], default=float('nan')):.2f} s)",
        f"aggregator: {cpu['aggregator']:.3f} cores, RSS {rss['aggregator']:.0f} MiB, freshness median "
        f"{_median(ages['aggregator']):.2f} s (max {max(ages['aggregator'], default=float('nan')):.2f} s), "
        f"{rate['aggregator']:.2f} batches per node-second ingested, "
        f"{cpu['aggregator'] / max(rate['aggregator'] * n, 1e-9) * 1e6:.0f} us CPU per batch"
        + (" [under cProfile]" if a.profile else ""),
        "aggregator threads (cores): " + ", ".join(
            f"{k} {(v - th0.get(k, 0.0)) / wall:.3f}" for k, v in sorted(th1.items(), key=lambda kv: -kv[1])
            if v - th0.get(k, 0.0) > 0),
        f"node side (not central, all {n} agents in one process): {cpu['nodes']:.3f} cores",
    ]
    if "aggregator_nogate" in cpu:
        gate = cpu["aggregator"] - cpu["aggregator_nogate"]
        lines.append(f"aggregator without the connection gate (grpc_limits.connection_gate: false, same streams, "
                     f"same run): {cpu['aggregator_nogate']:.3f} cores; the gate's cost: {gate:+.4f} cores "
                     f"({gate / cpu['aggregator_nogate'] * 100 if cpu['aggregator_nogate'] else float('nan'):+.1f} %, "
                     f"{gate / n * 1e6:+.0f} us per node-second); batches ingested {acked}, per node-second "
                     f"{rate}")
    if "aggregator_against" in cpu:
        other = cpu["aggregator_against"]
        lines.append(f"aggregator from {a.against} (as shipped, same streams, same run): {other:.3f} cores, "
                     f"freshness median {_median(ages['aggregator_against']):.2f} s, "
                     f"{rate['aggregator_against']:.2f} batches per node-second; this tree / that tree = "
                     f"{cpu['aggregator'] / other if other else float('nan'):.3f}; its central CPU ratio "
                     f"aggregator/prometheus = {other / cpu['prometheus'] if cpu['prometheus'] else float('nan'):.3f}")
    if "floor" in cpu:
        fl = cpu["floor"]
        fl_acked = json.loads(floor_out.strip().splitlines()[-1])["floor_batches_acked"] if floor_out.strip() else 0
        per_batch = fl / max(rate["aggregator"] * n, 1e-9) * 1e6  # the same streams' batches as the aggregator's
        lines.append(f"transport floor (--floor: hello, subscription, an ack per batch; no decode, ingest, tick, gate "
                     f"or /metrics; same streams, same run): {fl:.3f} cores, {per_batch:.0f} us per batch "
                     f"({fl_acked} batches acked in all); its ratio to prometheus = "
                     f"{fl / cpu['prometheus'] if cpu['prometheus'] else float('nan'):.3f}; the aggregator above it: "
                     f"{cpu['aggregator'] - fl:+.3f} cores")
    for m in (1024, 4096):
        lines.append(f"extrapolated to {m} nodes (linear in per-node cost): prometheus "
                     f"{cpu['prometheus'] / n * m:.2f} cores, aggregator {cpu['aggregator'] / n * m:.2f} cores")
    lines.append(f"central CPU ratio aggregator/prometheus = {ratio:.3f}")
    print("\n".join(lines))
    if node_out.strip():
        print(f"# node side: {node_out.strip().splitlines()[-1]}", file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps({"nodes": n, "seconds": wall, "cpu_cores": cpu, "rss_mib": rss,
                                            "freshness_median_s": {k: _median(v) for k, v in ages.items()},
                                            "batches_per_node_second": rate, "ratio": ratio}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--profile", help="run the aggregator under cProfile and write the stats here")
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--compare-gate", action="store_true",
                    help="also run an aggregator without the connection gate on the same streams: the gate's cost")
    ap.add_argument("--against", metavar="TREE",
                    help="also run the aggregator of another source tree (as shipped) on the same streams")
    ap.add_argument("--together", action="store_true",
                    help="relay the nodes' streams so each second's batches reach the central processes at once")
    ap.add_argument("--floor", action="store_true",
                    help="also run a gRPC server that only acks, on the same streams: the transport's floor")
    ap.add_argument("--role", choices=["orchestrate", "nodes", "aggregator", "floor"], default="orchestrate",
                    help=argparse.SUPPRESS)
    ap.add_argument("--aggregator", help=argparse.SUPPRESS)
    ap.add_argument("--aggregator2", help=argparse.SUPPRESS)
    ap.add_argument("--topology-out", help=argparse.SUPPRESS)
    ap.add_argument("--ports-out", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--listen", help=argparse.SUPPRESS)
    ap.add_argument("--profile-after", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if sum(map(bool, (a.against, a.compare_gate, a.floor))) > 1:
        ap.error("--against, --compare-gate and --floor each run the second central process: choose one")
    if a.role == "nodes":
        return role_nodes(a)
    if a.role == "aggregator":
        return role_aggregator(a)
    if a.role == "floor":
        return role_floor(a)
    return orchestrate(a)


if __name__ == "__main__":
    raise SystemExit(main())
