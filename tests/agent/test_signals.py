"""SIGHUP (the units' ExecReload) reloads the config of a running ``fabricmon agent`` and
``fabricmon aggregator``, or refuses it with a log line; it never ends the process.

Real processes, real gRPC stream and HTTP over 127.0.0.1; only the node's hardware is a
simulated tree.  Each wait is on a log line or a /metrics answer, with a deadline.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys

import pytest
import yaml

from support.procrig import Proc, agent_config, free_port, metrics, render_node, short_dir, topology_yaml, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX signals and Unix sockets")


def _value(body: str, pattern: str) -> float | None:
    m = re.search(rf"^{pattern} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture
def rig(tmp_path):
    tree = render_node(tmp_path / "node")
    sockdir = short_dir()
    topo = topology_yaml(tmp_path / "topology.yaml")
    gport, hport, aport = free_port(), free_port(), free_port()
    agg_cfg = {"topology": str(topo), "grpc_listen": f"127.0.0.1:{gport}", "http_listen": f"127.0.0.1:{hport}",
               "tick_seconds": 0.1, "auth": {"insecure": True}, "detection": {"hold_s": 15.0}}
    agg_path = tmp_path / "aggregator.yaml"
    agg_path.write_text(yaml.safe_dump(agg_cfg))
    sock = os.path.join(sockdir, "ranks.sock")
    a_cfg = agent_config(tree, listen=f"127.0.0.1:{aport}", aggregator=f"127.0.0.1:{gport}",
                         spool=tmp_path / "spool", sock=sock)
    a_path = tmp_path / "agent.yaml"
    a_path.write_text(yaml.safe_dump(a_cfg))
    procs: list[Proc] = []
    yield {"tmp": tmp_path, "agg_cfg": agg_cfg, "agg_path": agg_path, "a_cfg": a_cfg, "a_path": a_path,
           "hport": hport, "aport": aport, "sock": sock, "procs": procs}
    for p in procs:
        p.stop()
    shutil.rmtree(sockdir, ignore_errors=True)


def test_sighup_reloads_agent_and_aggregator_and_keeps_the_stream(rig) -> None:
    tmp = rig["tmp"]
    # The units' command line: global flags after the subcommand ($FABRICMON_ARGS).
    agg = Proc(["aggregator", "--config", str(rig["agg_path"]), "--log-format", "json"], tmp / "agg.log")
    rig["procs"].append(agg)
    assert agg.wait_log("aggregator_started"), agg.text()
    agent = Proc(["agent", "--config", str(rig["a_path"]), "--log-format", "json"], tmp / "agent.log")
    rig["procs"].append(agent)
    hport, aport = rig["hport"], rig["aport"]

    def connected() -> bool:
        return _value(metrics(hport), "fabricmon_agents_connected") == 1

    assert wait_until(connected, 30), agent.text()
    assert wait_until(lambda: 'collector="ethtool"' in metrics(aport), 20), agent.text()
    assert stat.S_IMODE(os.stat(rig["sock"]).st_mode) == 0o666  # intake.socket_mode default
    streams = _value(metrics(hport), "fabricmon_grpc_streams_total")
    assert streams == 1

    # Agent: a source switched off and the log level changed take effect on SIGHUP.
    cfg = dict(rig["a_cfg"], sources={"ethtool": {"enabled": False}}, log={"format": "json", "level": "debug"})
    rig["a_path"].write_text(yaml.safe_dump(cfg))
    agent.hup()
    assert agent.wait_log('"config_reloaded"'), agent.text()
    assert agent.alive()
    assert wait_until(lambda: 'collector="ethtool"' not in metrics(aport) and
                      "fabricmon_config_last_reload_successful 1.0" in metrics(aport), 20), metrics(aport)
    line = next(ln for ln in agent.text().splitlines() if '"config_reloaded"' in ln)
    assert '"sources"' in line and '"log"' in line and '"debug"' in line
    # Aggregator: a detection threshold.
    rig["agg_path"].write_text(yaml.safe_dump(dict(rig["agg_cfg"], detection={"hold_s": 30.0})))
    agg.hup()
    assert agg.wait_log('"config_reloaded"'), agg.text()
    assert "detection.hold_s" in agg.text()
    assert agg.alive()

    # An invalid file: refused with one log line, both keep running on the config they had.
    rig["a_path"].write_text(yaml.safe_dump(dict(cfg, interval=-1)))
    agent.hup()
    assert agent.wait_log('"config_reload_failed"'), agent.text()
    rig["agg_path"].write_text("detection: {hold_s: -1}\n")
    agg.hup()
    assert agg.wait_log('"config_reload_failed"'), agg.text()
    # A change only a restart can apply is refused the same way.
    rig["a_path"].write_text(yaml.safe_dump(dict(cfg, listen=f"127.0.0.1:{free_port()}")))
    agent.hup()
    assert agent.wait_log('"config_reload_failed"', count=2), agent.text()
    assert "listen changed: needs a restart" in agent.text()

    assert agent.alive() and agg.alive()
    assert wait_until(lambda: "fabricmon_config_last_reload_successful 0.0" in metrics(aport), 10)
    assert wait_until(lambda: "fabricmon_config_last_reload_successful 0.0" in metrics(hport), 10)
    body = metrics(aport)
    assert 'collector="ethtool"' not in body and 'collector="infiniband"' in body  # still the reloaded config
    assert os.path.exists(rig["sock"])
    # The stream was never dropped: still one stream opened, still connected.
    assert _value(metrics(hport), "fabricmon_grpc_streams_total") == streams
    assert connected()

    assert agent.stop() == 0
    assert not os.path.exists(rig["sock"])  # removed on a clean stop
    assert agg.stop() == 0
