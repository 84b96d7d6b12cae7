"""Soak: N nodes streaming at 1 s through real gRPC into one aggregator process, minute by minute.

    .venv/bin/python benchmarks/bench_soak.py [--nodes 256] [--minutes 3] [--markdown]

Nodes: the in-memory simulator (fabricmon/sim/inmemory.py: the batches a real agent would
send for the simulated hardware) in one process, each node its own gRPC stream on loopback
(hello, series table, batches encoded with the stream codec, acks read back), paced in real
time.  Not the agent's StreamClient (one thread per node would measure the node process).
Aggregator: ``python -m fabricmon aggregator`` as its own process.

Per minute: the aggregator's CPU (cores) and RSS, batches sent and acked, the node side's lag
behind real time.  At the end: every batch acked, acks in order per stream, and the
aggregator's ``fabricmon_ingest_batches_total`` equal to the batches sent (nothing lost, nothing
reordered: the servicer drops a seq at or below one already handled, counted as dropped).
Exit status 1 if any of that fails or the node side fell behind by more than 2 s after the
first minute (whose first batches define every series and carry every gauge).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_freshness import cpu_seconds, free_port, http_get, rss_mib, wait_for  # noqa: E402


def agg_metric(port: int, name: str) -> float:
    total = 0.0
    for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.split()[-1])
    return total


async def _nodes(a, grpc_target: str, http_port: int, agg_pid: int) -> dict:
    import grpc

    from fabricmon.proto import fabricmon_pb2 as pb
    from fabricmon.proto import fabricmon_pb2_grpc as pb_grpc
    from fabricmon.proto.codec import SeriesEncoder, hello_to_pb
    from fabricmon.sim.runner import SimulatedCluster
    from fabricmon.sim.scenario import default_scenario

    scn = default_scenario(a.nodes, 1e6, nodes_per_unit=min(32, a.nodes))
    sim = SimulatedCluster(scn, mode="memory", epoch=time.time())
    wait_for(lambda: http_get(f"http://127.0.0.1:{http_port}/readyz") == b"ready\n", 60, "the aggregator")
    hellos = {h.node: h for h in sim.hellos()}
    queues: dict[str, asyncio.Queue] = {n: asyncio.Queue() for n in hellos}
    sent = dict.fromkeys(hellos, 0)
    acks: dict[str, list[int]] = {n: [] for n in hellos}
    last_seq = dict.fromkeys(hellos, 0)
    rejects: list[str] = []
    encoders = {n: SeriesEncoder() for n in hellos}
    channel = grpc.aio.insecure_channel(grpc_target, options=[("grpc.max_send_message_length", 64 << 20)])
    stub = pb_grpc.FabricStreamStub(channel)

    async def stream(node: str) -> None:
        q = queues[node]

        async def requests():
            yield pb.AgentMessage(hello=hello_to_pb(hellos[node]))
            while True:
                item = await q.get()
                if item is None:
                    return
                yield item

        async for resp in stub.Stream(requests()):
            kind = resp.WhichOneof("msg")
            if kind == "ack":
                acks[node].append(resp.ack.seq)
            elif kind == "reject":
                rejects.append(f"{node}: {resp.reject.reason}")

    batches: list = []
    sim.on_batch = batches.append
    sim.start()
    tasks = [asyncio.create_task(stream(n)) for n in hellos]
    seq0 = int(time.time() * 1000)
    rows = []
    t0 = time.monotonic()
    c_prev, t_prev = cpu_seconds(agg_pid), t0
    minute_end = t0 + 60
    end = t0 + a.minutes * 60
    max_lag = 0.0
    step = 0
    while time.monotonic() < end:
        due = t0 + step
        lag = time.monotonic() - due
        max_lag = max(max_lag, lag)
        if lag < 0:
            await asyncio.sleep(-lag)
        if step:
            batches.clear()
            sim.step()
        for b in batches:
            s = max(seq0, last_seq[b.node]) + 1  # the initial poll's batch may come with the first step's
            m = encoders[b.node].encode(b)
            m.seq = s
            last_seq[b.node] = s
            sent[b.node] += 1
            queues[b.node].put_nowait(pb.AgentMessage(batch=m))
        step += 1
        await asyncio.sleep(0)
        if time.monotonic() >= minute_end:
            now = time.monotonic()
            c = cpu_seconds(agg_pid)
            rows.append({"minute": len(rows) + 1, "cpu_cores": (c - c_prev) / (now - t_prev),
                         "rss_mib": rss_mib(agg_pid), "sent": sum(sent.values()),
                         "acked": sum(len(v) - 1 for v in acks.values()), "max_lag_s": max_lag})
            print(json.dumps(rows[-1]), flush=True)
            c_prev, t_prev, minute_end, max_lag = c, now, minute_end + 60, 0.0
    for q in queues.values():
        q.put_nowait(None)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    await channel.close()
    sim.close()
    in_order = all(all(x < y for x, y in zip(v, v[1:])) for v in acks.values())
    all_acked = all(v and v[-1] == last_seq[n] for n, v in acks.items())
    return {"rows": rows, "sent": sum(sent.values()), "in_order": in_order, "all_acked": all_acked,
            "rejects": rejects}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--markdown", action="store_true", help="print the per-minute table as markdown")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fabricmon-soak-"))
    grpc_port, http_port = free_port(), free_port()
    topo = work / "topology.yaml"
    # the same topology the simulator generates (sim/runner.py)
    from fabricmon.sim.scenario import default_scenario
    from fabricmon.topology import generate_topology

    c = default_scenario(a.nodes, 1e6, nodes_per_unit=min(32, a.nodes)).cluster
    from fabricmon.sim.hw import NGPU, NRAILS

    generate_topology(c.nodes, layout=c.layout, nodes_per_unit=c.nodes_per_unit, rails=NRAILS, gpus_per_node=NGPU,
                      cluster="sim").write_yaml(topo)
    cfg = work / "aggregator.yaml"
    cfg.write_text(f"topology: {topo}\ngrpc_listen: 127.0.0.1:{grpc_port}\nhttp_listen: 127.0.0.1:{http_port}\n"
                   "auth: {insecure: true}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    agg = subprocess.Popen([sys.executable, "-m", "fabricmon", "--log-level", "warning", "aggregator", "--config",
                            str(cfg)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        res = asyncio.run(_nodes(a, f"127.0.0.1:{grpc_port}", http_port, agg.pid))
        ingested = agg_metric(http_port, "fabricmon_ingest_batches_total")
        dropped = agg_metric(http_port, "fabricmon_ingest_batches_dropped_total")
    finally:
        agg.send_signal(signal.SIGTERM)
        try:
            agg.wait(30)
        except subprocess.TimeoutExpired:
            agg.kill()
    rows = res["rows"]
    for r in res["rejects"][:3]:
        print(f"rejected: {r}")
    print(f"nodes {a.nodes}, {a.minutes:g} min at 1 s through real gRPC (in-memory simulator batches, stream "
          f"codec, one stream per node) into one `fabricmon aggregator` process")
    if a.markdown:
        print("| minute | aggregator CPU (cores) | RSS (MiB) | batches sent | acked | node-side max lag (s) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['minute']} | {r['cpu_cores']:.3f} | {r['rss_mib']:.0f} | {r['sent']} | {r['acked']} | "
                  f"{r['max_lag_s']:.2f} |")
    ok = (not res["rejects"] and res["all_acked"] and res["in_order"] and ingested == res["sent"] and dropped == 0
          and all(r["max_lag_s"] <= 2.0 for r in rows[1:]))  # minute 1 holds the start: every series defined
    print(f"sent {res['sent']}, ingested {ingested:.0f}, dropped {dropped:.0f}, every batch acked: "
          f"{res['all_acked']}, acks in order: {res['in_order']} -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
