"""A real Prometheus (Debian package) scrapes a running `fabricmon agent`; PromQL returns the fixture's values."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from support.promtools import free_port, running_prometheus, wait_until

pytestmark = pytest.mark.integration


def _file_int(path: Path) -> int:
    return int(path.read_text().strip())


@pytest.fixture
def running_agent(make_fixture, tmp_path):
    root = make_fixture(layout="ib", fault="flaky_cable", fresh=True)
    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"intake:\n  listen: null\n  socket: {tmp_path / 'ranks.sock'}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricmon", "--log-format", "json", "agent", "--config", str(cfg),
         "--sysfs-root", str(root / "sys"), "--ethtool-dir", str(root / "ethtool"),
         "--nvml", f"fake:{root / 'nvml.json'}", "--listen", f"127.0.0.1:{port}", "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def ready():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                return r.status == 200
        wait_until(lambda: _try(ready), 15.0, "agent /readyz")
        yield root, port, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode not in (0, -15):
            pytest.fail(f"agent exited {proc.returncode}: {proc.stderr.read()[-2000:]}")


def _try(fn):
    try:
        return fn()
    except OSError:
        return False


def test_prometheus_scrapes_agent_and_promql_matches_fixture(running_agent, tmp_path):
    root, port, _ = running_agent
    manifest = json.loads((root / "fixture.json").read_text())
    dev = manifest["fault_device"]
    ports_dir = root / "sys" / "class" / "infiniband" / dev / "ports" / "1" / "counters"
    with running_prometheus(tmp_path / "prom", scrape_targets=[f"127.0.0.1:{port}"]) as prom:
        res = prom.wait_for_query(
            f'fabricmon_ib_port_errors_total{{device="{dev}",counter="symbol_error"}}', deadline=20.0)
        assert len(res) == 1
        assert res[0]["metric"]["node"] == manifest["node"]
        assert float(res[0]["value"][1]) == _file_int(ports_dir / "symbol_error")
        res = prom.wait_for_query(f'fabricmon_ib_port_receive_bytes_total{{device="{dev}"}}')
        assert float(res[0]["value"][1]) == _file_int(ports_dir / "port_rcv_data") * 4
        # A join through the info metric, as the recording rules and dashboards do it.
        res = prom.wait_for_query(
            f'fabricmon_ib_port_rate_bytes_per_second * on(node, device, port) group_left(rail) '
            f'fabricmon_ib_port_info{{device="{dev}"}}')
        assert res[0]["metric"]["rail"] == str(manifest["devices"][int(dev.split("_")[1])]["rail"])
        assert float(res[0]["value"][1]) == 400e9 / 8
        ups = prom.wait_for_query("fabricmon_collector_up")
        assert {r["metric"]["collector"]: r["value"][1] for r in ups}["infiniband"] == "1"
        targets = prom.wait_for_query('up{job="fabricmon-agent"}')
        assert targets[0]["value"][1] == "1"
