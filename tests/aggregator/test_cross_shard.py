"""Cross-shard explanation (aggregator/remote_evidence.py) through two real shard engines.

A flaky cable on rail 3 in unit 0 (shard A) slows every rank of rail 3 in communication, in both units
(the rings of a rail-optimized job span them).  Shard A alerts FabricLinkErrors and its own late ranks
ride on it; shard B holds late rail-3 ranks with clean counters.  B reads A's open alerts as
Alertmanager holds them: the very JSON A's AlertmanagerClient posts (labels and annotations, what
``GET /api/v2/alerts`` gives back), through ``parse_active``.
"""

from __future__ import annotations

import json

import pytest

from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.config import ConfigError, DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.http_api import AggregatorCollector, HttpApi
from fabricmon.aggregator.remote_evidence import AlertmanagerEvidence, parse_active
from fabricmon.topology import generate_topology
from support.enginerig import T0, Feed, flaky, synced_ranks

FAULT_NODE, FAULT_DEV = "node-002", "mlx5_3"  # unit 0: shard A


class Rig:
    """Two shard engines (A: unit 0, B: unit 1) fed the same cluster, second by second."""

    def __init__(self, settings: DetectionSettings | None = None) -> None:
        self.topo = generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test")
        s = settings or DetectionSettings()
        self.a = Engine(self.topo, s, shard_units=(0,))
        self.b = Engine(self.topo, s, shard_units=(1,))
        self.feeds = {n: Feed(self.topo, n, i) for i, n in enumerate(self.topo.nodes)}
        for f in self.feeds.values():
            self.a.hello(f.hello())
            self.b.hello(f.hello())
        self.t = T0
        self.first = True
        self.fault = False
        self.slow_rail3 = False
        self.ranks_fn = synced_ranks(lambda step, n, g: 0.0,
                                     slow_transfer=lambda step, n, g: 0.3 if self.slow_rail3 and g == 3 else 0.0)
        self.sender_a = AlertmanagerClient(["http://127.0.0.1:9/"], cluster="test", shard="units 0")
        self.b_pages: list[tuple[str, str, bool]] = []

    def remote_for_b(self) -> list[dict]:
        """What Alertmanager holds from shard A: the payloads A's sender posts for its open incidents."""
        return [self.sender_a.payload(self.sender_a._snapshot(i)) for i in self.a.open_incidents()]

    def step(self) -> None:
        self.t += 1.0
        if self.fault:
            flaky(FAULT_NODE, FAULT_DEV)(self)  # the enginerig injector reads .feeds
        for name, f in self.feeds.items():
            b = f.batch(self.t, first=self.first, ranks=self.ranks_fn(self, name))
            self.a.ingest(b)
            self.b.ingest(b)
        self.first = False
        self.a.tick(self.t)
        for inc in self.b.tick(self.t):
            self.b_pages.append((inc.alertname, inc.component, inc.open))

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.step()


class ListSource:
    """B's remote source: ``parse_active`` over an Alertmanager answer the test sets."""

    def __init__(self, rig: Rig) -> None:
        self.rig, self.answer = rig, None

    def incidents(self):
        body = self.answer() if callable(self.answer) else []
        incs, bad = parse_active(json.loads(json.dumps(body)), cluster="test", topo=self.rig.topo,
                                 own_units=frozenset({1}))
        assert bad == 0
        return tuple(incs)

    def snapshot(self):
        return {"polls": {"ok": 1, "error": 0}, "incidents": len(self.incidents()), "last_ok_wall": 1.0,
                "malformed": 0}


def _straggler_pages(rig: Rig) -> list[tuple[str, str, bool]]:
    return [p for p in rig.b_pages if p[0] == "StragglerRank"]


def test_remote_link_fault_explains_comm_late_rail_stragglers_no_page():
    rig = Rig()
    src = ListSource(rig)
    src.answer = rig.remote_for_b
    rig.b.remote = src
    rig.fault = rig.slow_rail3 = True
    rig.run(40)
    # shard A owns the cable: FabricLinkErrors, its own late rail-3 ranks ride on it
    link = [i for i in rig.a.open_incidents() if i.alertname == "FabricLinkErrors"]
    assert [i.component for i in link] == [f"{FAULT_NODE}/{FAULT_DEV}/1"]
    assert not [i for i in rig.a.open_incidents() if i.alertname == "StragglerRank"]
    # shard B: late rail-3 ranks with clean counters, explained by A's incident: no page
    assert _straggler_pages(rig) == []
    assert not [i for i in rig.b.open_incidents() if i.alertname in ("StragglerRank", "SlowRanksSharedComponent")]
    explained = rig.b.views.explained_remote()
    assert len(explained) == 1
    e = explained[0]
    assert e["remote"] is True and e["alertname"] == "FabricLinkErrors"
    assert e["component"] == f"{FAULT_NODE}/{FAULT_DEV}/1"
    # B's ranks: nodes 8..15, GPU 3 (rank = node index * 8 + 3)
    assert e["ranks"] == [n * 8 + 3 for n in range(8, 16)] and e["jobs"] == ["llm"]
    assert "explained by FabricLinkErrors on node-002/mlx5_3/1 (shard units 0)" in e["description"]
    assert any("(rail 3)" in ev for ev in e["evidence"])
    # the /api/incidents body and the metric
    api = HttpApi(rig.b, ("127.0.0.1", 0))  # not started: the route's handler is called directly
    code, body, _ = api._incidents({"state": ["open"]})
    assert code == 200 and [x["id"] for x in json.loads(body) if x.get("remote")] == [e["id"]]
    fams = {m.name: m for m in AggregatorCollector(rig.b).collect()}
    samples = {s.labels.get("alertname"): s.value for s in fams["fabricmon_stragglers_explained_remote"].samples}
    assert samples == {"FabricLinkErrors": 8.0}
    assert fams["fabricmon_straggler_groups_explained_remote"].samples[0].value == 1.0


def test_no_remote_fault_pages_after_the_grace_only():
    """The same late rail-3 ranks in B with nothing remote to explain them: StragglerRank, after the grace."""
    s = DetectionSettings(cross_shard_grace_intervals=5)
    rig = Rig(s)
    src = ListSource(rig)
    src.answer = list  # Alertmanager holds nothing
    rig.b.remote = src
    rig.slow_rail3 = True
    seen_at = None
    for _ in range(60):
        rig.step()
        if seen_at is None and rig.b.detection.cross.waiting:
            seen_at = rig.t
        if _straggler_pages(rig):
            break
    pages = _straggler_pages(rig)
    assert seen_at is not None, "the comm-late group never waited: not judged cross-shard"
    assert pages and pages[0][2] is True
    # opened no earlier than the grace (5 intervals of 1 s) after it was first seen unexplained
    first_open = rig.t
    assert first_open - seen_at >= 5
    assert rig.b.views.explained_remote() == []


def test_explanation_gone_while_stragglers_stay_fires_normally():
    rig = Rig(DetectionSettings(cross_shard_grace_intervals=3))
    src = ListSource(rig)
    remote_alive = {"on": True}
    src.answer = lambda: rig.remote_for_b() if remote_alive["on"] else []
    rig.b.remote = src
    rig.fault = rig.slow_rail3 = True
    rig.run(40)
    assert _straggler_pages(rig) == [] and rig.b.views.explained_remote()
    remote_alive["on"] = False  # A's incident resolved (or unreadable), B's ranks still late
    rig.run(15)
    pages = _straggler_pages(rig)  # an open and its updates (ranks joining), nothing resolved
    assert pages and all(p[2] for p in pages) and len({p[1] for p in pages}) == 1, pages
    assert rig.b.views.explained_remote() == []


def test_compute_late_rank_is_never_delayed_or_hidden_by_a_remote_fault():
    rig = Rig(DetectionSettings(cross_shard_grace_intervals=30))
    src = ListSource(rig)
    src.answer = rig.remote_for_b
    rig.b.remote = src
    rig.fault = rig.slow_rail3 = True
    base = rig.ranks_fn
    rig.ranks_fn = synced_ranks(lambda step, n, g: 0.4 if (n, g) == ("node-012", 3) else 0.0,
                                slow_transfer=lambda step, n, g: 0.3 if g == 3 else 0.0)
    assert base is not rig.ranks_fn
    rig.run(40)
    # a slow GPU on rail 3 in B: a compute straggler, paged without waiting the 30 s grace
    assert ("StragglerRank", "node-012/gpu3", True) in _straggler_pages(rig)


def test_parse_active_keeps_only_other_shards_fabric_alerts_of_this_cluster():
    topo = generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test")

    def alert(alertname, ctype, comp, ann=True, **lab):
        a = {"labels": {"alertname": alertname, "component_type": ctype, "component": comp, "cluster": "test",
                        "severity": "warning", **lab},
             "annotations": {"incident_id": "x", "shard": "units 0"} if ann else {},
             "startsAt": "2026-01-01T00:00:00Z", "endsAt": "2026-01-01T00:10:00Z", "status": {"state": "active"}}
        return a

    body = [
        alert("FabricLinkErrors", "link", "node-002/mlx5_3/1", node="node-002", rail="3", leaf="leaf-u0-r3"),
        alert("FabricLeafDegraded", "leaf", "leaf-u0-r5", rail="5", leaf="leaf-u0-r5"),
        alert("FabricLinkErrors", "link", "node-010/mlx5_3/1", node="node-010", rail="3"),  # own unit 1
        alert("FabricLinkErrors", "link", "node-003/mlx5_3/1", ann=False, node="node-003", rail="3"),  # a rule's
        alert("GPUXidFatal", "gpu", "node-003/gpu3", node="node-003", gpu="3"),  # not fabric
        alert("FabricLinkErrors", "link", "node-004/mlx5_3/1", node="node-004", rail="3", cluster="other"),
        alert("FabricLinkErrors", "link", "ghost/mlx5_3/1", node="ghost", rail="3"),  # unit unknown
        {"labels": "bad"},
    ]
    incs, bad = parse_active(body, cluster="test", topo=topo, own_units=frozenset({1}))
    assert bad == 1
    assert [(i.alertname, i.component.id, i.rail, sorted(i.units)) for i in incs] == [
        ("FabricLinkErrors", "node-002/mlx5_3/1", 3, [0]), ("FabricLeafDegraded", "leaf-u0-r5", 5, [0])]
    assert parse_active({"not": "a list"}, cluster="test", topo=topo, own_units=frozenset())[1] == 1


def test_unreachable_source_is_counted_logged_and_goes_stale_without_blocking():
    topo = generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test")
    now = [100.0]
    answers: list[object] = [[{"labels": {"alertname": "FabricLinkErrors", "component_type": "link",
                                          "component": "node-002/mlx5_3/1", "cluster": "test", "rail": "3",
                                          "node": "node-002"}, "annotations": {"incident_id": "i1"}}]]

    def fetch(url, cluster, timeout):
        assert cluster == "test" and timeout == 1.0
        a = answers.pop(0) if answers else OSError("connection refused")
        if isinstance(a, Exception):
            raise a
        return a

    src = AlertmanagerEvidence(["http://127.0.0.1:9"], cluster="test", topo=topo, own_units=frozenset({1}),
                               poll_s=2.0, timeout=1.0, fetch=fetch, wall=lambda: now[0])
    assert src.incidents() == ()  # never read: explains nothing
    assert src.poll_once() is True and len(src.incidents()) == 1
    assert src.poll_once() is False and src.stats.polls == {"ok": 1, "error": 1}
    assert len(src.incidents()) == 1  # one failed poll: the last answer still holds
    now[0] += src.stale_after + 0.1
    assert src.incidents() == () and src.snapshot()["incidents"] == 0  # stale: stragglers page again


def test_grace_setting_is_validated():
    with pytest.raises(ConfigError, match="cross_shard_grace_intervals"):
        DetectionSettings(cross_shard_grace_intervals=0).validate("detection", "x.yaml")
    with pytest.raises(ConfigError, match="cross_shard_grace_intervals: at most 30"):
        DetectionSettings(cross_shard_grace_intervals=31).validate("detection", "x.yaml")


@pytest.mark.integration
def test_real_alertmanager_remote_fault_silences_then_its_absence_pages(tmp_path):
    """Shard A's FabricLinkErrors on rail 3 posted to a real Alertmanager (the shipped inhibitions), shard B
    reading it back with the real poller: B's comm-late rail-3 ranks do not page while it is active, and
    page (a StragglerRank active at Alertmanager, not inhibited) once nothing remote explains them."""
    import yaml

    from support.paths import REPO
    from support.promtools import running_alertmanager

    shipped = yaml.safe_load((REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    cfg = {"route": {"receiver": "null", "group_by": ["cluster", "alertname", "component"]},
           "receivers": [{"name": "null"}], "inhibit_rules": shipped["inhibit_rules"]}
    with running_alertmanager(cfg, tmp_path / "am") as am:
        rig = Rig(DetectionSettings(cross_shard_grace_intervals=3))
        a_sender = AlertmanagerClient([am.url], cluster="test", shard="units 0")
        b_sender = AlertmanagerClient([am.url], cluster="test", shard="units 1")
        src = AlertmanagerEvidence([am.url], cluster="test", topo=rig.topo, own_units=frozenset({1}),
                                   poll_s=1.0, timeout=2.0)
        rig.b.remote = src
        rig.fault = rig.slow_rail3 = True

        def second(n: int) -> None:
            for _ in range(n):
                rig.step()
                a_sender.submit(rig.a.open_incidents(), rig.t)
                a_sender._once()
                b_sender.submit([i for i in rig.b.incidents() if i.version], rig.t)
                b_sender._once()
                src.poll_once()  # the poller's body, on the test's clock: no thread timing

        second(40)
        active = {(x["labels"]["alertname"], x["labels"]["component"]) for x in am.get_alerts(cluster="test")
                  if x["status"]["state"] != "unprocessed"}
        assert ("FabricLinkErrors", f"{FAULT_NODE}/{FAULT_DEV}/1") in active
        assert not [k for k in active if k[0] == "StragglerRank"], active
        assert [e["alertname"] for e in rig.b.views.explained_remote()] == ["FabricLinkErrors"]
        assert src.stats.polls["ok"] >= 40 and src.stats.polls["error"] == 0

        # shard A's incident resolved at Alertmanager (its fault's evidence gone elsewhere), B's ranks still late
        link = next(i for i in rig.a.open_incidents() if i.alertname == "FabricLinkErrors")
        resolved = a_sender.payload(a_sender._snapshot(link))
        resolved["endsAt"] = resolved["startsAt"]
        am.post_alerts([resolved])
        rig.fault = False
        rig.a = Engine(rig.topo, rig.a.settings, shard_units=(0,))  # A forgets it: nothing re-sends it
        second(15)
        pages = {x["labels"]["component"]: x["status"]["state"] for x in am.get_alerts(cluster="test")
                 if x["labels"]["alertname"] == "StragglerRank"}
        assert pages and set(pages.values()) == {"active"}, pages
        assert rig.b.views.explained_remote() == []


@pytest.mark.integration
def test_sharded_service_polls_alertmanager_off_the_tick_and_counts_an_unreachable_one(tmp_path):
    """``build_runtime`` from a sharded config: the poller runs in its own thread; an Alertmanager that
    refuses connections is a counted error on /metrics while ticks go on; unsharded, no poller."""
    import socket
    import urllib.request

    import yaml

    from fabricmon.aggregator.config import load_aggregator_config
    from fabricmon.aggregator.remote_evidence import AlertmanagerEvidence
    from fabricmon.aggregator.service import build_runtime
    from support.waiting import wait_until

    with socket.socket() as s:  # a loopback port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(
        {"cluster": "c1", "layout": "roce", "nodes_per_unit": 2, "generate": {"nodes": 4, "gpus_per_node": 8,
                                                                                "rails": 8}}))

    def config(shard: bool) -> object:
        body = {"topology": "topology.yaml", "grpc_listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
                "tick_seconds": 0.05, "auth": {"insecure": True},
                "alertmanager": {"urls": [dead], "evidence_poll_seconds": 0.1, "timeout": 0.5}}
        if shard:
            body["shard"] = {"units": [1]}
        p = tmp_path / f"agg-{shard}.yaml"
        p.write_text(yaml.safe_dump(body))
        return load_aggregator_config(p)

    assert build_runtime(config(False)).engine.remote is None
    rt = build_runtime(config(True))
    assert isinstance(rt.engine.remote, AlertmanagerEvidence) and rt.background == (rt.engine.remote,)
    rt.start()
    try:
        def errors() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{rt.http_port}/metrics", timeout=5) as r:
                text = r.read().decode()
            line = next(x for x in text.splitlines()
                        if x.startswith('fabricmon_remote_evidence_polls_total{result="error"}'))
            return float(line.rsplit(" ", 1)[1])

        wait_until(lambda: errors() >= 2, 10.0, "the unreachable Alertmanager counted")
        t0 = rt.engine.detection.ticks_total
        rt.tick(1_764_000_000.0)  # a tick does not wait for the poller
        rt.tick(1_764_000_001.0)
        assert rt.engine.detection.ticks_total == t0 + 2 and rt.engine.remote.incidents() == ()
    finally:
        rt.stop(grace=0.5, flush=0.2)


def test_malformed_entries_of_an_answer_are_skipped_and_exported():
    """Worst answers Alertmanager (or something at its URL) could give: not a list, entries without labels,
    a component that does not parse.  Each is skipped, counted, and visible on /metrics."""
    from prometheus_client import CollectorRegistry, generate_latest

    from fabricmon.aggregator.engine import Engine
    from fabricmon.aggregator.http_api import AggregatorCollector

    topo = generate_topology(16, nodes_per_unit=8, layout="roce", cluster="test")
    good = {"labels": {"alertname": "FabricLinkErrors", "component_type": "link", "component": "node-002/mlx5_3/1",
                       "cluster": "test", "rail": "3", "node": "node-002"}, "annotations": {"incident_id": "i1"}}
    bad_component = {"labels": {**good["labels"], "component": "no/such/link/x"}, "annotations": {"incident_id": "i2"}}
    answers: list[object] = [{"not": "a list"}, ["text", {"labels": None}, bad_component, good]]
    src = AlertmanagerEvidence(["http://127.0.0.1:9"], cluster="test", topo=topo, own_units=frozenset({1}),
                               fetch=lambda *_: answers.pop(0))
    assert src.poll_once() is True and src.incidents() == ()
    assert src.poll_once() is True and [r.component.id for r in src.incidents()] == ["node-002/mlx5_3/1"]
    assert src.stats.malformed == 1 + 3
    engine = Engine(topo, shard_units=frozenset({1}))
    engine.remote = src
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AggregatorCollector(engine))
    assert "fabricmon_remote_evidence_malformed_alerts_total 4.0" in generate_latest(reg).decode()
