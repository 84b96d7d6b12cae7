"""Start and stop real Prometheus / Alertmanager (and find promtool/amtool) for tests.

Everything runs on 127.0.0.1, on free ports, in temporary directories; processes are
stopped by PID and every wait polls with a deadline.  A missing binary makes the
calling test skip with a visible reason (CI installs them: Debian packages
``prometheus`` and ``prometheus-alertmanager``).

Usage::

    with running_alertmanager(config_text, tmp_path) as am:
        am.post_alerts([...]); am.get_alerts()
    with running_prometheus(tmp_path, scrape_targets=["127.0.0.1:9720"],
                            rule_files=[...], alertmanagers=[am.address]) as prom:
        prom.wait_for_query('up == 1', deadline=10)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.net import free_port  # noqa: F401 (re-exported)
from support.paths import REPO
from support.waiting import wait_until

# Binary names, first found wins (Debian names the Alertmanager binary differently).
PROMETHEUS = ("prometheus",)
PROMTOOL = ("promtool",)
ALERTMANAGER = ("prometheus-alertmanager", "alertmanager")
AMTOOL = ("amtool",)


def find_binary(names: Sequence[str]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_binary(names: Sequence[str]) -> str:
    """Path of the first binary found, or skip the test saying which is missing."""
    path = find_binary(names)
    if path is None:
        pytest.skip(f"{' / '.join(names)} not installed (CI installs it; apt-get install "
                    f"prometheus prometheus-alertmanager)")
    return path


def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        status = exc.code
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    port: int
    workdir: Path
    log_path: Path
    extra: dict = field(default_factory=dict)
    host: str = "127.0.0.1"  # any loopback address (127.0.0.0/8): two services may share a port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=grace)


def _start(name: str, argv: list[str], port: int, workdir: Path, ready_path: str, deadline: float,
           host: str = "127.0.0.1") -> Service:
    log_path = workdir / f"{name}.log"
    log = open(log_path, "wb")  # closed when the process ends
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
    log.close()
    svc = Service(name, proc, port, workdir, log_path, host=host)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{svc.log()}")
        status, _ = http("GET", f"{svc.url}{ready_path}", timeout=1.0)
        return status == 200

    try:
        wait_until(ready, deadline, f"{name} ready on {svc.address}")
    except BaseException:
        svc.stop()
        raise
    return svc


# ---------------------------------------------------------------- Alertmanager

class Alertmanager(Service):
    def post_alerts(self, alerts: list[dict]) -> None:
        status, body = http("POST", f"{self.url}/api/v2/alerts", alerts)
        if status != 200:
            raise RuntimeError(f"POST /api/v2/alerts -> {status}: {body}")

    def get_alerts(self, **filters: str) -> list[dict]:
        query = "&".join(f"filter={urllib.parse.quote(f'{k}={json.dumps(v)}')}" for k, v in filters.items())
        status, body = http("GET", f"{self.url}/api/v2/alerts" + (f"?{query}" if query else ""))
        if status != 200:
            raise RuntimeError(f"GET /api/v2/alerts -> {status}: {body}")
        return body


def start_alertmanager(config: str | dict, workdir: Path, deadline: float = 20.0) -> Alertmanager:
    binary = require_binary(ALERTMANAGER)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "alertmanager.yml"
    cfg.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    (workdir / "am-data").mkdir(exist_ok=True)
    port = free_port()
    argv = [binary, f"--config.file={cfg}", f"--storage.path={workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            "--log.level=info"]
    svc = _start("alertmanager", argv, port, workdir, "/-/ready", deadline)
    return Alertmanager(svc.name, svc.proc, svc.port, svc.workdir, svc.log_path)


@contextlib.contextmanager
def running_alertmanager(config: str | dict, workdir: Path, deadline: float = 20.0) -> Iterator[Alertmanager]:
    am = start_alertmanager(config, workdir, deadline)
    try:
        yield am
    finally:
        am.stop()


# ---------------------------------------------------------------- Prometheus

class Prometheus(Service):
    def query(self, expr: str) -> list[dict]:
        status, body = http("GET", f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        if status != 200 or body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} -> {status}: {body}")
        return body["data"]["result"]

    def wait_for_query(self, expr: str, deadline: float = 10.0) -> list[dict]:
        """Poll until ``expr`` returns a non-empty vector (the first sample lags /-/ready)."""
        return wait_until(lambda: self.query(expr), deadline, f"PromQL {expr!r} non-empty", interval=0.2)

    def alerts(self) -> list[dict]:
        status, body = http("GET", f"{self.url}/api/v1/alerts")
        if status != 200:
            raise RuntimeError(f"GET /api/v1/alerts -> {status}: {body}")
        return body["data"]["alerts"]


def prometheus_config(scrape_targets: Sequence[str] = (), *, job: str = "fabricmon-agent",
                      scrape_interval: str = "1s", evaluation_interval: str = "1s",
                      rule_files: Sequence[str | Path] = (), alertmanagers: Sequence[str] = (),
                      external_labels: dict[str, str] | None = None,
                      target_labels: dict[str, str] | None = None,
                      extra_scrape_configs: Sequence[dict] = ()) -> dict:
    """A prometheus.yml as a dict, with the settings deploy/README.md recommends (honor_labels)."""
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval,
                   "external_labels": dict(external_labels or {})},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [],
    }
    if scrape_targets:
        static: dict[str, Any] = {"targets": list(scrape_targets)}
        if target_labels:
            static["labels"] = dict(target_labels)
        # honor_labels: the agent's own `node` label must win over the target's.
        cfg["scrape_configs"].append({"job_name": job, "honor_labels": True, "static_configs": [static]})
    cfg["scrape_configs"].extend(extra_scrape_configs)
    if alertmanagers:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    return cfg


def start_prometheus(workdir: Path, config: dict | None = None, deadline: float = 20.0, **kwargs: Any) -> Prometheus:
    """Start Prometheus with ``config`` (a dict) or ``prometheus_config(**kwargs)``."""
    binary = require_binary(PROMETHEUS)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config if config is not None else prometheus_config(**kwargs), sort_keys=False))
    port = free_port()
    argv = [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", "--log.level=info"]
    svc = _start("prometheus", argv, port, workdir, "/-/ready", deadline)
    return Prometheus(svc.name, svc.proc, svc.port, svc.workdir, svc.log_path)


@contextlib.contextmanager
def running_prometheus(workdir: Path, config: dict | None = None, deadline: float = 20.0,
                       **kwargs: Any) -> Iterator[Prometheus]:
    prom = start_prometheus(workdir, config, deadline, **kwargs)
    try:
        yield prom
    finally:
        prom.stop()


# ---------------------------------------------------------------- promtool / amtool

def run_tool(names: Sequence[str], *args: str | Path, timeout: float = 120.0,
             cwd: Path | None = None) -> subprocess.CompletedProcess:
    binary = require_binary(names)
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def promtool(*args: str | Path, timeout: float = 120.0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_tool(PROMTOOL, *args, timeout=timeout, cwd=cwd)


def amtool(*args: str | Path, timeout: float = 60.0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_tool(AMTOOL, *args, timeout=timeout, cwd=cwd)


# ---------------------------------------------------------------- live fabric (simulated cluster + Prometheus)

@dataclass
class LiveFabric:
    """A simulated cluster whose real agents Prometheus scrapes, paced at wall-clock speed.

    ``epoch`` is the wall time of simulated t=0, so every agent's sample time (``sim.now()``) is
    within a step of ``time.time()`` and Prometheus' scrape timestamps, windows and ``for:`` line
    up with the scenario's fault times (injection of a fault = ``epoch + fault.start``).
    """

    sim: Any
    prom: Prometheus
    engine: Any
    epoch: float
    probe_node: str
    stop_event: Any
    thread: Any
    watcher: Any
    errors: list = field(default_factory=list)
    http_api: Any = None  # the aggregator's HTTP API (scraped as job fabricmon-aggregator), if any

    def injected_at(self, fault) -> float:
        return self.epoch + fault.start

    def sim_t(self) -> float:
        return self.sim.t


def _rank_line(r) -> str:
    return json.dumps({"job": r.job, "rank": r.rank, "local_rank": r.local_rank, "step": r.step,
                       "step_seconds": r.step_seconds, "comm_seconds": r.comm_seconds, "ts": r.ts},
                      separators=(",", ":"))


def _nccl_line(rank: int, sn: int, now: float) -> str:
    """One NCCL Inspector v4.0 record (the format fabricmon/agent/nccl_inspector.py tails)."""
    return json.dumps({
        "header": {"id": "0x5eed", "rank": rank, "n_ranks": 8, "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.0", "dump_timestamp_us": int(now * 1e6),
                     "hostname": "probe", "pid": 1},
        "coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 1 << 26, "coll_exec_time_us": 2500.0,
                      "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 26.8, "coll_busbw_gbs": 47.0},
    }, separators=(",", ":")) + "\n"


def _write_probe_nvml(path: Path, n: int) -> None:
    """The probe's fake NVML: GPU 0 with what the simulator's NVML leaves out (PCIe replays, an XID;
    13 is a non-fatal graphics exception, so GPUXidFatal stays quiet).  Replaced atomically."""
    doc = {"gpus": [{"index": 0, "uuid": "GPU-probe-0", "name": "NVIDIA H100 80GB HBM3",
                     "pci_bus_id": "00000000:18:00.0",
                     "pcie_replay": n // 4, "xid": [13] * (1 + n // 30), "links": []}]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


@contextlib.contextmanager
def live_fabric(scenario: Any, workdir: Path, *, rule_files: Sequence[str | Path] = (),
                scrape_interval: str = "1s", evaluation_interval: str | None = None,
                aggregator: bool = True, probe: bool = True, deadline: float = 20.0,
                down_aggregator_replica: bool = False, alertmanagers: Sequence[str] = (),
                on_incidents: Callable[[list, float], None] | None = None) -> Iterator[LiveFabric]:
    """Start ``scenario`` in tree mode with HTTP agents, optionally the aggregator engine's HTTP API
    (fed the same batches) and a probe agent on the first node (host source, rank intake fed the
    synthetic job's timings, NCCL Inspector tail), and a real Prometheus scraping all of them with
    the deploy/README.md settings (honor_labels, `unit` target label, `cluster` external label).
    A background thread steps the simulation at 1 simulated second per wall second until the
    scenario ends or the context exits.

    ``down_aggregator_replica``: also list, under the aggregator's job, a replica that is down (a
    port nobody listens on).  The fault rules are the aggregator's fallback, silent while every
    aggregator target is up; one replica down brings them back, so a test can watch them fire
    while the live aggregator still serves its series to the dashboards.  ``alertmanagers``: where
    Prometheus sends its alerts.  ``on_incidents(changed, sample_now)``: called after every engine
    tick with the incidents that changed (to hand them to an AlertmanagerClient)."""
    import threading

    from fabricmon.agent.intake import RankIntake
    from fabricmon.agent.nccl_inspector import NcclInspectorSource
    from fabricmon.agent.runtime import build_agent
    from fabricmon.aggregator.engine import Engine
    from fabricmon.aggregator.http_api import HttpApi
    from fabricmon.config import AgentConfig
    from fabricmon.sim.drive import Drive, Pace
    from fabricmon.sim.runner import SimulatedCluster
    from fabricmon.sources.host import HostSource
    from fabricmon.sources.nvml.source import make_nvml_source

    require_binary(PROMETHEUS)
    workdir.mkdir(parents=True, exist_ok=True)
    epoch = time.time()
    sim = SimulatedCluster(scenario, mode="tree", interval=1.0, http=True, epoch=epoch)
    engine = http_api = probe_agent = None
    nccl_dir = workdir / "nccl"
    prom: Prometheus | None = None
    stop = threading.Event()
    thread: threading.Thread | None = None
    watcher: AlertWatcher | None = None
    errors: list[BaseException] = []
    try:
        sim.start()
        names = sim.cluster.names
        probe_node = names[0]
        if aggregator:
            engine = Engine(sim.topology, cluster=sim.topology.cluster)
        drive = Drive(sim, engine=engine)  # no engine: the simulator alone, its agents scraped
        drive.connect()
        if engine is not None:
            http_api = HttpApi(engine, ("127.0.0.1", 0))
            http_api.start()
        if probe:
            nccl_dir.mkdir(exist_ok=True)
            nvml_file = workdir / "probe-nvml.json"
            _write_probe_nvml(nvml_file, 0)
            intake = RankIntake(probe_node)
            cfg = AgentConfig(node_name=probe_node, nvml=f"fake:{nvml_file}", interval=1.0, listen="127.0.0.1:0")
            probe_agent = build_agent(cfg, sources=[HostSource(cfg.sources.host), intake, make_nvml_source(cfg.nvml),
                                                    NcclInspectorSource(str(nccl_dir), timeout=0.5)])
            probe_agent.start_http("127.0.0.1:0")
            probe_agent.start_polling()
            nccl_file = nccl_dir / "probe-pid1.log"
            sn = [0]

            def on_snapshot(name, snap, ranks) -> None:
                if name != probe_node:
                    return
                if ranks:
                    intake.submit_lines("\n".join(_rank_line(r) for r in ranks))
                sn[0] += 1
                _write_probe_nvml(nvml_file, sn[0])
                with open(nccl_file, "a") as fh:
                    fh.write("".join(_nccl_line(rank, sn[0], time.time()) for rank in range(8)))

            sim.on_snapshot = on_snapshot
        npu = scenario.cluster.nodes_per_unit
        statics = [{"targets": [f"127.0.0.1:{sim.tree_agents.http_ports[n]}"], "labels": {"unit": str(i // npu)}}
                   for i, n in enumerate(names)]
        if probe_agent is not None:
            statics.append({"targets": [f"127.0.0.1:{probe_agent.http.port}"], "labels": {"unit": "0"}})
        scrape = [{"job_name": "fabricmon-agent", "honor_labels": True, "static_configs": statics}]
        aggregators = ([f"127.0.0.1:{http_api.port}"] if http_api is not None else []) \
            + ([f"127.0.0.1:{free_port()}"] if down_aggregator_replica else [])
        if aggregators:
            scrape.append({"job_name": "fabricmon-aggregator", "honor_labels": True,
                           "static_configs": [{"targets": aggregators}]})
        config = prometheus_config(scrape_interval=scrape_interval,
                                   evaluation_interval=evaluation_interval or scrape_interval,
                                   rule_files=rule_files, external_labels={"cluster": sim.topology.cluster},
                                   extra_scrape_configs=scrape, alertmanagers=alertmanagers)
        prom = start_prometheus(workdir / "prometheus", config, deadline)
        watcher = AlertWatcher(prom).start()

        def on_step(_st, changed) -> None:
            if engine is not None and on_incidents is not None:
                on_incidents(changed, sim.now())

        def pump() -> None:
            try:
                # sample time epoch + t lands on wall time epoch + t
                drive.run(pace=Pace(1.0, origin=epoch, clock=time.time, lead=0.0), stop=stop, on_step=on_step)
            except BaseException as exc:  # surfaced by the caller through LiveFabric.errors
                errors.append(exc)

        thread = threading.Thread(target=pump, name="live-fabric-pump", daemon=True)
        thread.start()
        yield LiveFabric(sim, prom, engine, epoch, probe_node, stop, thread, watcher, errors, http_api)
    finally:
        stop.set()
        if watcher is not None:
            watcher.stop()
        if thread is not None:
            thread.join(timeout=10)
        if prom is not None:
            prom.stop()
        if probe_agent is not None:
            probe_agent.stop()
        if http_api is not None:
            http_api.stop()
        sim.close()


def parse_rfc3339(s: str) -> float:
    """Prometheus' RFC 3339 times (nanosecond fractions, Z or offset) as epoch seconds."""
    import datetime as dt

    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", s)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {s!r}")
    base = dt.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + (float("0." + m.group(2)) if m.group(2) else 0.0)


class AlertWatcher:
    """Polls a Prometheus' /api/v1/alerts in a thread and keeps, per (alertname, component), when the
    alert went pending (its ``activeAt``, exact to the evaluation) and when it was first seen firing
    (wall time of the poll that saw it: at most ``interval`` late)."""

    def __init__(self, prom: Prometheus, interval: float = 0.2) -> None:
        import threading

        self.prom = prom
        self.interval = interval
        self.active_at: dict[tuple[str, str], float] = {}
        self.firing_at: dict[tuple[str, str], float] = {}
        self.seen: dict[tuple[str, str], dict] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alert-watcher", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                alerts = self.prom.alerts()
            except (OSError, RuntimeError, ValueError) as exc:  # Prometheus stopping: keep the last state
                self.errors.append(str(exc))
                alerts = []
            now = time.time()
            with self._lock:
                for a in alerts:
                    key = (a["labels"]["alertname"], a["labels"].get("component", ""))
                    # Latest labels win, a firing instance's over a pending one: at Prometheus
                    # start an alert can evaluate once before the recording rule it joins has
                    # data, go pending without the joined labels, and be replaced a second later.
                    if a["state"] == "firing" or key not in self.firing_at:
                        self.seen[key] = a["labels"]
                    if key not in self.active_at and a.get("activeAt"):
                        self.active_at[key] = parse_rfc3339(a["activeAt"])
                    if a["state"] == "firing":
                        self.firing_at.setdefault(key, now)
            self._stop.wait(self.interval)

    def start(self) -> AlertWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def snapshot(self) -> tuple[dict, dict, dict]:
        with self._lock:
            return dict(self.active_at), dict(self.firing_at), dict(self.seen)


RULE_FILES = sorted((REPO / "deploy" / "prometheus").glob("*.rules.yml"))


def alert_for_seconds(rule_files: Sequence[Path] = RULE_FILES) -> dict[str, float]:
    """Each alert rule's ``for:`` in seconds."""
    out = {}
    for f in rule_files:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    d = r.get("for", "0s")
                    out[r["alert"]] = float(d[:-1]) * {"s": 1, "m": 60, "h": 3600}[d[-1]]
    return out
