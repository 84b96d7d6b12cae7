"""The aggregator as the service runs it (``run_aggregator``: its config file, the reload event
SIGHUP sets, real gRPC and HTTP on 127.0.0.1) in a thread, and agents as real ``StreamClient``s:
for the reload, rotation and revocation tests.  Everything is read back over HTTP."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.config import check_files, load_aggregator_config
from fabricmon.aggregator.service import run_aggregator
from fabricmon.batch import NodeHello
from fabricmon.model import CounterDelta, Snapshot
from fabricmon.topology import rail_nics
from support.net import free_port  # noqa: F401 (re-exported)
from support.waiting import wait_until


def topology_doc(nodes: dict[str, int], cluster: str = "rig") -> dict:
    """An explicit node list (name -> unit), two GPUs and two rails each."""
    nics = [{"device": n.device, "rail": n.rail, "gpu": n.gpu} for n in rail_nics(2, 2)]
    return {"cluster": cluster, "layout": "roce", "nodes_per_unit": 4,
            "nodes": [{"name": name, "unit": unit, "gpus": 2, "nics": nics} for name, unit in nodes.items()]}


def link_errors(device: str = "mlx5_0") -> tuple[CounterDelta, ...]:
    lab = (("device", device), ("port", "1"))
    return (CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "symbol_error"),), 2000.0),
            CounterDelta("fabricmon_ib_port_errors_total", lab + (("counter", "port_rcv_errors"),), 20.0))


class Aggregator:
    """``run_aggregator`` in a thread; ``hup()`` does what the SIGHUP handler does and waits."""

    def __init__(self, tmp: Path, auth: dict, *, topology: dict | str | None = None, extra: dict | None = None) -> None:
        """``topology``: a document, or the file's text."""
        self.topology = tmp / "topology.yaml"
        self.topology.write_text(topology if isinstance(topology, str) else yaml.safe_dump(topology or {
            "cluster": "rig", "layout": "roce", "nodes_per_unit": 4,
            "generate": {"nodes": 4, "gpus_per_node": 2, "rails": 2}}))
        self.grpc, self.http = free_port(), free_port()
        self.path = tmp / "aggregator.yaml"
        self.path.write_text(yaml.safe_dump({
            "topology": str(self.topology), "grpc_listen": f"127.0.0.1:{self.grpc}",
            "http_listen": f"127.0.0.1:{self.http}", "tick_seconds": 0.05, "auth": auth, **(extra or {})}))
        self.stop_event, self.reload = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=run_aggregator, daemon=True, args=(self._load(), self.stop_event),
                                       # reloads here come from hup() only, so a test knows which run it
                                       # waits for; the file watch is tested on processes (test_token_watch)
                                       kwargs={"reload": self.reload, "load": self._load, "watch_period": 0})
        self.thread.start()
        assert wait_until(lambda: "fabricmon_ticks_total" in self.metrics(), 60)

    def _load(self):
        cfg = load_aggregator_config(self.path)
        check_files(cfg, str(self.path), parse_topology=False)
        return cfg

    def get(self, path: str) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def metrics(self) -> str:
        return self.get("/metrics")

    def incidents(self, state: str = "all") -> list[dict]:
        body = self.get(f"/api/incidents?state={state}")
        return json.loads(body) if body else []

    def value(self, line: str) -> float | None:
        for ln in self.metrics().splitlines():
            if ln.startswith(line + " "):
                return float(ln.split()[-1])
        return None

    def reloads(self) -> tuple:
        """Moves with every finished reload (the success time alone would miss two failures)."""
        return (sum(self.value(f'fabricmon_config_reloads_total{{result="{r}"}}') or 0 for r in ("success", "failure")),
                self.value("fabricmon_config_last_reload_success_timestamp_seconds"))

    def hup(self, timeout: float = 10.0) -> bool:
        """Reload as SIGHUP asks for it; wait until it finished; whether it succeeded."""
        before = self.reloads()
        self.reload.set()
        assert wait_until(lambda: self.reloads() != before, timeout), self.metrics()
        return self.value("fabricmon_config_last_reload_successful") == 1.0

    def revoked(self) -> float:
        return self.value('fabricmon_grpc_streams_refused_total{reason="revoked"}') or 0.0

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(20)


class Agent:
    """One node's stream client; ``token`` goes to its own token file (the last line is presented)."""

    def __init__(self, tmp: Path, agg: Aggregator, node: str, token: str | None = None, *, tls=None,
                 interval: float = 1.0) -> None:
        self.node = node
        self.token_file = None
        if token is not None:
            self.token_file = tmp / f"{node}.token"
            self.token_file.write_text(token + "\n")
        hello = NodeHello(node, "test", interval)
        self.client = StreamClient(f"127.0.0.1:{agg.grpc}", node, lambda: hello, MemorySpool(),
                                   token_file=str(self.token_file) if self.token_file else None, tls=tls,
                                   backoff_min=0.05, backoff_max=0.2, hello_timeout=3.0).start()
        self.seq = 0

    def connects(self) -> int:
        return self.client.stats()["connects_total"]

    def send(self, deltas=()) -> None:
        self.seq += 1
        self.client.offer(Snapshot(node=self.node, ts=time.time(), seq=self.seq, samples=(), deltas=tuple(deltas),
                                   interval_seconds=0.2, sources=()))

    def stop(self) -> None:
        self.client.stop(2.0)


class Rig:
    """Made objects, closed in reverse at the end of the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.made: list = []

    def __call__(self, kind, *args, **kw):
        obj = kind(self.tmp, *args, **kw)
        self.made.append(obj)
        return obj

    def close(self) -> None:
        for obj in reversed(self.made):
            obj.stop() if isinstance(obj, Agent) else obj.close()
