"""A token is rotated or revoked with a SIGHUP, never a restart (issue 21, item 4).

The aggregator runs as the service runs it (``run_aggregator``: config file, the reload event a
SIGHUP sets, real gRPC and HTTP on 127.0.0.1); agents are real ``StreamClient``s reading their
own token files.  Rotation: add the new token, roll the agents, remove the old one; each step is
a reload that re-reads the file contents, and removing a token cuts the streams that used it.
"""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import pytest
import yaml
from waiting import wait_until

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator.config import load_aggregator_config
from fabricmon.aggregator.service import run_aggregator
from fabricmon.batch import NodeHello
from fabricmon.configload import ConfigError


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Aggregator:
    """``run_aggregator`` in a thread; ``hup()`` is what the SIGHUP handler does."""

    def __init__(self, tmp: Path, auth: dict) -> None:
        topo = tmp / "topology.yaml"
        topo.write_text(yaml.safe_dump({"cluster": "rot", "layout": "roce", "nodes_per_unit": 4,
                                        "generate": {"nodes": 4, "gpus_per_node": 2, "rails": 2}}))
        self.grpc, self.http = _free_port(), _free_port()
        self.path = tmp / "aggregator.yaml"
        self.path.write_text(yaml.safe_dump({
            "topology": str(topo), "grpc_listen": f"127.0.0.1:{self.grpc}", "http_listen": f"127.0.0.1:{self.http}",
            "tick_seconds": 0.05, "auth": auth}))
        self.stop_event, self.reload = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=run_aggregator, daemon=True, args=(self._load(), self.stop_event),
                                       kwargs={"reload": self.reload, "load": self._load})
        self.thread.start()
        assert wait_until(lambda: "fabricmon_ticks_total" in self.metrics(), 20)

    def _load(self):
        from fabricmon.aggregator.config import check_files

        cfg = load_aggregator_config(self.path)
        check_files(cfg, str(self.path))
        return cfg

    def metrics(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def value(self, line: str) -> float | None:
        for ln in self.metrics().splitlines():
            if ln.startswith(line + " "):
                return float(ln.split()[-1])
        return None

    def reloads(self) -> tuple:
        """Moves with every finished reload (the success time alone would miss two failures)."""
        return (sum(self.value(f'fabricmon_config_reloads_total{{result="{r}"}}') or 0 for r in ("success", "failure")),
                self.value("fabricmon_config_last_reload_success_timestamp_seconds"))

    def hup(self) -> bool:
        """Reload as SIGHUP asks for it; wait until it finished; whether it succeeded."""
        before = self.reloads()
        self.reload.set()
        assert wait_until(lambda: self.reloads() != before, 10), self.metrics()
        return self.value("fabricmon_config_last_reload_successful") == 1.0

    def revoked(self) -> float:
        return self.value('fabricmon_grpc_streams_refused_total{reason="revoked"}') or 0.0

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(20)


class Agent:
    """One node's stream client with its own token file (the last line is presented)."""

    def __init__(self, tmp: Path, agg: Aggregator, node: str, token: str) -> None:
        self.token_file = tmp / f"{node}.token"
        self.token_file.write_text(token + "\n")
        hello = NodeHello(node, "test", 1.0)
        self.client = StreamClient(f"127.0.0.1:{agg.grpc}", node, lambda: hello, MemorySpool(),
                                   token_file=str(self.token_file), backoff_min=0.05, backoff_max=0.2,
                                   hello_timeout=3.0).start()

    def connects(self) -> int:
        return self.client.stats()["connects_total"]


@pytest.fixture
def rig(tmp_path):
    made: list = []

    def make(kind, *args):
        obj = kind(tmp_path, *args)
        made.append(obj)
        return obj

    yield make
    for obj in reversed(made):
        if isinstance(obj, Agent):
            obj.client.stop(2.0)
        else:
            obj.close()


def test_shared_token_rotation_add_roll_remove_cuts_only_the_old_token(tmp_path, rig):
    shared = tmp_path / "shared.token"
    shared.write_text("old-token-0123456789\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    a = rig(Agent, agg, "node-000", "old-token-0123456789")
    assert wait_until(lambda: a.client.connected, 10), a.client.last_error

    # 1. add the new token: both accepted, the live stream untouched
    shared.write_text("old-token-0123456789\nnew-token-9876543210\n")
    assert agg.hup()
    b = rig(Agent, agg, "node-001", "new-token-9876543210")
    assert wait_until(lambda: b.client.connected, 10), b.client.last_error
    assert a.client.connected and a.connects() == 1
    assert agg.value("fabricmon_agents_connected") == 2

    # 2. remove the old token: the stream that presented it is cut at once, the other stays
    shared.write_text("new-token-9876543210\n")
    assert agg.hup()
    assert wait_until(lambda: agg.revoked() == 1, 10), agg.metrics()
    assert wait_until(lambda: "UNAUTHENTICATED" in a.client.last_error, 10), a.client.last_error
    assert not a.client.connected and b.client.connected and b.connects() == 1
    # its reconnects with the removed token are refused
    refused = agg.value('fabricmon_grpc_streams_refused_total{reason="unauthenticated"}')
    assert wait_until(lambda: agg.value('fabricmon_grpc_streams_refused_total{reason="unauthenticated"}')
                      > refused, 10)
    assert agg.value("fabricmon_agents_connected") == 1

    # 3. the rolled agent (its file now holds the new token) reconnects on its own
    a.token_file.write_text("new-token-9876543210\n")
    assert wait_until(lambda: a.client.connected, 10), a.client.last_error
    assert agg.value("fabricmon_agents_connected") == 2 and agg.revoked() == 1


def test_revoked_per_node_token_is_cut_and_the_others_stay(tmp_path, rig):
    tokens = tmp_path / "node-tokens.yaml"
    tokens.write_text(yaml.safe_dump({"node-000": "tok-zero-aaaaaaaa", "node-001": "tok-one-bbbbbbbb"}))
    agg = rig(Aggregator, {"node_tokens_file": str(tokens)})
    a = rig(Agent, agg, "node-000", "tok-zero-aaaaaaaa")
    b = rig(Agent, agg, "node-001", "tok-one-bbbbbbbb")
    assert wait_until(lambda: a.client.connected and b.client.connected, 10)

    # node-001's token leaked: a new one is issued (a list during the roll), then the old one removed
    tokens.write_text(yaml.safe_dump({"node-000": "tok-zero-aaaaaaaa",
                                      "node-001": ["tok-one-bbbbbbbb", "tok-one-cccccccc"]}))
    assert agg.hup()
    assert agg.revoked() == 0 and b.connects() == 1
    tokens.write_text(yaml.safe_dump({"node-000": "tok-zero-aaaaaaaa", "node-001": "tok-one-cccccccc"}))
    assert agg.hup()
    assert wait_until(lambda: agg.revoked() == 1 and not b.client.connected, 10), agg.metrics()
    assert a.client.connected and a.connects() == 1
    b.token_file.write_text("tok-one-cccccccc\n")
    assert wait_until(lambda: b.client.connected, 10), b.client.last_error

    # a token file that cannot be used is refused with one line, nothing applied, gauge 0
    tokens.write_text(yaml.safe_dump({"node-000": "same-token-xxxxxx", "node-001": "same-token-xxxxxx"}))
    assert not agg.hup()
    assert a.client.connected and b.client.connected and agg.revoked() == 1


def test_a_reload_that_cannot_read_the_token_file_changes_nothing(tmp_path, rig):
    shared = tmp_path / "shared.token"
    shared.write_text("only-token-0123456789\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    a = rig(Agent, agg, "node-000", "only-token-0123456789")
    assert wait_until(lambda: a.client.connected, 10)
    shared.write_text("\n")
    assert not agg.hup()
    shared.unlink()
    assert not agg.hup()
    assert a.client.connected and agg.revoked() == 0


def test_agent_presents_the_last_line_and_reconnects_when_its_file_changes_on_reload(tmp_path, rig):
    shared = tmp_path / "shared.token"
    shared.write_text("first-token-aaaaaaaa\nsecond-token-bbbbbbbb\n")
    agg = rig(Aggregator, {"token_file": str(shared)})
    a = rig(Agent, agg, "node-000", "first-token-aaaaaaaa")
    assert wait_until(lambda: a.client.connected, 10)
    assert a.client.refresh_credentials() is False  # unchanged: the stream stays
    # the agent's Secret gets the new token appended (the rotation's second step) and the agent a SIGHUP
    a.token_file.write_text("first-token-aaaaaaaa\nsecond-token-bbbbbbbb\n")
    assert a.client.refresh_credentials() is True
    assert wait_until(lambda: a.connects() == 2 and a.client.connected, 10), a.client.last_error
    # it now presents the second token: removing the first cuts nothing
    shared.write_text("second-token-bbbbbbbb\n")
    assert agg.hup()
    assert agg.revoked() == 0 and a.client.connected and a.connects() == 2


def test_token_files_are_read_for_contents(tmp_path):
    from fabricmon.aggregator.config import AuthSettings
    from fabricmon.aggregator.credentials import load_credentials

    f = tmp_path / "t"
    f.write_text("a-token\n\n  b-token  \n")
    creds = load_credentials(AuthSettings(token_file=str(f)), "agg.yaml")
    assert creds.shared == {b"a-token", b"b-token"}
    f.write_text("two words\n")
    with pytest.raises(ConfigError, match=r"^agg.yaml: auth.token_file: .*line 1 holds whitespace"):
        load_credentials(AuthSettings(token_file=str(f)), "agg.yaml")
    n = tmp_path / "n.yaml"
    n.write_text("node-000: [x1, x2]\nnode-001: x2\n")
    with pytest.raises(ConfigError, match=r"auth.node_tokens_file: .*node-001: token also used by another node"):
        load_credentials(AuthSettings(node_tokens_file=str(n)), "agg.yaml")
