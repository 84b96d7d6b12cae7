"""End to end: simulated cluster -> real agents -> StreamClient -> real gRPC server -> Engine ->
AlertmanagerClient -> a real Alertmanager on 127.0.0.1 -> a webhook receiver in the test.

The simulator runs as fast as it can (no pacing) on its own clock: sample times are
``epoch + t`` with the epoch put far enough in the past that every sample time is behind the
wall clock (agents' clocks never run ahead of Alertmanager's).  Every delay asserted on detection
is in *sample* seconds; Alertmanager delivery is asserted on wall time with deadline polls.

The wrong-token case is covered by tests/agent/test_stream.py (test_wrong_token_is_unauthenticated_and_logged).
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from fabricmon.agent.spool import MemorySpool, Spool
from fabricmon.agent.stream import StreamClient
from fabricmon.agent.stream_batches import hello_from_snapshot
from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.runtime import AggregatorRuntime
from fabricmon.demo.local_alertmanager import WebhookReceiver
from fabricmon.sim.drive import Drive
from fabricmon.sim.runner import SimulatedCluster
from fabricmon.sim.scenario import ClusterSpec, Scenario
from support.promtools import REPO, free_port, start_alertmanager, wait_until

pytestmark = pytest.mark.integration

SIMPLE_AM = {
    "route": {"receiver": "hook", "group_by": ["cluster", "alertname", "component"], "group_wait": "0s",
              "group_interval": "1s", "repeat_interval": "1h"},
    "receivers": [{"name": "hook", "webhook_configs": [{"url": "", "send_resolved": True}]}],
}


def _parse_ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


class AmRig:
    def __init__(self, am, receiver: WebhookReceiver, cluster: str) -> None:
        self.am, self.receiver, self.cluster = am, receiver, cluster

    def hook(self, status: str | None = None) -> list[tuple[float, str, dict]]:
        """Webhook alerts of this test's cluster: (arrival wall time, status, alert)."""
        return [(t, s, a) for t, s, a in self.receiver.alerts()
                if a.get("labels", {}).get("cluster") == self.cluster and (status is None or s == status)]

    def active(self, **filters: str) -> list[dict]:
        return self.am.get_alerts(cluster=self.cluster, **filters)


def _start_rig(tmp_path: Path, config: dict, cluster: str):
    receiver = WebhookReceiver()
    receiver.start()
    for r in config["receivers"]:
        for w in r.get("webhook_configs", ()):
            w["url"] = receiver.url
            w["send_resolved"] = True
    try:
        am = start_alertmanager(config, tmp_path / "am")
    except BaseException:
        receiver.stop()
        raise
    return AmRig(am, receiver, cluster)


@pytest.fixture
def rig(tmp_path, request):
    cfg = yaml.safe_load(yaml.safe_dump(SIMPLE_AM))
    r = _start_rig(tmp_path, cfg, f"e2e-{request.node.name[-40:]}")
    yield r
    r.am.stop()
    r.receiver.stop()


@pytest.fixture
def deploy_rig(tmp_path, request):
    """The repository's deploy/alertmanager/alertmanager.yml (routes and inhibitions) with every
    receiver pointed at the test's webhook and the grouping waits shortened."""
    cfg = yaml.safe_load((REPO / "deploy/alertmanager/alertmanager.yml").read_text())

    def fast(route: dict) -> None:
        route["group_wait"] = "0s"
        route["group_interval"] = "1s"
        for sub in route.get("routes", ()):
            fast(sub)

    fast(cfg["route"])
    r = _start_rig(tmp_path, cfg, f"e2e-{request.node.name[-40:]}")
    yield r
    r.am.stop()
    r.receiver.stop()


class SimIntake:
    """The rank intake of one simulated node: what its training ranks reported since the last batch."""

    def __init__(self, layout) -> None:
        self._lock = threading.Lock()
        self._ranks: list = []
        self._layout = layout
        self._layout_sent = False

    def push(self, ranks) -> None:
        with self._lock:
            self._ranks.extend(ranks)

    def drain(self):
        with self._lock:
            out, self._ranks = self._ranks, []
            lay = [] if self._layout_sent or self._layout is None else [self._layout]
            self._layout_sent = True
        return out, lay

    def layouts(self):
        return [self._layout] if self._layout is not None else []


class Pipeline:
    """Tree-mode simulator with one StreamClient per node, the real gRPC server, Engine and sender."""

    def __init__(self, scn: Scenario, rig: AmRig, *, spool_dir: Path | None = None) -> None:
        self.rig = rig
        self.epoch = float(int(time.time() - scn.duration - 120))
        self.sim = SimulatedCluster(scn, mode="tree", interval=1.0, epoch=self.epoch)
        self.sim.on_snapshot = self._on_snapshot
        self.names = list(self.sim.cluster.names)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.latest: dict = {}
        self.ranks: list = []
        layout = self.sim.layouts[0] if self.sim.layouts else None
        self.intakes = {n: SimIntake(layout) for n in self.names}
        self.clients: dict[str, StreamClient] = {}
        for n in self.names:
            spool = Spool(spool_dir / n, 8 << 20, fsync=False) if spool_dir is not None else MemorySpool()
            self.clients[n] = StreamClient(
                self.address, n, (lambda n=n: hello_from_snapshot(n, self.latest.get(n), 1.0, boot_id=f"sim-{n}")),
                spool, intake=self.intakes[n], interval_seconds=1.0, backoff_min=0.05, backoff_max=0.3,
                hello_timeout=3.0)
        self.engine: Engine | None = None
        self.runtime: AggregatorRuntime | None = None
        self.sender: AlertmanagerClient | None = None
        self.engines: list[Engine] = []
        self.ingested: list[list[tuple[str, int, float]]] = []  # per engine: (node, seq, ts)
        self.submitted: dict[str, float] = {}  # incident id -> wall time of its first open submit
        self.last_tick = 0.0

    def _on_snapshot(self, name, snap, ranks) -> None:
        self.latest[name] = snap
        self.ranks.extend(ranks)
        self.intakes[name].push(ranks)
        self.clients[name].offer(snap)

    def ts(self, t: float) -> float:
        return self.epoch + t

    def start_aggregator(self) -> None:
        eng = Engine(self.sim.topology, cluster=self.rig.cluster)
        log: list[tuple[str, int, float]] = []
        orig = eng.ingest

        def ingest(batch):
            log.append((batch.node, batch.seq, batch.ts))
            return orig(batch)

        eng.ingest = ingest  # the servicer calls engine.ingest: record every batch it hands over
        self.engine = eng
        self.engines.append(eng)
        self.ingested.append(log)
        self.last_tick = 0.0
        sender = AlertmanagerClient([self.rig.am.url], cluster=self.rig.cluster, resend_seconds=60.0)
        self.runtime = AggregatorRuntime(eng, grpc_listen=self.address, sender=sender,
                                         on_changed=self._on_changed).start()
        self.sender = sender

    def _on_changed(self, changed, now) -> None:
        t = time.time()
        for inc in changed:
            if inc.open:
                self.submitted.setdefault(inc.id, t)

    def kill_aggregator(self) -> None:
        """The aggregator process dies: gRPC goes away at once, nothing is flushed, state is lost."""
        self.runtime.stop(grace=0, flush=0.0, final_tick=False)
        self.runtime = self.engine = self.sender = None

    def start(self) -> None:
        self.start_aggregator()
        self.sim.start()  # the initial poll: every client holds its first snapshot now
        for c in self.clients.values():
            c.start()

    def catch_up(self, deadline: float = 20.0) -> None:
        """Tick like the service does, at sample time: whenever every node has delivered up to a
        newer time, tick there (replayed batches are ticked through in order)."""
        now = self.sim.now()
        end = time.monotonic() + deadline
        eng = self.engine
        while True:
            m = min(eng.nodes[n].last_ts for n in self.names)
            if m > self.last_tick:
                self.tick(m)
            if m >= now:
                return
            if time.monotonic() > end:
                raise AssertionError(f"agents did not deliver sample time {now - self.epoch:.0f} within {deadline}s: "
                                     f"{ {n: eng.nodes[n].last_ts - self.epoch for n in self.names} }")
            time.sleep(0.01)

    def tick(self, now: float) -> None:
        self.runtime.tick(now)
        assert self.runtime.tick_errors_total == 0
        self.last_tick = now

    def run_to(self, t_end: float) -> None:
        while self.sim.t + 1.0 <= t_end + 1e-9:
            self.sim.step()
            if self.engine is not None:
                self.catch_up()

    def close(self) -> None:
        for c in self.clients.values():
            c.stop(2.0)
        if self.runtime is not None:
            self.runtime.stop(grace=0.5, flush=1.0, final_tick=False)
        self.sim.close()


@pytest.fixture
def pipelines():
    made: list[Pipeline] = []
    yield made
    for p in made:
        p.close()


def _drive_memory(scn: Scenario, rig: AmRig) -> tuple[Engine, float, dict[str, float]]:
    """In-memory simulator straight into the Engine, ticked every interval; incidents to Alertmanager."""
    epoch = float(int(time.time() - scn.duration - 120))
    sim = SimulatedCluster(scn, mode="memory", interval=1.0, epoch=epoch)
    eng = Engine(sim.topology, cluster=rig.cluster)
    sender = AlertmanagerClient([rig.am.url], cluster=rig.cluster, resend_seconds=60.0)
    submitted: dict[str, float] = {}

    def on_changed(changed, now):
        for inc in changed:
            if inc.open:
                submitted.setdefault(inc.id, time.time())

    rt = AggregatorRuntime(eng, sender=sender, on_changed=on_changed).start()  # no gRPC: batches in memory
    try:
        drive = Drive(sim, rt)
        drive.connect()
        drive.run()
        assert rt.tick_errors_total == 0
        assert sender.flush(5.0), "Alertmanager client could not deliver"
    finally:
        rt.stop(grace=0, flush=1.0, final_tick=False)
        sim.close()
    return eng, epoch, submitted


def _cluster(nodes: int, npu: int, seed: int = 3) -> ClusterSpec:
    return ClusterSpec(nodes=nodes, layout="ib", nodes_per_unit=npu, seed=seed)


# ------------------------------------------------------------------------------------------- a


def test_flaky_cable_alerts_within_5s_and_resolves(rig, pipelines):
    node, rail, start, end = "node-005", 3, 8.0, 16.0
    comp = f"{node}/mlx5_{rail}/1"
    scn = Scenario(_cluster(8, 4), 40.0).with_fault("flaky_cable", node=node, rail=rail, start=start, end=end)
    p = Pipeline(scn, rig)
    pipelines.append(p)
    p.start()
    p.run_to(end)
    inj = p.ts(start)

    # the simulated training job: the ranks on that NIC (rail 3, local rank 3) slow down
    def comm(ts_from, ts_to, lr):
        xs = [r.comm_seconds for r in p.ranks if r.node == node and r.local_rank == lr and ts_from <= r.ts < ts_to]
        assert xs, (ts_from - p.epoch, ts_to - p.epoch, lr)
        return statistics.median(xs)

    before, during = comm(p.ts(0), inj, rail), comm(inj + 2, p.ts(end), rail)
    assert during > 1.15 * before, (before, during)
    assert during > 1.15 * comm(inj + 2, p.ts(end), 0), "only the faulted rail's ranks should slow down"
    steps = [r for r in p.ranks if r.node == node and r.local_rank == 0]
    assert (statistics.median(r.step_seconds for r in steps if r.ts > inj + 2)
            > 1.05 * statistics.median(r.step_seconds for r in steps if r.ts < inj))

    # an incident on the link, opened within 5 s of sample time after injection ...
    incs = [i for i in p.engine.incidents() if i.component == comp and i.component_type == "link"]
    assert incs, [(i.alertname, i.component) for i in p.engine.incidents()]
    first = min(incs, key=lambda i: i.first_seen)
    assert first.alertname == "FabricLinkErrors"
    assert 0 <= first.first_seen - inj <= 5.0, first.first_seen - inj
    # ... that reached the webhook through the real Alertmanager, startsAt within 5 s too
    firing = wait_until(lambda: [a for _, _, a in rig.hook("firing") if a["labels"].get("component") == comp
                                 and a["labels"].get("component_type") == "link"], 10.0, "firing alert at webhook")
    assert any(0 <= _parse_ts(a["startsAt"]) - inj <= 5.0 for a in firing), [a["startsAt"] for a in firing]
    arrival = min(t for t, s, a in rig.hook("firing") if a["labels"].get("component") == comp)
    assert arrival - p.submitted[first.id] < 5.0
    # nothing else was raised
    assert {i.component for i in p.engine.incidents()} == {comp}

    # the fault ends: every incident on the link resolves, and Alertmanager says so
    p.run_to(scn.duration)
    assert not p.engine.open_incidents(), [(i.alertname, i.component) for i in p.engine.open_incidents()]
    assert first.resolved_at is not None and first.resolved_at > p.ts(end)
    wait_until(lambda: [a for _, _, a in rig.hook("resolved") if a["labels"].get("component") == comp
                        and a["labels"]["alertname"] == "FabricLinkErrors"], 10.0, "resolved notification")
    wait_until(lambda: not rig.active(component=comp), 10.0, "Alertmanager shows the alert resolved")


# ------------------------------------------------------------------------------------------- b


def test_degraded_leaf_is_one_alert_not_one_per_port(deploy_rig):
    rig = deploy_rig
    scn = Scenario(_cluster(8, 4), 30.0).with_fault("leaf_degraded", unit=1, rail=2, start=8, end=25)
    eng, epoch, _ = _drive_memory(scn, rig)
    leaf = "leaf-u1-r2"
    # The per-port findings are the leaf's evidence (they open no incident of their own), and the ranks it
    # slows ride on the leaf's own alert (no separate SlowRanksSharedComponent): one fault, one alert.
    got_inc = sorted((i.alertname, i.component_type, i.component) for i in eng.incidents())
    assert got_inc == [("FabricLeafDegraded", "leaf", leaf)], got_inc
    leaf_inc = eng.manager.get_open("FabricLeafDegraded", leaf) or next(
        i for i in eng.incidents() if i.alertname == "FabricLeafDegraded")
    assert leaf_inc.first_seen - (epoch + 8) <= 5.0
    wait_until(lambda: [a for _, _, a in rig.hook("firing") if a["labels"]["alertname"] == "FabricLeafDegraded"],
               10.0, "leaf alert at webhook")
    time.sleep(1.2)  # one group_interval: a per-port notification would have been sent by now
    got = [(a["labels"]["alertname"], a["labels"]["component_type"], a["labels"]["component"])
           for _, _, a in rig.hook("firing")]
    assert got.count(("FabricLeafDegraded", "leaf", leaf)) >= 1
    assert set(got) == {("FabricLeafDegraded", "leaf", leaf)}, got
    assert not [g for g in got if g[1] == "link"], got
    # Alertmanager holds exactly one FabricLeafDegraded and no un-inhibited link alert
    act = rig.active()
    assert len([a for a in act if a["labels"]["alertname"] == "FabricLeafDegraded"]) == 1, act
    for a in act:
        if a["labels"].get("component_type") == "link":
            assert a["status"]["inhibitedBy"], a


# ------------------------------------------------------------------------------------------- c


def test_compute_slow_gpu_with_clean_fabric_is_a_gpu_straggler(rig):
    scn = Scenario(_cluster(8, 4), 40.0).with_fault("slow_gpu", node="node-002", gpu=5, start=8, end=40)
    eng, epoch, _ = _drive_memory(scn, rig)
    comp = "node-002/gpu5"
    incs = eng.incidents()
    assert [(i.alertname, i.component_type, i.component) for i in incs] == [("StragglerRank", "gpu", comp)]
    firing = wait_until(lambda: [a for _, _, a in rig.hook("firing") if a["labels"]["component"] == comp],
                        10.0, "StragglerRank at webhook")
    a = firing[0]
    assert a["labels"]["alertname"] == "StragglerRank" and a["labels"]["component_type"] == "gpu"
    assert "no fabric evidence" in a["annotations"]["description"], a["annotations"]
    assert not [x for _, _, x in rig.hook() if x["labels"]["component_type"] in ("link", "nic", "leaf", "rail")]


# ------------------------------------------------------------------------------------------- d


def test_quiet_30_minutes_raise_nothing(rig):
    scn = Scenario(_cluster(16, 8), 1800.0)
    eng, _, _ = _drive_memory(scn, rig)
    assert eng.detection.ticks_total == 1800
    assert eng.manager.all_incidents() == []
    time.sleep(1.2)  # one group_interval
    assert rig.hook() == [] and rig.active() == []


def test_counter_reset_from_driver_reload_raises_nothing(rig, pipelines):
    scn = Scenario(_cluster(4, 4), 30.0).with_fault("counter_reset", node="node-001", start=10)
    p = Pipeline(scn, rig)
    pipelines.append(p)
    seen_reset: list = []
    orig = p.clients["node-001"].offer

    def offer(snap):
        if any(d.reset for d in snap.deltas):
            seen_reset.append(snap.ts - p.epoch)
        orig(snap)

    p.clients["node-001"].offer = offer
    p.start()
    p.run_to(scn.duration)
    assert seen_reset and 10 <= seen_reset[0] <= 12, seen_reset  # the agent saw the counters go back
    assert p.engine.detection.ticks_total >= 29
    assert p.engine.manager.all_incidents() == []
    assert p.sender.flush(3.0)
    time.sleep(1.2)  # one group_interval
    assert rig.hook() == [] and rig.active() == []


# ------------------------------------------------------------------------------------------- e


def test_aggregator_restart_during_fault_spools_replays_and_dedups(rig, pipelines, tmp_path):
    node, rail, start, end = "node-006", 1, 7.0, 30.0
    comp = f"{node}/mlx5_{rail}/1"
    scn = Scenario(_cluster(8, 4), 30.0).with_fault("flaky_cable", node=node, rail=rail, start=start, end=end)
    p = Pipeline(scn, rig, spool_dir=tmp_path / "spool")
    pipelines.append(p)
    p.start()
    p.run_to(5)
    # 1) the aggregator dies before the fault; the fault starts while it is down
    p.kill_aggregator()
    wait_until(lambda: not any(c.connected for c in p.clients.values()), 10.0, "clients notice")
    p.run_to(12)
    assert all(len(c.spool) >= 5 for c in p.clients.values()), {n: len(c.spool) for n, c in p.clients.items()}
    restart_wall, restart_ts = time.time(), p.sim.now()
    p.start_aggregator()  # a new process: a fresh Engine
    p.catch_up()
    inc = p.engine.manager.get_open("FabricLinkErrors", comp)
    assert inc is not None, [(i.alertname, i.component) for i in p.engine.incidents()]
    # the evidence came from the replayed spool: the simulator has not stepped since the restart, so
    # every sample the new engine holds was taken and spooled while it was down.  (Whether a tick fell
    # between two replayed batches, opening it before restart_ts, depends on how fast the replay went.)
    assert inc.first_seen - p.ts(start) <= 5.0 and inc.first_seen <= restart_ts, inc.first_seen - p.epoch
    assert all(c.stats()["batches_replayed_total"] >= 5 for c in p.clients.values())
    wait_until(lambda: [t for t, _, a in rig.hook("firing") if a["labels"]["component"] == comp and t >= restart_wall],
               10.0, "the alert at the webhook after the restart")
    # 2) killed again while the alert is open, restarted: the third engine re-opens the same alert
    p.run_to(16)
    replayed_before = {n: c.stats()["batches_replayed_total"] for n, c in p.clients.items()}
    p.kill_aggregator()
    # Wait as for the first outage: a client that has not yet seen the connection die would send
    # samples 17-19 live on it, and whether they come back as replays or as live batches would
    # then depend on how fast the reconnect went.
    wait_until(lambda: not any(c.connected for c in p.clients.values()), 10.0, "clients notice")
    p.run_to(19)
    wait_until(lambda: all(len(c.spool) >= 3 for c in p.clients.values()), 10.0, "samples 17-19 spooled")
    p.start_aggregator()
    p.catch_up()
    p.run_to(22)
    assert p.engine.manager.get_open("FabricLinkErrors", comp) is not None
    assert p.sender.flush(5.0)
    time.sleep(1.2)  # one group_interval

    # nothing duplicated at Alertmanager: one firing alert for the link
    act = rig.active(component=comp)
    assert len(act) == 1 and act[0]["status"]["state"] == "active", act
    fps = {a["fingerprint"] for _, _, a in rig.hook("firing") if a["labels"]["component"] == comp}
    assert len(fps) == 1, fps
    assert {a["labels"]["component"] for _, _, a in rig.hook()} == {comp}
    # every engine ingested each (node, seq) at most once, and together they lost nothing
    for log in p.ingested:
        keys = [(n, s) for n, s, _ in log]
        assert len(keys) == len(set(keys))
    for eng in p.engines:
        assert eng.admission.batches_dropped_total == 0
    for n in p.names:
        seqs = sorted({s for log in p.ingested for nn, s, _ in log if nn == n})
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (n, seqs)
        tss = sorted({ts - p.epoch for log in p.ingested for nn, _, ts in log if nn == n})
        assert tss == [float(t) for t in range(0, 23)], (n, tss)
    # the second outage's three spooled samples came back as replays too
    assert all(c.stats()["batches_replayed_total"] - replayed_before[n] >= 3 for n, c in p.clients.items()), (
        replayed_before, {n: c.stats()["batches_replayed_total"] for n, c in p.clients.items()})
