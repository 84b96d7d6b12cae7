"""The aggregator never dies from its own state or from Alertmanager's answers at start (issue 35
items 6, 7, 8), each through a real ``fabricmon aggregator`` process:

- a save that fails (a directory where state_file goes) is counted and the alert of that change is
  still sent; check-config refuses a state_file that is a directory;
- reconcile at start against an Alertmanager answering ``null``, a list-valued label, or 200 and then
  a byte at a time: the listeners start within the reconcile's bound;
- a state_file with a record of the wrong type, or nested deeper than json recurses: the bad record
  (or file) is skipped, the good ones resumed, the process serves.

The Alertmanager here is support.badam's, which misbehaves on purpose (a real one cannot be made to);
the alerts it receives are recorded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from support.aggrig import Agent, link_errors
from support.badam import FakeAlertmanager
from support.procrig import Proc, free_port, metrics, topology_yaml, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(sys.platform != "linux", reason="POSIX processes")]
pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

LINK = "node-001/mlx5_1/1"
RECORD = {"id": "FabricLinkDown-r1", "alertname": "FabricLinkDown", "severity": "critical", "component_type": "link",
          "component": LINK, "labels": {"node": "node-001"}, "evidence": ["state down"], "first_seen": 1.0,
          "last_seen": 2.0, "ranks": [], "jobs": [], "description": "", "related_to": "", "absorbed": [],
          "version": 1, "hold_s": 15.0, "sent": None}


def _config(tmp: Path, state_file: Path, am: FakeAlertmanager) -> tuple[Path, int, int]:
    g, h = free_port(), free_port()
    path = tmp / "aggregator.yaml"
    path.write_text(yaml.safe_dump({
        "topology": str(topology_yaml(tmp / "topology.yaml")), "grpc_listen": f"127.0.0.1:{g}",
        "http_listen": f"127.0.0.1:{h}", "tick_seconds": 0.1, "auth": {"insecure": True},
        "state_file": str(state_file), "alertmanager": {"urls": [am.url], "timeout": 1.0}}))
    return path, g, h


def _value(body: str, name: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


@pytest.fixture
def am_factory():
    made: list[FakeAlertmanager] = []

    def make(mode: str = "empty") -> FakeAlertmanager:
        made.append(FakeAlertmanager(mode, list_label_component=LINK))
        return made[-1]

    yield make
    for am in made:
        am.close()


def test_a_failing_save_is_counted_and_the_alert_still_sent(tmp_path, am_factory):
    am = am_factory()
    state = tmp_path / "state" / "incidents.json"
    state.parent.mkdir()
    cfg, grpc, http = _config(tmp_path, state, am)
    # check-config refuses a state_file that is a directory, naming the field
    state.mkdir()
    out = subprocess.run([sys.executable, "-m", "fabricmon", "check-config", str(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "state_file" in out.stderr and "directory" in out.stderr, out.stderr
    state.rmdir()
    agg = Proc(["aggregator", "--config", str(cfg), "--log-format", "json"], tmp_path / "agg.log")
    agent = None
    try:
        assert agg.wait_log("aggregator_started"), agg.text()
        state.mkdir()  # now every save fails: the rename onto it is refused (even for root)
        agent = Agent(tmp_path, types.SimpleNamespace(grpc=grpc), "node-000", interval=0.2)
        for _ in range(100):
            agent.send(link_errors("mlx5_0"))
            if wait_until(lambda: any(a["labels"].get("alertname") == "FabricLinkErrors" for a in am.posted), 0.2):
                break
        assert any(a["labels"].get("component") == "node-000/mlx5_0/1" for a in am.posted), agg.text()[-3000:]
        assert wait_until(lambda: (_value(metrics(http), "fabricmon_state_save_failures_total") or 0) >= 1, 10)
        assert agg.alive(), agg.text()[-3000:]
        assert agg.wait_log("incident_state_save_failed", timeout=10), agg.text()[-2000:]
        state.rmdir()  # the disk is back: the next change is saved
        for _ in range(100):
            agent.send(link_errors("mlx5_1"))
            if wait_until(lambda: state.is_file() and "node-000/mlx5_1/1" in state.read_text(), 0.2):
                break
        assert state.is_file() and "node-000/mlx5_1/1" in state.read_text(), agg.text()[-2000:]
        assert agg.wait_log("incident_state_save_recovered", timeout=10), agg.text()[-2000:]
    finally:
        if agent is not None:
            agent.stop()
        agg.stop()


@pytest.mark.parametrize("mode", ["null", "list_label", "drip"])
def test_reconcile_against_a_misbehaving_alertmanager_starts_the_listeners(tmp_path, am_factory, mode):
    am = am_factory(mode)
    state = tmp_path / "incidents.json"
    state.write_text(json.dumps({"schema": 1, "incidents": [RECORD]}))
    cfg, _, http = _config(tmp_path, state, am)
    t0 = time.monotonic()
    agg = Proc(["aggregator", "--config", str(cfg), "--log-format", "json"], tmp_path / "agg.log")
    try:
        # the reconcile is bounded by the Alertmanager timeout (1 s) per URL; the rest is the start itself
        assert agg.wait_log("aggregator_started", timeout=30), agg.text()[-3000:]
        assert agg.alive() and am.gets >= 1
        assert wait_until(lambda: "fabricmon_ticks_total" in metrics(http), 10)
        assert "alertmanager_reconcile_failed" in agg.text() or mode == "list_label"
        assert time.monotonic() - t0 < 30
    finally:
        agg.stop()


def test_a_damaged_state_file_skips_the_bad_record_not_the_file(tmp_path, am_factory):
    am = am_factory()
    state = tmp_path / "incidents.json"
    bad = {**RECORD, "id": "FabricLinkDown-r2", "component": "node-000/mlx5_2/1", "hold_s": "10"}
    state.write_text(json.dumps({"schema": 1, "incidents": [bad, RECORD]}))
    cfg, _, http = _config(tmp_path, state, am)
    agg = Proc(["aggregator", "--config", str(cfg), "--log-format", "json"], tmp_path / "agg.log")
    try:
        assert agg.wait_log("aggregator_started"), agg.text()[-3000:]
        body = metrics(http)
        assert _value(body, "fabricmon_state_records_skipped_total") == 1.0, body
        assert 'incidents[0].hold_s: expected a finite number >= 0' in agg.text()
        code = json.loads(urlopen_text(f"http://127.0.0.1:{http}/api/incidents?state=open"))
        assert [i["id"] for i in code] == ["FabricLinkDown-r1"]
    finally:
        agg.stop()
    # nested past what json recurses: the file is named unusable and the aggregator starts empty
    state.write_text('{"schema": 1, "incidents": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    agg = Proc(["aggregator", "--config", str(cfg), "--log-format", "json"], tmp_path / "agg2.log")
    try:
        assert agg.wait_log("aggregator_started"), agg.text()[-3000:]
        assert "incident_state_unusable" in agg.text() and "nested too deep" in agg.text()
    finally:
        agg.stop()


def urlopen_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()
