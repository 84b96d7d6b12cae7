"""Soak: N simulated nodes streaming through real gRPC into real aggregator processes, minute by minute.

    .venv/bin/python benchmarks/bench_soak.py [--nodes 256] [--minutes 3] [--interval 1]
        [--fault-minutes 3] [--shards 1] [--kill-shard I --kill-at-minute M] [--restart-after 5]
        [--nodes-per-unit 32] [--spread] [--markdown]

    # one aggregator, 20 minutes at 1 s, faults in the last 3 minutes
    .venv/bin/python benchmarks/bench_soak.py --nodes 1024 --minutes 20 --fault-minutes 3 --markdown
    # four shards of 1,024 nodes at an 8 s pace, shard 1 SIGKILLed mid-fault and restarted
    .venv/bin/python benchmarks/bench_soak.py --shards 4 --nodes 4096 --interval 8 --minutes 20 \
        --fault-minutes 3 --kill-shard 1 --kill-at-minute 18 --markdown

What runs.  Nodes: the in-memory simulator (fabricmon/sim/inmemory.py: the NodeBatches a real
agent would send for the simulated hardware) in this one asyncio process, each node its own gRPC
stream on loopback to its aggregator (hello, the aggregator's Subscription read and applied with
``proto.subscription.filter_batch`` before ``SeriesEncoder.encode`` as the agent does, batches
encoded with the stream codec, acks read back), paced in real time at ``--interval`` (the
simulated agents' interval: the hello declares it, the sample clock advances by it each step, so
the whole system runs in real time at that interval).  Every node's batch of a step goes out at
once, as agents polling on the wall clock's multiples of the interval send them (``align_polls``);
``--spread``: each node at its own phase of the interval (node i of N at i/N), as agents polling
from their own start times would.  Not the agent's StreamClient (one thread
per node would measure the node process), not its spool on disk, not TLS or tokens
(``auth: insecure``).  Aggregators: ``--shards`` processes of ``python -m fabricmon aggregator``,
each owning a contiguous range of scalable units through its config's ``shard.units``; every node
streams to its unit's owner found with ``shardmap.aggregator_for_unit`` on a shard-map file
checked with ``check_ownership`` (as the bare-metal agent dials).  Alerts: every aggregator's
``alertmanager.urls`` names one real Alertmanager (``prometheus-alertmanager`` on 127.0.0.1,
group_wait 1 s, the inhibitions of deploy/alertmanager/alertmanager.yml) whose webhook receiver
is a small HTTP server in this process.

Measured per minute, per shard: the aggregator's CPU (cores) and RSS, batches sent to it (new
batches, not counting resends) and acked by it, reconnects; for the node side (this process):
its CPU and its lag behind the real-time pace (a step later than due).  The node side shares the
machine's cores with the aggregators: its CPU is in the same table.

Faults (``--fault-minutes K``, default 3, 0: none): the scenario's faults start K minutes before
the end (a flaky cable on one node's rail, a degraded leaf in another unit; with shards the two
are in different shards and, with a kill, a second link fault in the killed shard starts one
interval before the kill).  At the end, per fault: whether an alert naming its component reached
the webhook, the component the aggregator named vs the ground truth, and the delay from the fault
reaching the node (wall) to the webhook, next to the usual delay (README's Detection table,
bench_detection at a 1 s interval, scaled by the interval).

``--kill-shard I --kill-at-minute M``: shard I's process is SIGKILLed at minute M (while its
faults are active) and started again ``--restart-after`` seconds later with the same config and
ports.  The node side of each of its streams reconnects with bounded backoff, re-sends the hello,
drops what the new process says it has (the hello's ack) and resends every batch not yet acked,
seqs unchanged; the first new batch after a reconnect carries every gauge and the job layout (the
agent's rule after a reconnect).  Batches the killed process acked before the kill are lost with
its memory (by design: the agent resends from the last ack, not from the start).  A restarted
process first parses the whole topology (at 4,096 nodes most of a minute of CPU), so its streams
come back after that, not after ``--restart-after``.

End check (exit status 1 if any fails): no reject; every batch acked, each ack the oldest unacked
seq of its stream (nothing reordered); per shard ``fabricmon_ingest_batches_total`` equal to the
batches sent to that shard (minus, for the restarted shard, those acked by the killed process: the
new process counts from zero) and no batch dropped (so every node's batches landed on its owner
and nowhere else: a node only ever dials its owner); the node side's lag at most max(2 s, the
interval) after the first minute; every fault localized (an alert with its component at the
webhook) and still an open incident at its owning shard at the end (for the restarted shard:
found again by the new process, so the alert keeps being resent); no alert of a fault resolved at
the webhook while the fault was still active (an alert lost across the restart would be resolved
by Alertmanager when its endsAt passes); no FabricmonAgentDown notification (no node is down in a
soak: reconnecting nodes must not page); no alert resolved and then fired again at the webhook; the
first fault after a restart at the webhook within the usual delay plus 60 s of start-up after the
restart (benchmarks/soak_verdict.py).  Alerts that match no fault are printed, not failed on.  The
run ends with one line, ``soak verdict: ok ...`` or ``soak verdict: FAIL <why>`` (exit status 1).

Per-minute table (JSON lines as it runs; ``--markdown``: a table at the end): one row per minute
and shard, the aggregator columns that shard's process, the node-side columns (this process, all
nodes) repeated on each shard's row.  Not measured: the agent's StreamClient and spool, real
hardware sources, Prometheus, TLS/token checks, and the aggregators' CPU as a share of the node
side's (they share 2 cores here: the node side's own CPU is in the table).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_freshness import cpu_seconds, free_port, http_get, rss_mib, wait_for
from soak_verdict import RESTART_STARTUP_ALLOWANCE_S, agent_down_pages, refired, verdict_line

# README "Detection" (benchmarks/bench_detection.py, 1 s interval): injection -> incident open,
# (median, p90) in sample seconds; the webhook adds Alertmanager's group_wait and delivery.
USUAL_OPEN_S = {"flaky_cable": (1.0, 1.1), "leaf_degraded": (0.0, 2.0), "rdma_retransmits": (1.0, 1.8),
                "link_down": (0.1, 0.9), "slow_gpu": (6.0, 6.5)}
WEBHOOK_SLACK_S = 2.0  # group_wait 1 s + the aggregator's tick and delivery


def agg_metric(port: int, name: str) -> float:
    total = 0.0
    for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.split()[-1])
    return total


class Resend:
    """One node's batches sent but not yet acked, and the ack bookkeeping of its streams.

    ``add`` a batch when it is made; ``acked(seq)`` for each ack after the hello's: an ack must
    be the oldest unacked seq (the aggregator handles a stream's batches in order), anything
    else counts as out of order.  ``reconnected(hw)``: the new stream's hello ack says the
    aggregator holds every seq up to ``hw``; the rest is returned to be sent again, in order,
    seqs unchanged."""

    __slots__ = ("pending", "acked_total", "out_of_order", "last_acked", "resent")

    def __init__(self) -> None:
        self.pending: collections.deque = collections.deque()  # (seq, NodeBatch)
        self.acked_total = 0
        self.out_of_order = 0
        self.last_acked = 0
        self.resent = 0

    def add(self, seq: int, batch) -> None:
        self.pending.append((seq, batch))

    def acked(self, seq: int) -> None:
        if self.pending and self.pending[0][0] == seq:
            self.pending.popleft()
            self.acked_total += 1
            self.last_acked = seq
        else:
            self.out_of_order += 1

    def reconnected(self, hw: int) -> list:
        while self.pending and self.pending[0][0] <= hw:
            self.pending.popleft()  # the aggregator has it (an ack lost with the old stream)
            self.acked_total += 1
        out = list(self.pending)
        self.resent += len(out)
        return out


class Requests:
    """A stream's requests: the hello, then what is put on ``q`` until None.  An async iterator,
    not an async generator: a call that fails while the generator waits on the queue would
    leave an ``aclose()`` of a running generator behind."""

    def __init__(self, hello, q: asyncio.Queue) -> None:
        self.first, self.q = hello, q

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.first is not None:
            m, self.first = self.first, None
            return m
        item = await self.q.get()
        if item is None:
            raise StopAsyncIteration
        return item


class Node:
    __slots__ = ("name", "shard", "hello", "resend", "q", "encoder", "sub", "live", "sent",
                 "acked_at_drop", "connects", "gauges", "need_full", "filtered", "last_seq", "phase")

    def __init__(self, name: str, shard: int, hello, track_gauges: bool) -> None:
        self.name, self.shard, self.hello = name, shard, hello
        self.resend = Resend()
        self.q: asyncio.Queue | None = None
        self.encoder = None
        self.sub = None
        self.live = False
        self.sent = 0
        self.acked_at_drop = 0
        self.connects = 0
        self.gauges: dict | None = {} if track_gauges else None  # (family, labels) -> latest Sample
        self.need_full = False
        self.filtered = 0
        self.last_seq = 0
        self.phase = 0.0  # --spread: the fraction of the interval after the step this node sends at


def build_scenario(a, nodes_per_unit: int, owner_of_unit):
    """The scenario and its faults (start times in simulated = wall seconds since the start)."""
    from fabricmon.sim.scenario import ClusterSpec, Fault, Scenario
    from fabricmon.topology import node_name

    n = a.nodes
    cluster = ClusterSpec(nodes=n, layout="ib", nodes_per_unit=nodes_per_unit, seed=7)
    duration = a.minutes * 60 + 120.0
    faults: list[Fault] = []
    if a.fault_minutes > 0:
        fs = float(round(max(0.0, (a.minutes - a.fault_minutes) * 60)))
        units = cluster.units
        by_shard: dict[int, list[int]] = collections.defaultdict(list)
        for u in range(units):
            by_shard[owner_of_unit(u)].append(u)
        shard_a = a.kill_shard if a.kill_shard is not None else 0
        ua = by_shard[shard_a][0]
        others = [s for s in sorted(by_shard) if s != shard_a]
        ub = by_shard[others[-1]][-1] if others else (ua + 1) % units
        flaky = ua * nodes_per_unit + min(17, nodes_per_unit - 1)
        faults.append(Fault("flaky_cable", node=node_name(flaky, n), rail=3, start=fs))
        faults.append(Fault("leaf_degraded", unit=ub, rail=5, start=fs))
        if a.kill_shard is not None:
            # in the killed shard, starting one interval before the kill: its alert is raised
            # around the kill, by the old process or (re-detected) by the new one
            k = ua * nodes_per_unit + min(5, nodes_per_unit - 1)
            if k == flaky:
                k = ua * nodes_per_unit
            faults.append(Fault("flaky_cable", node=node_name(k, n), rail=6,
                                start=float(round(a.kill_at_minute * 60 - a.interval))))
    scn = Scenario(cluster, duration, tuple(faults))
    scn.validate("", "<soak>")
    return scn


async def _nodes(a, scn, targets: dict[int, str], shard_of_node: dict[str, int], shards: list, am_rig) -> dict:
    import grpc

    from fabricmon.proto import fabricmon_pb2 as pb
    from fabricmon.proto import fabricmon_pb2_grpc as pb_grpc
    from fabricmon.proto.codec import SeriesEncoder, hello_to_pb
    from fabricmon.proto.subscription import BadSubscription, filter_batch, subscription_from_pb
    from fabricmon.sim.runner import SimulatedCluster

    interval = a.interval
    # 600 s: each process parses the whole topology YAML (pure-Python PyYAML, twice: about 30 s of CPU
    # at 4,096 nodes) and the shards start together on the same cores
    for sh in shards:
        wait_for(lambda sh=sh: http_get(f"http://127.0.0.1:{sh['http']}/readyz") == b"ready\n", 600,
                 f"aggregator shard {sh['index']}")
    sim = SimulatedCluster(scn, mode="memory", interval=interval, epoch=time.time())
    nodes = {h.node: Node(h.node, shard_of_node[h.node], h, a.kill_shard == shard_of_node[h.node])
             for h in sim.hellos()}
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.initial_reconnect_backoff_ms", 250),
            ("grpc.min_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 2000)]
    channels = {k: grpc.aio.insecure_channel(t, options=opts) for k, t in targets.items()}
    stubs = {k: pb_grpc.FabricStreamStub(ch) for k, ch in channels.items()}
    rejects: list[str] = []
    errors: list[str] = []
    stopping = False
    layouts = sim.layouts
    reconnects = collections.Counter()
    failed_attempts = collections.Counter()

    def send(node: Node, seq: int, b) -> None:
        if node.sub is not None:
            b, left_out = filter_batch(b, node.sub)
            node.filtered += left_out
        m = node.encoder.encode(b)
        m.seq = seq
        node.q.put_nowait(pb.AgentMessage(batch=m))

    async def stream(node: Node) -> None:
        backoff = 0.25
        give_up = None
        while not stopping:
            q: asyncio.Queue = asyncio.Queue()
            node.q, node.encoder, node.sub, node.live = q, SeriesEncoder(), None, False
            hello_acked = False
            try:
                async for resp in stubs[node.shard].Stream(Requests(pb.AgentMessage(hello=hello_to_pb(node.hello)), q)):
                    kind = resp.WhichOneof("msg")
                    if kind == "ack":
                        if hello_acked:
                            node.resend.acked(resp.ack.seq)
                            continue
                        hello_acked = True
                        node.connects += 1
                        if node.connects > 1:
                            reconnects[node.shard] += 1
                            node.need_full = node.gauges is not None
                        for seq, b in node.resend.reconnected(resp.ack.seq):
                            send(node, seq, b)
                        node.live = True
                        backoff, give_up = 0.25, None
                    elif kind == "subscription":
                        try:
                            node.sub = subscription_from_pb(resp.subscription)
                        except BadSubscription:
                            node.sub = None  # sending everything is always correct
                    elif kind == "reject":
                        rejects.append(f"{node.name}: {resp.reject.reason}")
            except grpc.RpcError as exc:
                if not stopping:
                    failed_attempts[node.shard] += 1
                    if len(errors) < 100:
                        errors.append(f"{node.name}: {exc.code().name}")
            node.live = False
            q.put_nowait(None)  # ends this call's request iterator (it may still wait on the queue)
            if hello_acked and not stopping:
                node.acked_at_drop = node.resend.acked_total  # acked by the process the lost stream went to
            if stopping or rejects:
                return
            now = time.monotonic()
            give_up = give_up or now + 300.0  # a restarted shard at 4,096 nodes needs most of a minute to start
            if now > give_up:
                errors.append(f"{node.name}: gave up reconnecting after 300 s")
                return
            await asyncio.sleep(backoff * (0.5 + (hash(node.name) % 100) / 100))
            backoff = min(backoff * 2, 2.0)

    batches: list = []
    sim.on_batch = batches.append
    sim.start()
    tasks = [asyncio.create_task(stream(n)) for n in nodes.values()]
    for i, n in enumerate(sorted(nodes.values(), key=lambda n: n.name)):
        n.phase = i / len(nodes)  # --spread: when in each interval this node sends
    seq0 = int(time.time() * 1000)
    rows = []
    t0 = time.monotonic()
    wall0 = time.time()
    # sample time = the wall time each step is due, as real agents stamp their samples: otherwise the
    # start-up (the first batches of 4,096 nodes take many seconds) leaves every later sample that much
    # older than the aggregators' wall clock, and their detection windows see evidence late or not at all
    sim.cluster.epoch = wall0
    for sh in shards:
        sh["c_prev"], sh["pid_prev"] = cpu_seconds(sh["proc"].pid), sh["proc"].pid
    p_prev, t_prev = time.process_time(), t0
    minute_end = t0 + 60
    end = t0 + a.minutes * 60
    kill_at = t0 + a.kill_at_minute * 60 if a.kill_shard is not None else None
    restart_at = None
    kill_info: dict = {}
    max_lag = 0.0
    step = 0
    while time.monotonic() < end:
        due = t0 + step * interval
        lag = time.monotonic() - due
        max_lag = max(max_lag, lag)
        if lag < 0:
            await asyncio.sleep(-lag)
        if step:
            batches.clear()
            # in a thread: the event loop keeps reading acks and writing batches while the simulator
            # builds the next interval (seconds at 4,096 nodes); a blocked loop stalls every stream's
            # flow-control window and the aggregators with it
            await asyncio.to_thread(sim.step)
        ready = []
        for b in batches:
            node = nodes[b.node]
            seq = max(seq0, node.last_seq) + 1  # the initial poll's batch may come with the first step's
            node.last_seq = seq
            if node.gauges is not None:
                for g in b.gauges:
                    node.gauges[(g.family, g.labels)] = g
                if node.need_full and node.live:
                    # the first new batch of a reconnected stream carries every gauge and the job layout
                    b = replace(b, gauges=tuple(node.gauges.values()), layouts=b.layouts or layouts)
                    node.need_full = False
            node.resend.add(seq, b)
            node.sent += 1
            ready.append((node, seq, b))
        if a.spread:
            ready.sort(key=lambda r: r[0].phase)
        for node, seq, b in ready:
            if a.spread:  # each node at its own phase of the interval, as agents started at different times
                wait = due + node.phase * interval - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            if node.live:
                send(node, seq, b)
        step += 1
        await asyncio.sleep(0)
        now = time.monotonic()
        if now >= minute_end:
            p = time.process_time()
            row = {"minute": len(rows) + 1, "node_cpu_cores": (p - p_prev) / (now - t_prev), "max_lag_s": max_lag,
                   "node_rss_mib": rss_mib(os.getpid()), "shards": []}
            for sh in shards:
                pid = sh["proc"].pid
                try:
                    c = cpu_seconds(pid)
                    rss = rss_mib(pid)
                except Exception:  # killed and not yet back
                    c, rss = sh["c_prev"], float("nan")
                base = sh["c_prev"] if pid == sh["pid_prev"] else 0.0  # restarted: counts from zero
                mine = [n for n in nodes.values() if n.shard == sh["index"]]
                row["shards"].append({"shard": sh["index"], "cpu_cores": (c - base) / (now - t_prev),
                                      "rss_mib": rss, "sent": sum(n.sent for n in mine),
                                      "acked": sum(n.resend.acked_total for n in mine),
                                      "reconnects": reconnects[sh["index"]], "restarted": pid != sh["pid_prev"]})
                sh["c_prev"], sh["pid_prev"] = c, pid
            rows.append(row)
            print(json.dumps(row), flush=True)
            p_prev, t_prev, minute_end, max_lag = p, now, minute_end + 60, 0.0
        if kill_at is not None and now >= kill_at:
            sh = shards[a.kill_shard]
            try:
                kill_info["ingested_before_kill"] = agg_metric(sh["http"], "fabricmon_ingest_batches_total")
            except Exception:
                kill_info["ingested_before_kill"] = None
            os.kill(sh["proc"].pid, signal.SIGKILL)
            sh["proc"].wait(10)
            kill_info["killed_at_s"] = now - t0
            print(f"killed shard {a.kill_shard} (pid {sh['proc'].pid}, SIGKILL) at {now - t0:.1f} s", flush=True)
            kill_at, restart_at = None, now + a.restart_after
        if restart_at is not None and now >= restart_at:
            sh = shards[a.kill_shard]
            sh["proc"] = sh["start"]()
            kill_info["restarted_at_s"] = now - t0
            print(f"restarted shard {a.kill_shard} (pid {sh['proc'].pid}) at {now - t0:.1f} s", flush=True)
            restart_at = None
    stopping = True
    # the last batches' acks: wait (bounded) until every live stream has none pending
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(n.resend.pending for n in nodes.values()):
        await asyncio.sleep(0.2)
    for n in nodes.values():
        if n.q is not None:
            n.q.put_nowait(None)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    for ch in channels.values():
        await ch.close()
    sim.close()
    per_shard = collections.defaultdict(lambda: {"sent": 0, "acked_before_kill": 0})
    for n in nodes.values():
        per_shard[n.shard]["sent"] += n.sent
        per_shard[n.shard]["acked_before_kill"] += n.acked_at_drop
    return {"rows": rows, "sent": sum(n.sent for n in nodes.values()), "per_shard": dict(per_shard),
            "out_of_order": sum(n.resend.out_of_order for n in nodes.values()),
            "unacked": sum(len(n.resend.pending) for n in nodes.values()),
            "resent": sum(n.resend.resent for n in nodes.values()),
            "filtered": sum(n.filtered for n in nodes.values()),
            "subscribed": sum(n.sub is not None for n in nodes.values()),
            "rejects": rejects, "errors": errors, "wall0": wall0, "kill": kill_info,
            "reconnects": dict(reconnects), "failed_attempts": dict(failed_attempts)}


def check_faults(a, scn, alerts: list, wall0: float, end_wall: float, kill: dict, open_at_owner) \
        -> tuple[list[str], list[str]]:
    """Per fault: localized (an alert naming its component reached the webhook), delay, and no
    resolve while the fault was active; the first fault after a restart within the usual delay plus
    the start-up allowance.  ``alerts``: (arrival wall time, status, alert).  (reasons, lines)."""
    lines, reasons = [], []
    gts = scn.ground_truth()
    matched_any = set()
    for i, (f, gt) in enumerate(zip(scn.faults, gts, strict=True)):
        across = bool(kill) and i == 2  # build_scenario: the fault started one interval before the kill
        start_wall = wall0 + f.start
        mine = [(t, st, al) for t, st, al in alerts if (al.get("labels") or {}).get("component") == gt.component]
        matched_any.update(id(al) for _, _, al in mine)
        firing = [(t, al) for t, st, al in mine if st == "firing" and t >= start_wall - 1.0]
        resolved_early = [t for t, st, _ in mine if st == "resolved" and start_wall <= t < end_wall]
        usual = USUAL_OPEN_S.get(f.kind)
        allowed = usual[1] * max(1.0, a.interval) + WEBHOOK_SLACK_S if usual else None
        usual_s = (f"usual: incident open median {usual[0]:.1f} s, p90 {usual[1]:.1f} s at 1 s (README Detection), "
                   f"allowed here p90 x interval + {WEBHOOK_SLACK_S:.0f} s = {allowed:.1f} s" if usual else "usual: -")
        if not firing:
            reasons.append(f"{f.kind} {gt.component} not detected")
            after = sorted({(al.get("labels") or {}).get("component", "?") for t, st, al in alerts
                            if st == "firing" and t >= start_wall})
            lines.append(f"fault {f.kind} truth {gt.component} (start {f.start:.0f} s): NOT detected; "
                         f"components alerted after its start: {after[:5] or 'none'}; {usual_s}")
            continue
        t, al = firing[0]
        delay = t - start_wall
        within = allowed is not None and delay <= allowed
        named = (al.get("labels") or {}).get("component")
        verdict = "within" if within else "SLOWER than"
        if across:
            down = kill.get("restarted_at_s", float("nan")) - kill["killed_at_s"]
            verdict = (f"across the restart: started {kill['killed_at_s'] - f.start:.0f} s before the SIGKILL, shard "
                       f"down {down:.0f} s, then its start-up and the streams' reconnect; {verdict}")
            after_restart = t - (wall0 + kill.get("restarted_at_s", float("inf")))
            limit = (allowed or 0.0) + RESTART_STARTUP_ALLOWANCE_S
            if not after_restart <= limit:
                reasons.append(f"first fault after the restart ({gt.component}) reached the webhook "
                               f"{after_restart:.0f} s after the restart (allowed {limit:.0f} s)")
        lines.append(f"fault {f.kind} truth {gt.component} (start {f.start:.0f} s): detected yes, named {named} "
                     f"({al['labels'].get('alertname')}), fault -> webhook {delay:.1f} s ({verdict} usual); {usual_s}")
        held, owner = open_at_owner(f, gt.component)
        lines.append(f"  open incident for it at its owner (shard {owner}) at the end: {'yes' if held else 'NO'}")
        if not held:
            reasons.append(f"{gt.component} not open at its owner at the end")
        if resolved_early:
            reasons.append(f"{gt.component} resolved while the fault was active")
            lines.append(f"  its alert was RESOLVED at the webhook at {resolved_early[0] - wall0:.0f} s while the "
                         "fault was active (an alert lost)")
    extra = sorted({(al.get("labels") or {}).get("component", "?") + " " + (al.get("labels") or {}).get("alertname", "")
                    for _, st, al in alerts if st == "firing" and id(al) not in matched_any})
    lines.append(f"alerts matching no fault: {len(extra)}" + (f" ({', '.join(extra[:5])})" if extra else ""))
    down = agent_down_pages(alerts)
    if down:
        reasons.append(f"{len(down)} FabricmonAgentDown notification(s) for nodes that were not down "
                       f"(first: {', '.join(down[:3])})")
    again = refired(alerts)
    if again:
        reasons.append(f"{len(again)} alert(s) resolved then fired again (first: {', '.join(again[:3])})")
    return reasons, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--interval", type=float, default=1.0, help="the simulated agents' interval (s); real time")
    ap.add_argument("--fault-minutes", type=float, default=3.0, help="faults start this long before the end; 0: none")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--kill-shard", type=int, default=None)
    ap.add_argument("--kill-at-minute", type=float, default=None)
    ap.add_argument("--restart-after", type=float, default=5.0, help="seconds between the SIGKILL and the restart")
    ap.add_argument("--nodes-per-unit", type=int, default=32)
    ap.add_argument("--markdown", action="store_true", help="print the per-minute table as markdown")
    ap.add_argument("--spread", action="store_true",
                    help="each node sends at its own phase of the interval (agents whose polls are not aligned), "
                         "not all at once")
    a = ap.parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds through the finally below like Ctrl-C does: without it
    # the aggregators and Alertmanager this run started outlive it, holding CPU and ports.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if (a.kill_shard is None) != (a.kill_at_minute is None):
        ap.error("--kill-shard and --kill-at-minute go together")
    if a.kill_shard is not None:
        if not 0 <= a.kill_shard < a.shards:
            ap.error("--kill-shard: not a shard")
        if a.fault_minutes <= 0 or not a.minutes - a.fault_minutes < a.kill_at_minute < a.minutes - 0.5:
            ap.error("--kill-at-minute: must fall while the faults are active (after minutes - fault-minutes) and "
                     "at least half a minute before the end")
    if a.fault_minutes > a.minutes:
        ap.error("--fault-minutes: at most --minutes")

    from fabricmon.shardmap import aggregator_for_unit, check_ownership, load_shard_map
    from fabricmon.sim.hw import NGPU, NRAILS
    from fabricmon.topology import generate_topology

    npu = min(a.nodes_per_unit, a.nodes)
    units = (a.nodes + npu - 1) // npu
    if a.shards > units:
        ap.error(f"--shards: {units} units only")
    work = Path(tempfile.mkdtemp(prefix="fabricmon-soak-"))
    topo = work / "topology.yaml"
    generate_topology(a.nodes, layout="ib", nodes_per_unit=npu, rails=NRAILS, gpus_per_node=NGPU,
                      cluster="sim").write_yaml(topo)
    unit_sets = [list(range(k * units // a.shards, (k + 1) * units // a.shards)) for k in range(a.shards)]
    shards = [{"index": k, "grpc": free_port(), "http": free_port(), "units": u} for k, u in enumerate(unit_sets)]
    smap_path = work / "shardmap.yaml"
    smap_path.write_text(json.dumps({"topology": str(topo), "replicas": [
        {"name": f"agg-{s['index']}", "address": f"127.0.0.1:{s['grpc']}", "units": s["units"]} for s in shards]}))
    shard_map = load_shard_map(smap_path)
    check_ownership(shard_map, str(smap_path))
    addr_shard = {s["grpc"]: s["index"] for s in shards}
    targets = {s["index"]: f"127.0.0.1:{s['grpc']}" for s in shards}

    def owner(unit: int) -> int:
        return addr_shard[int(aggregator_for_unit(shard_map, unit).rsplit(":", 1)[1])]

    scn = build_scenario(a, npu, owner)
    shard_of_node = {name: owner(scn.unit_of(name)) for name in scn.cluster.node_names()}

    am_rig = None
    receiver = None
    if a.fault_minutes > 0 or a.shards > 1:
        from fabricmon.demo.local_alertmanager import WebhookReceiver
        # tests/support imports its siblings as the top-level package ``support`` (tests/ on the path)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from support.promtools import start_alertmanager

        receiver = WebhookReceiver()
        receiver.start()
        am_cfg = {"route": {"receiver": "hook", "group_by": ["cluster", "alertname", "component"],
                            "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
                  "receivers": [{"name": "hook", "webhook_configs": [{"url": receiver.url, "send_resolved": True}]}],
                  # the shipped inhibitions, as a user runs them: the webhook gets what would page
                  "inhibit_rules": yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml")
                                                  .read_text())["inhibit_rules"]}
        am_rig = start_alertmanager(am_cfg, work / "alertmanager")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for s in shards:
        cfg = {"topology": str(topo), "grpc_listen": f"127.0.0.1:{s['grpc']}",
               "http_listen": f"127.0.0.1:{s['http']}", "auth": {"insecure": True}}
        if am_rig is not None:
            cfg["alertmanager"] = {"urls": [am_rig.url]}
        if a.shards > 1:
            cfg["shard"] = {"units": s["units"]}
        path = work / f"aggregator-{s['index']}.yaml"
        path.write_text(json.dumps(cfg))
        log = work / f"aggregator-{s['index']}.log"

        def start(path=path, log=log):
            with open(log, "ab") as fh:
                return subprocess.Popen([sys.executable, "-m", "fabricmon", "--log-level", "warning", "aggregator",
                                         "--config", str(path)], env=env, stdout=subprocess.DEVNULL, stderr=fh)
        s["start"] = start
        s["proc"] = start()
    res = None
    try:
        res = asyncio.run(_nodes(a, scn, targets, shard_of_node, shards, am_rig))
        end_wall = time.time()
        for s in shards:
            s["ingested"] = agg_metric(s["http"], "fabricmon_ingest_batches_total")
            s["dropped"] = agg_metric(s["http"], "fabricmon_ingest_batches_dropped_total")
            s["open"] = {i.get("component") for i in
                         json.loads(http_get(f"http://127.0.0.1:{s['http']}/api/incidents?state=open"))}
        if receiver is not None:
            time.sleep(3.0)  # the last notifications (group_wait 1 s)
    finally:
        for s in shards:
            p = s.get("proc")
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        if am_rig is not None:
            am_rig.stop()
        if receiver is not None and res is None:
            receiver.stop()
    rows = res["rows"]
    for r in res["rejects"][:3]:
        print(f"rejected: {r}")
    if res["errors"]:
        print(f"stream errors: {len(res['errors'])} (first: {res['errors'][:3]})")
    where = ("one `fabricmon aggregator` process" if a.shards == 1 else
             f"{a.shards} `fabricmon aggregator` shard processes ({units} units of {npu} nodes, "
             f"{units // a.shards} per shard)")
    print(f"nodes {a.nodes}, {a.minutes:g} min at {a.interval:g} s through real gRPC (in-memory simulator batches, "
          f"stream codec, subscription applied, one stream per node) into {where}")
    if a.markdown:
        print("Per minute, per shard (aggregator columns per shard process; node side = this process, "
              "all nodes):\n")
        print("| minute | shard | aggregator CPU (cores) | RSS (MiB) | batches sent | acked | reconnects | "
              "node-side CPU (cores) | node-side RSS (MiB) | node-side max lag (s) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            for s in r["shards"]:
                print(f"| {r['minute']} | {s['shard']}{' (restarted)' if s['restarted'] else ''} | "
                      f"{s['cpu_cores']:.3f} | {s['rss_mib']:.0f} | {s['sent']} | {s['acked']} | {s['reconnects']} | "
                      f"{r['node_cpu_cores']:.3f} | {r['node_rss_mib']:.0f} | {r['max_lag_s']:.2f} |")
        print()
    print(f"subscription: {res['subscribed']}/{a.nodes} streams subscribed at the end, {res['filtered']} items "
          f"filtered out before encoding")
    reasons: list[str] = []
    if res["rejects"]:
        reasons.append(f"{len(res['rejects'])} batch(es) rejected")
    if res["unacked"]:
        reasons.append(f"{res['unacked']} batch(es) never acked")
    if res["out_of_order"]:
        reasons.append(f"{res['out_of_order']} ack(s) out of order")
    lag_limit = max(2.0, a.interval)
    if not all(r["max_lag_s"] <= lag_limit for r in rows[1:]):  # minute 1 holds the start: every series defined
        reasons.append(f"node side fell behind by more than {lag_limit:g} s")
        print(f"node side fell behind by more than {lag_limit:g} s after the first minute")
    kill = res["kill"]
    for s in shards:
        ps = res["per_shard"].get(s["index"], {"sent": 0, "acked_before_kill": 0})
        expect = ps["sent"]
        note = ""
        if a.kill_shard == s["index"] and kill:
            expect -= ps["acked_before_kill"]
            note = (f" (restarted: the new process counts from zero; {ps['acked_before_kill']} batches acked by the "
                    f"killed process before the kill, lost with its memory - fine; it had ingested "
                    f"{kill.get('ingested_before_kill')} just before)")
        good = s["ingested"] == expect and s["dropped"] == 0
        if not good:
            reasons.append(f"shard {s['index']} ingested {s['ingested']:.0f} of {expect}, dropped {s['dropped']:.0f}")
        print(f"shard {s['index']} units {s['units'][0]}..{s['units'][-1]}: sent {ps['sent']}, ingested "
              f"{s['ingested']:.0f} (expected {expect}), dropped {s['dropped']:.0f}{note} -> "
              f"{'OK' if good else 'FAILED'}")
    if kill:
        print(f"kill: SIGKILL at {kill['killed_at_s']:.0f} s, restarted at "
              f"{kill.get('restarted_at_s', float('nan')):.0f} s; reconnects per shard {res['reconnects']} (failed "
              f"connect attempts while it was down: {res['failed_attempts']}), batches resent {res['resent']}")
    if a.fault_minutes > 0 and receiver is not None:
        def open_at_owner(f, component):
            k = owner(f.unit if f.unit is not None else scn.unit_of(f.node))
            return component in shards[k]["open"], k

        f_reasons, lines = check_faults(a, scn, receiver.alerts(), res["wall0"], end_wall, res["kill"], open_at_owner)
        # every notification as the webhook got it (arrival time relative to the start, status, alert)
        (work / "webhook.json").write_text(json.dumps(
            [{"t": round(t - res["wall0"], 2), "status": st, "labels": al.get("labels", {})}
             for t, st, al in receiver.alerts()], indent=1))
        receiver.stop()
        for line in lines:
            print(line)
        reasons += f_reasons
    elif receiver is not None:
        receiver.stop()
    ok = not reasons
    print(f"sent {res['sent']}, ingested {sum(s['ingested'] for s in shards):.0f}, dropped "
          f"{sum(s['dropped'] for s in shards):.0f}, every batch acked: {res['unacked'] == 0}, acks in order: "
          f"{res['out_of_order'] == 0} -> {'OK' if ok else 'FAILED'}")
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept for a look: {work} (aggregator configs and logs, Alertmanager's, webhook.json)")
    print(verdict_line(reasons, f"{a.nodes} nodes, {a.shards} shard(s), {a.minutes:g} min at {a.interval:g} s"
                       + (f", shard {a.kill_shard} killed at minute {a.kill_at_minute:g}" if kill else "")
                       + ": no AgentDown page, no alert resolved and fired again, every fault localized"),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
