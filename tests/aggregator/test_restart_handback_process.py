"""A real week's restarts page nobody for nothing (issue 36), with every part real on 127.0.0.1: two
``fabricmon agent`` processes on simulated node trees (fabricmon.sim; only the hardware is simulated), a
``fabricmon aggregator`` process with a state file, a real Alertmanager posting to a webhook, and a real
Prometheus scraping both agents and the aggregator with the shipped rule files (deploy/prometheus,
unmodified: the fallback rules fire while the aggregator is down, `for: 15s`).

Restart: two ports of node-001 go down and page; the aggregator is killed (SIGKILL: nothing resolved);
port A comes back while it is down, port B stays down and the Prometheus fallback fires for it; the
aggregator restarts from its state file.  A: no firing again, resolved once.  B: no "resolved" in any
notification while it is still down: neither from the aggregator nor from the fallback at hand-back.

Boot, meanwhile: node-000 reboots as the aggregator comes back (its host root's /proc/stat says btime =
now, the format proc(5) documents) and every IB port waits in INIT with physical LinkUp for 25 s for the
subnet manager: no incident, no page from either sender (before: FabricLinkDown critical within a second).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree
from support.agentrig import http_get
from support.amrig import Webhook
from support.net import free_port
from support.procrig import Proc, metrics, short_dir
from support.promtools import RULE_FILES, prometheus_config, running_alertmanager, running_prometheus
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
pytest.importorskip("numpy", reason="the aggregator needs numpy (fabricmon[aggregator])")

SPEC = ClusterSpec(2, "ib", 2, seed=7)
BOOT_INIT_S = 25.0


def _am_config(url: str) -> dict:
    # the shipped route's grouping; notifications at once (any second firing or resolved shows)
    return {"route": {"receiver": "hook", "group_by": ["cluster", "alertname", "leaf", "rail", "component"],
                      "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": url, "send_resolved": True}]}]}


def _ports(tree: NodeTree) -> dict[str, Path]:
    """device -> its port directory (sys/class/infiniband/<dev>/ports/1, as the tree renders it)."""
    return {p.parent.parent.name: p for p in sorted(Path(tree.sys).glob("devices/**/infiniband/*/ports/1"))}


def _set(port: Path, state: str, phys: str) -> None:
    # sysfs spelling: "2: INIT", "5: LinkUp" (drivers/infiniband/core/sysfs.c)
    for name, text in (("state", state), ("phys_state", phys)):
        tmp = port / f".{name}.tmp"
        tmp.write_text(text + "\n")
        tmp.replace(port / name)


def _host_root(tmp: Path, boot: float) -> Path:
    """A host root whose /proc/stat says the node booted at ``boot`` (the rest of it this machine's)."""
    proc = tmp / "proc"
    proc.mkdir(parents=True)
    lines = [ln for ln in Path("/proc/stat").read_text().splitlines() if not ln.startswith("btime ")]
    (proc / "stat").write_text("\n".join([*lines, f"btime {int(boot)}"]) + "\n")
    for name in ("loadavg", "meminfo"):
        (proc / name).write_text(Path("/proc", name).read_text())
    return tmp


def _notes(hook: Webhook, component: str) -> list[tuple[str, str]]:
    """(status, sender) of every notified alert on ``component`` (sender: prometheus or aggregator)."""
    return [(a["status"], a["labels"].get("sender", "aggregator")) for a in hook.alerts()
            if a["labels"].get("component") == component]


def _incidents(port: int) -> list[dict]:
    code, body = http_get(f"http://127.0.0.1:{port}/api/incidents")
    return json.loads(body) if code == 200 else []


def _value(text: str, name: str) -> float | None:
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    return None


def test_a_booting_node_and_two_restarts_page_only_what_is_there(tmp_path):
    sim = ClusterState(Scenario(SPEC, 3600))
    sim.advance(1.0)
    trees = [NodeTree(sim, i, tmp_path / f"node{i}") for i in range(2)]
    for t in trees:
        t.render()
    booting, other = trees
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump({
        "cluster": "rig", "layout": SPEC.layout, "nodes_per_unit": SPEC.nodes_per_unit,
        "generate": {"nodes": SPEC.nodes, "gpus_per_node": NGPU, "rails": NRAILS}}))
    grpc, http = free_port(), free_port()
    hook = Webhook()
    procs: list[Proc] = []
    socks = short_dir()
    try:
        with running_alertmanager(_am_config(hook.url), tmp_path / "am") as am:
            agg_cfg = tmp_path / "aggregator.yaml"
            agg_cfg.write_text(yaml.safe_dump({
                "topology": str(tmp_path / "topology.yaml"), "grpc_listen": f"127.0.0.1:{grpc}",
                "http_listen": f"127.0.0.1:{http}", "tick_seconds": 0.2, "auth": {"insecure": True},
                "alertmanager": {"urls": [am.url]}, "state_file": str(tmp_path / "state" / "incidents.json"),
                # a 2 s state hold (default 10 s): A resolves sooner after the restart, the test runs shorter
                "detection": {"state_hold_s": 2.0}}))

            def start_aggregator(n: int) -> Proc:
                p = Proc(["aggregator", "--config", str(agg_cfg), "--log-format", "json"], tmp_path / f"agg{n}.log")
                assert p.wait_log("aggregator_started"), p.text()[-3000:]
                return p

            agg = start_aggregator(1)
            procs.append(agg)
            listen = {t.name: free_port() for t in trees}

            def start_agent(t: NodeTree, boot: float | None = None) -> Proc:
                cfg = {"sysfs_root": t.sys, "ethtool_dir": t.ethtool_dir, "node_name": t.name,
                       "nvml": f"fake:{t.nvml_file}", "listen": f"127.0.0.1:{listen[t.name]}", "interval": 0.2,
                       "aggregator": f"127.0.0.1:{grpc}", "stream": {"spool_dir": str(tmp_path / f"spool-{t.name}")},
                       "intake": {"listen": None, "socket": f"{socks}/{t.name}.sock"}, "log": {"format": "json"}}
                if boot is not None:
                    cfg["host_root"] = str(_host_root(tmp_path / f"host-{t.name}-{int(boot)}", boot))
                (tmp_path / f"{t.name}.yaml").write_text(yaml.safe_dump(cfg))
                p = Proc(["agent", "--config", str(tmp_path / f"{t.name}.yaml")],
                         tmp_path / f"{t.name}-{len(procs)}.log")
                procs.append(p)
                return p

            first_life = start_agent(booting)
            start_agent(other)
            aggregator_job = {"job_name": "fabricmon-aggregator",
                              "static_configs": [{"targets": [f"127.0.0.1:{http}"]}]}
            prom_cfg = prometheus_config([f"127.0.0.1:{p}" for p in listen.values()], rule_files=RULE_FILES,
                                         alertmanagers=[am.address], extra_scrape_configs=[aggregator_job])
            with running_prometheus(tmp_path / "prom", prom_cfg) as prom:
                assert wait_until(lambda: _value(metrics(http), "fabricmon_agents_connected") == 2, 20), \
                    agg.text()[-3000:]
                prom.wait_for_query('fabricmon_ib_port_state{node="node-001"} == 4', 20)

                # --- two ports of node-001 go down and page; the aggregator is killed ---------------------------
                ports = _ports(other)
                dev_a, dev_b = sorted(ports)[:2]
                comp_a, comp_b = f"node-001/{dev_a}/1", f"node-001/{dev_b}/1"
                for d in (dev_a, dev_b):
                    _set(ports[d], "1: DOWN", "2: Polling")
                assert wait_until(lambda: _notes(hook, comp_a) == [("firing", "aggregator")]
                                  and _notes(hook, comp_b) == [("firing", "aggregator")], 20), hook.alerts()
                wait_until(lambda: (tmp_path / "state" / "incidents.json").exists(), 5)
                agg.p.send_signal(signal.SIGKILL)
                agg.p.wait(10)
                _set(ports[dev_a], "4: ACTIVE", "5: LinkUp")  # A clears while the aggregator is down
                # the fallback takes over B (its own alert, grouped with the aggregator's: still firing)
                assert wait_until(lambda: any(a["labels"].get("component") == comp_b and a["state"] == "firing"
                                              for a in prom.alerts()), 45), prom.alerts()
                assert _notes(hook, comp_a) == [("firing", "aggregator")]

                # --- node-000 reboots as the aggregator comes back: every port INIT (LinkUp) for 25 s ---------
                first_life.stop()
                for port in _ports(booting).values():
                    _set(port, "2: INIT", "5: LinkUp")
                booted_at = time.time()
                start_agent(booting, boot=booted_at)
                agg = start_aggregator(2)
                procs.append(agg)
                # A: resolved once, never fired again; B: the aggregator's alert back, the fallback's kept
                assert wait_until(lambda: ("resolved", "aggregator") in _notes(hook, comp_a), 40), \
                    (_notes(hook, comp_a), agg.text()[-3000:])
                assert wait_until(lambda: _value(metrics(http), "fabricmon_aggregator_resuming") == 0, 20)
                prom.wait_for_query('fabricmon_aggregator_resuming == 0', 10)
                prom.wait_for_query('fabricmon_ib_port_state{node="node-000"} == 2', 10)
                wait_until(lambda: time.time() - booted_at >= BOOT_INIT_S, BOOT_INIT_S + 5)
                for port in _ports(booting).values():  # the subnet manager swept: ACTIVE
                    _set(port, "4: ACTIVE", "5: LinkUp")
                prom.wait_for_query('min(fabricmon_ib_port_state{node="node-000"}) == 4', 10)
                time.sleep(3.0)  # a late firing or resolve would reach the webhook within 1-2 s

                assert _notes(hook, comp_a) == [("firing", "aggregator"), ("resolved", "aggregator")]
                assert all(status == "firing" for status, _ in _notes(hook, comp_b)), _notes(hook, comp_b)
                assert any(a["labels"].get("component") == comp_b and a["state"] == "firing"
                           for a in prom.alerts())  # the fallback's alert lasts while B is down
                open_b = [i for i in _incidents(http) if i["component"] == comp_b and i["resolved_at"] is None]
                assert len(open_b) == 1, _incidents(http)
                # the rebooted node: no incident, no page, from either sender
                assert [i for i in _incidents(http) if i["labels"].get("node") == "node-000"] == []
                assert [a for a in hook.alerts() if a["labels"].get("node") == "node-000"] == []
                assert [a for a in prom.alerts() if a["labels"].get("node") == "node-000"] == []
    finally:
        for p in reversed(procs):
            p.stop()
        hook.close()
        import shutil

        shutil.rmtree(socks, ignore_errors=True)
