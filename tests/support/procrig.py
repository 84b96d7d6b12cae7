"""Real ``fabricmon agent`` and ``fabricmon aggregator`` processes over 127.0.0.1, for the signal,
flag and start-error tests.  Only the hardware is simulated: one node tree rendered by
``fabricmon.sim`` (static: these tests look at the processes, not at counters moving)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree
from support.agentrig import http_get
from support.net import free_port
from support.paths import REPO
from support.waiting import wait_until


def render_node(root: Path) -> NodeTree:
    spec = ClusterSpec(2, "roce", 2, seed=7)
    cluster = ClusterState(Scenario(spec, 3600))
    tree = NodeTree(cluster, 0, root)
    cluster.advance(1.0)
    tree.render()
    return tree


def topology_yaml(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"cluster": "rig", "layout": "roce", "nodes_per_unit": 2,
                                    "generate": {"nodes": 2, "gpus_per_node": NGPU, "rails": NRAILS}}))
    return path


def agent_config(tree: NodeTree, *, listen: str, aggregator: str | None, spool: Path, sock: str,
                 level: str = "info", ethtool: bool = True) -> dict:
    return {
        "sysfs_root": str(tree.sys), "ethtool_dir": str(tree.ethtool_dir), "node_name": tree.name,
        "nvml": f"fake:{tree.nvml_file}", "listen": listen, "interval": 0.2, "aggregator": aggregator,
        "sources": {"ethtool": {"enabled": ethtool}},
        "stream": {"spool_dir": str(spool)},
        "intake": {"listen": None, "socket": sock},
        "log": {"format": "json", "level": level},
    }


def short_dir() -> str:
    """A directory whose path fits in a Unix socket address (108 bytes), removed by the caller."""
    return tempfile.mkdtemp(prefix="fm-")


class Proc:
    """A fabricmon subprocess whose stderr (the JSON log) goes to a file the test can wait on."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None) -> None:
        self.log = log
        self._fh = open(log, "wb")
        self.p = subprocess.Popen([sys.executable, "-m", "fabricmon", *args], stdout=subprocess.DEVNULL,
                                  stderr=self._fh, cwd=REPO, env={**os.environ, **(env or {})})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 20.0, count: int = 1) -> bool:
        return wait_until(lambda: self.text().count(needle) >= count or self.p.poll() is not None, timeout) \
            and self.text().count(needle) >= count

    def alive(self) -> bool:
        return self.p.poll() is None

    def hup(self) -> None:
        self.p.send_signal(signal.SIGHUP)

    def stop(self, timeout: float = 20.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._fh.close()
        return self.p.returncode


def metrics(port: int) -> str:
    code, body = http_get(f"http://127.0.0.1:{port}/metrics")
    return body.decode(errors="replace") if code == 200 else ""


def busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


__all__ = ["Proc", "agent_config", "busy_port", "free_port", "metrics", "render_node", "short_dir",
           "topology_yaml", "wait_until"]
