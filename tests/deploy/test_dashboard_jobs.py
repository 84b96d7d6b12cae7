"""The job dashboard keeps jobs apart (issue 30): every panel selects by the job (hpc_job and job_id),
every label a dashboard query matches on exists on the metric as fabricmon exports it, and a real
Prometheus scraping a two-job workload returns each panel's data for the selected job only.

The workload: 12 simulated nodes (memory mode, sample time), two jobs with scheduler ids
(llm-70b on 6 nodes with 2 pipeline stages, one of them 12% slower: StageImbalance; vlm-13b on
6 nodes with a slow dataloader on one: SoftwareStraggler), a flaky cable under llm-70b and a slow
GPU in llm-70b (pages with a cost to it).  The aggregator's /metrics is its real collector over
the engine that saw every batch; each node's agent /metrics is the agent's real exporter over a
real rank intake (fed the simulator's rank lines) and a real NCCL Inspector source (fed v4.0
records, tests/support/promtools.py ``_nccl_line``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from support.dashboards import AGGREGATOR_METRICS, _panels
from support.promtools import REPO, _nccl_line, prometheus_config, running_prometheus, wait_until

JOB_BOARD = REPO / "dashboards" / "json" / "fabricmon-job.json"
DASHBOARDS = sorted((REPO / "dashboards" / "json").glob("*.json"))
JOBS = {"llm-70b": "slurm-81723", "vlm-13b": "slurm-81724"}
NODES = 12
DURATION = 60.0
# Labels every series may have besides its own: the external cluster label and Prometheus' target labels.
SCRAPE_LABELS = {"cluster", "instance", "job"}
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^{}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
# The job selection, as dashboards/generate.py writes it: strict where the series always carry the
# job's id (rank gauges, lateness, cost), also matching none on incidents (findings may not know it).
JOB_MATCHERS = {("hpc_job", "=~", "$hpc_job"), ("job_id", "=~", "$job_id")}
JOB_INCIDENT_MATCHERS = {("hpc_job", "=~", "$hpc_job"), ("job_id", "=~", "$job_id|")}
ON_JOB_NODES = "and on (cluster, node) group by (cluster, node) (fabricmon_rank_step_seconds{"
# Panels of the job view that are empty for a job in this workload, and why.
EMPTY_FOR = {
    ("vlm-13b", "Stragglers and hangs (pages)"): "no hardware fault under vlm-13b",
    ("vlm-13b", "What open incidents cost each job (GPU-hours per hour)"): "no fault on vlm-13b's path",
    ("vlm-13b", "GPU-hours per hour lost per job"): "no fault on vlm-13b's path",
}


def _selectors(expr: str) -> list[tuple[str, set[tuple[str, str, str]]]]:
    return [(m.group(1), set(MATCHER.findall(m.group(2)))) for m in SELECTOR.finditer(expr)]


def _targets(dash: dict) -> Iterator[tuple[str, str]]:
    for p in _panels(dash):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for a in dash["annotations"]["list"]:
        if a.get("expr"):
            yield "annotation " + a["name"], a["expr"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            yield "variable " + v["name"], v["definition"]


# ------------------------------------------------------------------ the workload, exported

def _scenario():
    from fabricmon.sim.scenario import ClusterSpec, Fault, Scenario
    from fabricmon.sim.workload import Decoy, JobDef

    half = NODES // 2
    scn = Scenario(
        ClusterSpec(nodes=NODES, layout="roce", nodes_per_unit=4, seed=5), DURATION,
        (Fault("flaky_cable", node="node-001", rail=3, start=25.0),
         Fault("slow_gpu", node="node-004", gpu=2, start=25.0)),
        (JobDef("llm-70b", (0, half - 1), pp=2, job_id=JOBS["llm-70b"]),
         JobDef("vlm-13b", (half, NODES - 1), job_id=JOBS["vlm-13b"])),
        (Decoy("stage_imbalance", job="llm-70b", stage=1, magnitude=1.12),
         Decoy("dataloader_slow", node=f"node-{NODES - 2:03d}", magnitude=1.15)))
    scn.validate("", "<test>")
    return scn


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, bytes]:
    """/metrics bodies by path: "aggregator" and one per node."""
    from fabricmon.agent.exporter import render_snapshot
    from fabricmon.agent.intake import RankIntake
    from fabricmon.agent.nccl_inspector import NcclInspectorSource
    from fabricmon.aggregator.config import DetectionSettings
    from fabricmon.aggregator.engine import Engine
    from fabricmon.aggregator.http_api import AggregatorCollector
    from fabricmon.model import Sample, Snapshot
    from fabricmon.rank_timing import to_json
    from fabricmon.sim.runner import SimulatedCluster

    base = tmp_path_factory.mktemp("nccl")
    intakes: dict[str, RankIntake] = {}
    nccl: dict[str, NcclInspectorSource] = {}
    for i in range(NODES):
        name = f"node-{i:03d}"
        intakes[name] = RankIntake(name)
        (base / name).mkdir()
        nccl[name] = NcclInspectorSource(str(base / name))
        nccl[name].poll()  # files present at start are read from their end: start before the first record

    with SimulatedCluster(_scenario(), mode="memory") as sim:
        engine = Engine(sim.topology, DetectionSettings())
        sim.start()
        for h in sim.hellos():
            engine.hello(h)

        def deliver(batch) -> None:
            engine.ingest(batch)
            for r in batch.ranks:  # what each node's job clients wrote to its agent's rank intake
                intakes[batch.node].submit_line(to_json(r))

        sim.on_batch = deliver
        while sim.t < DURATION:
            sim.step()
            engine.tick(sim.now())
        now = sim.now()

    incidents = {(i.alertname, i.labels.get("hpc_job")) for i in engine.open_incidents()}
    # the workload made what the job view shows: a page, its cost, both jobs' software findings
    assert {("StageImbalance", "llm-70b"), ("SoftwareStraggler", "vlm-13b")} <= incidents, incidents
    assert any(a == "StragglerRank" for a, _ in incidents) and any(a == "FabricLinkErrors" for a, _ in incidents)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AggregatorCollector(engine))
    out = {"aggregator": generate_latest(reg)}
    for name, intake in intakes.items():
        with (base / name / "nccl-inspector-1.log").open("w") as f:  # two local ranks' AllReduce records
            for sn in range(3):
                for rank in range(2):
                    f.write(_nccl_line(rank, sn, now))
        res = nccl[name].poll()
        readings = [*intake.readings(), *res.readings]
        samples = tuple(Sample(r.family, r.labels, float(r.value)) for r in readings)
        out[name] = render_snapshot(Snapshot(name, now, 1, samples, (), 1.0, ()))
    # what every agent and aggregator serves beside the snapshot: stream and thread health, build info and
    # reload status (the Self-monitoring view's blind-spot panels)
    from fabricmon.agent.selfmetrics import AgentSelfCollector
    from fabricmon.buildinfo import ReloadStatus, add_runtime_collectors

    own = add_runtime_collectors(CollectorRegistry(auto_describe=False), ReloadStatus())
    own.register(AgentSelfCollector(next(iter(intakes)), lambda: {}, lambda: {}))
    out["self"] = generate_latest(own)
    return out


def _exported_labels(bodies: dict[str, bytes]) -> dict[str, set[str]]:
    """Metric name -> the label names its exported series carry (counters by their _total name)."""
    from fabricmon.agent.exporter import ALL_SPECS

    labels: dict[str, set[str]] = {}
    for body in bodies.values():
        for fam in text_string_to_metric_families(body.decode()):
            for s in fam.samples:
                labels.setdefault(s.name, set()).update(s.labels)
    # agent families not in this workload: their spec's labels, and the node the exporter adds
    for spec in ALL_SPECS.values():
        name = spec.name if spec.kind != "counter" or spec.name.endswith("_total") else spec.name + "_total"
        labels.setdefault(name, {"node", *spec.labels})
    return labels


def test_aggregator_metrics_the_dashboards_name_are_exported(exported) -> None:
    names = {s.name for fam in text_string_to_metric_families(exported["aggregator"].decode()) for s in fam.samples}
    assert AGGREGATOR_METRICS <= names, AGGREGATOR_METRICS - names


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_label_a_query_matches_on_is_exported(path: Path, exported) -> None:
    """A matcher on a label the metric does not carry matches nothing once a value is picked: a
    panel that silently shows no job.  Recording-rule outputs are checked by the rule tests."""
    exported_labels = _exported_labels(exported)
    checked = 0
    for where, expr in _targets(json.loads(path.read_text())):
        for metric, matchers in _selectors(expr):
            if ":" in metric or metric == "up":
                continue
            assert metric in exported_labels, f"{path.stem} {where}: {metric} is not exported in the workload"
            missing = {lab for lab, _, _ in matchers} - exported_labels[metric] - SCRAPE_LABELS
            assert not missing, f"{path.stem} {where}: {metric} has no label {missing} in {expr!r}"
            checked += 1
    assert checked


def test_every_job_panel_selects_by_the_job() -> None:
    """Each query of the job view selects the job: series with an hpc_job label by hpc_job and
    job_id, series without one (NCCL Inspector) only on the nodes where a selected job's ranks run."""
    dash = json.loads(JOB_BOARD.read_text())
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"hpc_job", "job_id"} <= names
    from fabricmon.agent.exporter import ALL_SPECS

    with_job = {s.name for s in ALL_SPECS.values() if "hpc_job" in s.labels} | {
        "fabricmon_rank_lateness_score", "fabricmon_incident_gpu_hours_per_hour", "fabricmon_incident_open",
        "fabricmon_incident_started_timestamp_seconds"}
    panels = [p for p in _panels(dash) if p["type"] != "row"]
    assert len(panels) >= 12
    for p in panels:
        for t in p["targets"]:
            expr = t["expr"]
            sels = _selectors(expr)
            assert any(m in with_job for m, _ in sels), f"{p['title']}: selects no job: {expr!r}"
            for metric, matchers in sels:
                if metric in with_job:
                    want = JOB_INCIDENT_MATCHERS if metric.startswith("fabricmon_incident_") and \
                        metric != "fabricmon_incident_gpu_hours_per_hour" else JOB_MATCHERS
                    assert want <= matchers, f"{p['title']}: {metric} not selected by the job in {expr!r}"
                else:
                    assert ON_JOB_NODES in expr, f"{p['title']}: {metric} not kept to the job's nodes in {expr!r}"
            # an aggregation over a job's series keeps the job apart (or is the node filter itself)
            for by in re.findall(r"\bby\s*\(([^)]*)\)", expr):
                labels = {x.strip() for x in by.split(",")}
                assert "hpc_job" in labels or labels == {"cluster", "node"} or ON_JOB_NODES in expr, \
                    f"{p['title']}: aggregation by ({by}) mixes jobs in {expr!r}"
    titles = {p["title"] for p in panels}
    assert {"Step time per job (median over its ranks)", "Software findings (info, never paged)",
            "Stragglers and hangs (pages)", "What open incidents cost each job (GPU-hours per hour)",
            "Late ranks per job (top 10 by lateness score)"} <= titles


# ------------------------------------------------------------------ live: a real Prometheus

class _Metrics(BaseHTTPRequestHandler):
    bodies: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.bodies.get(self.path.strip("/"))
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        try:
            self.wfile.write(body or b"")
        except (BrokenPipeError, ConnectionResetError):
            pass  # Prometheus gave up on the scrape (it is being stopped)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus(exported, tmp_path_factory):
    handler = type("Handler", (_Metrics,), {"bodies": exported})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    target = f"127.0.0.1:{server.server_address[1]}"
    # one target per exporter, each at its own path (the agents' and the aggregator's /metrics) and with its
    # own instance (Prometheus keeps one of targets whose labels end up equal)
    statics = [{"targets": [target], "labels": {"__metrics_path__": f"/{path}", "instance": path}}
               for path in exported]
    cfg = prometheus_config()
    cfg["scrape_configs"] = [{"job_name": "fabricmon", "honor_labels": True, "static_configs": statics}]
    try:
        with running_prometheus(tmp_path_factory.mktemp("prom"), cfg) as prom:
            # every target scraped twice: a panel's rate() needs two samples of a counter on each node, and
            # Prometheus spreads the targets' first scrapes over the interval (one node's rate is no sign of all)
            wait_until(lambda: len(prom.query("up == 1")) == len(exported)
                       and len(prom.query("count_over_time(up[1m]) >= 2")) == len(exported)
                       and prom.query("fabricmon_incident_open"), 20.0, "every target scraped twice", interval=0.2)
            yield prom
    finally:
        server.shutdown()
        server.server_close()


def _query_for(expr: str, job: str) -> str:
    """The panel query as Grafana sends it with this job (and its id) selected, the rest at "All"."""
    expr = expr.replace("$hpc_job", job).replace("$job_id", JOBS[job])  # no regex character in either
    expr = expr.replace("$__rate_interval", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("job", sorted(JOBS))
def test_job_view_shows_the_selected_job_only(job: str, prometheus) -> None:
    other = next(j for j in JOBS if j != job)
    nodes = {f"node-{i:03d}" for i in (range(NODES // 2) if job == "llm-70b" else range(NODES // 2, NODES))}
    dash = json.loads(JOB_BOARD.read_text())
    for p in _panels(dash):
        if p["type"] == "row":
            continue
        got = [r for t in p["targets"] for r in prometheus.query(_query_for(t["expr"], job))]
        if (job, p["title"]) in EMPTY_FOR:
            assert got == [], f"{p['title']}: {got}"
            continue
        assert got, f"{job}: panel {p['title']!r} has no data"
        for r in got:
            lab = r["metric"]
            assert lab.get("hpc_job", job) == job and lab.get("job_id", "") in ("", JOBS[job]), (p["title"], lab)
            assert lab.get("node", next(iter(nodes))) in nodes, (p["title"], lab)
            assert other not in json.dumps(lab), (p["title"], lab)
    findings = prometheus.query(_query_for(next(t["expr"] for p in _panels(dash) for t in p.get("targets", [])
                                                if p["title"] == "Software findings (info, never paged)"), job))
    want = "StageImbalance" if job == "llm-70b" else "SoftwareStraggler"
    assert {r["metric"]["alertname"] for r in findings} == {want}
    assert {r["metric"]["severity"] for r in findings} == {"info"}
