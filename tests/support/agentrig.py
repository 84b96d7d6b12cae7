"""A live agent on a simulated node tree, a real aggregator that can go down and come back,
and hostile clients, for the agent's reliability tests (supervision, hostile inputs, soak).

Everything real over 127.0.0.1: the agent as ``fabricmon agent`` wires it
(``wiring.build_live_agent``: sources, rank intake, stream, disk spool), the
aggregator's gRPC server, Engine and HTTP API.  Only the hardware is simulated
(``fabricmon.sim`` renders the node's sysfs/ethtool/NVML tree).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.wiring import build_live_agent
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.http_api import HttpApi
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.config import IntakeConfig, StreamConfig
from fabricmon.sim.agents import sim_agent_config
from fabricmon.sim.cluster import ClusterState
from fabricmon.sim.hw import NGPU, NRAILS
from fabricmon.sim.scenario import ClusterSpec, Scenario
from fabricmon.sim.tree import NodeTree
from fabricmon.topology import generate_topology
from support.net import free_port  # noqa: F401 (re-exported for the rigs' users)
from support.waiting import wait_until  # noqa: F401


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def parse_metrics(body: bytes) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition; raises if prometheus_client's parser refuses it."""
    out: dict[tuple[str, frozenset], float] = {}
    for fam in text_string_to_metric_families(body.decode("utf-8")):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    for (n, labs), v in samples.items():
        if n == name and want <= set(labs):
            return v
    return None


class SimNode:
    """One simulated node's tree, advanced (1 s of simulated time per step) by a background thread."""

    def __init__(self, root: Path, step_every: float = 0.25) -> None:
        self.spec = ClusterSpec(2, "roce", 2, seed=7)
        self.cluster = ClusterState(Scenario(self.spec, 3600))
        self.tree = NodeTree(self.cluster, 0, root)
        self.cluster.advance(1.0)
        self.tree.render()
        self.topology = generate_topology(self.spec.nodes, layout=self.spec.layout,
                                          nodes_per_unit=self.spec.nodes_per_unit, rails=NRAILS,
                                          gpus_per_node=NGPU, cluster="rig")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(step_every,), name="sim-node", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self.tree.name

    def _run(self, every: float) -> None:
        steps = 0
        while not self._stop.wait(every) and steps < 100_000:
            self.cluster.advance(1.0)
            self.tree.render()
            steps += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


class RecordingEngine:
    """The real Engine; records the seq of every batch it ingests, per aggregator life."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.lock = threading.Lock()
        self.lives: list[list[int]] = [[]]

    def new_life(self) -> None:
        with self.lock:
            self.lives.append([])

    def ingest(self, batch) -> None:
        with self.lock:
            self.lives[-1].append(batch.seq)
        self._engine.ingest(batch)

    def seqs(self) -> list[int]:
        with self.lock:
            return [s for life in self.lives for s in life]

    def __getattr__(self, name):
        return getattr(self._engine, name)


class Aggregator:
    """A real aggregator (gRPC server + Engine + HTTP /metrics) on fixed ports, stoppable and
    restartable: each start is a new aggregator process's worth of state but the same Engine
    recorder, so a test sees every seq ever ingested."""

    def __init__(self, topology) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.topology = topology
        self.recorder: RecordingEngine | None = None
        self._grpc = None
        self._http = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        engine = Engine(self.topology, DetectionSettings())
        if self.recorder is None:
            self.recorder = RecordingEngine(engine)
        else:
            self.recorder._engine = engine
            self.recorder.new_life()
        self._grpc = start_grpc_server(self.recorder, self.target)
        self._http = HttpApi(engine, ("127.0.0.1", self.http_port))
        self._http.start()

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(0)
            self._grpc = None
        if self._http is not None:
            self._http.stop()
            self._http = None

    @property
    def up(self) -> bool:
        return self._grpc is not None

    def agents_connected(self) -> float | None:
        code, body = http_get(f"http://127.0.0.1:{self.http_port}/metrics")
        if code != 200:
            return None
        return metric(parse_metrics(body), "fabricmon_agents_connected")


class LiveAgent:
    """The agent as ``fabricmon agent`` runs it, in process, supervised, on ``node``'s tree."""

    def __init__(self, node: SimNode, tmp: Path, aggregator: str, interval: float = 0.5,
                 spool_max_bytes: int = 64 * 1024 * 1024, spool_dir: Path | None = None,
                 supervise: bool = True) -> None:
        base = sim_agent_config(node.tree, interval)
        self.intake_port = free_port()
        cfg = dataclasses.replace(
            base, aggregator=aggregator,
            stream=StreamConfig(spool_dir=str(spool_dir or tmp / "spool"), spool_max_bytes=spool_max_bytes),
            intake=IntakeConfig(listen=f"127.0.0.1:{self.intake_port}", socket=None))
        self.agent = build_live_agent(cfg, stream_backoff=(0.05, 0.5))
        self.first_seq = self.agent.stream.stats()["next_seq"]  # before the first poll
        self.port = self.agent.start_http("127.0.0.1:0")
        self.agent.start_polling()
        if supervise:
            self.agent.start_supervisor(every=0.1)
        self.stream = self.agent.stream
        self.spooled: list[int] = []  # every seq the spool accepted (observed, not altered)
        spool = self.stream.spool
        real_append = spool.append

        def append(seq: int, payload: bytes) -> bool:
            ok = real_append(seq, payload)
            if ok:
                self.spooled.append(seq)
            return ok

        spool.append = append

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self) -> dict:
        code, body = http_get(self.url("/metrics"))
        assert code == 200, code
        return parse_metrics(body)

    def post_ranks(self, body: bytes, timeout: float = 5.0) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{self.intake_port}/v1/ranks", data=body, method="POST",
                                     headers={"Content-Type": "application/x-ndjson"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def stop(self) -> None:
        self.agent.stop()


def hostile_lines(i: int) -> bytes:
    """One body of rank lines a broken or hostile client might post: a good line among bad ones."""
    lines = [
        json.dumps({"job": "j", "rank": 2**32, "step": i, "step_seconds": 1}),
        json.dumps({"job": "j", "rank": 1, "step": 2**64 + i, "step_seconds": 1}),
        json.dumps({"job": "j", "rank": 1, "local_rank": 2**40, "step": i, "step_seconds": 1}),
        f'{{"job": "\\ud800bad", "rank": 1, "step": {i}, "step_seconds": 1}}',
        f'{{"job": "ok", "rank": 1, "step": {i}, "step_seconds": 1, "group": {{"\\udcff": 1}}}}',
        json.dumps({"job": "j", "rank": 1, "step": i, "step_seconds": 1e308 * 10}).replace("Infinity", "1e999"),
        json.dumps({"job": "j", "rank": 1, "step": i, "step_seconds": 1, "gpu": 2**31}),
        json.dumps({"job": "j" * 1000, "rank": 1, "step": i, "step_seconds": 1}),
        json.dumps({"job": "lay", "layout": {"tp": 2**63, "pp": 1}}),
        "not json at all \x00\xff",
        "{" * 5000,
        "[]",
        json.dumps({"job": "good", "rank": i % 8, "local_rank": i % 8, "step": i, "step_seconds": 1.0,
                    "comm_seconds": 0.1}),
    ]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


class SlowClients:
    """``n`` connections that send half a request and then nothing (bounded, closed by ``close``)."""

    def __init__(self, port: int, n: int) -> None:
        self.socks: list[socket.socket] = []
        for _ in range(n):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2.0)
                s.sendall(b"POST /v1/ranks HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"job\":")
                self.socks.append(s)
            except OSError:
                break  # refused: the listener bounds its connections, which is fine

    def close(self) -> None:
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        self.socks.clear()
