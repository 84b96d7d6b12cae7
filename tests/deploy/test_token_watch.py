"""A rotated token reaches a running aggregator and agent without a SIGHUP (issue 36), at the paths
the shipped deployments give it.

systemd: the shipped units and configs rendered into a temporary root (as install.sh writes them:
``/etc/fabricmon/`` under the root, the units' ExecStart naming the config); the token is the file
both configs name, rewritten in place and then replaced by rename, as an operator does.
Kubernetes: the Secret volume's path in the shipped manifests, laid out and updated as the kubelet
does (``token -> ..data/token``, a new ``..<version>`` directory and a renamed ``..data`` symlink;
kubernetes pkg/volume/util/atomic_writer.go), with nothing signalling the process.

Real ``fabricmon aggregator`` and ``fabricmon agent`` processes, real gRPC and HTTP on 127.0.0.1;
only the node's hardware is a simulated tree.  The watch period is set short
(``FABRICMON_SECRET_WATCH_S``) so the test is quick; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import grpc
import pytest
import yaml

from support.grpcraw import raw_stream
from support.procrig import Proc, agent_config, free_port, metrics, render_node, short_dir, topology_yaml, wait_until
from support.promtools import REPO

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(sys.platform != "linux", reason="POSIX signals and Unix sockets")]

SYSTEMD = REPO / "systemd"
PERIOD = 0.3
OLD, NEW = "old-token-0123456789abcdef", "new-token-fedcba9876543210"


def _value(body: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def _config_path(unit_text: str) -> str:
    """The --config the unit's ExecStart names."""
    line = next(ln for ln in unit_text.splitlines() if ln.startswith("ExecStart="))
    words = shlex.split(line.partition("=")[2])
    return words[words.index("--config") + 1]


def render(root: Path, role: str) -> tuple[Path, dict]:
    """The shipped unit and config of ``role`` under ``root``, as install.sh writes them; the config's
    path (from the unit) and its contents."""
    unit = (SYSTEMD / f"fabricmon-{role}.service").read_text().replace("/etc/fabricmon/", f"{root}/etc/fabricmon/")
    assert "LoadCredential" not in "".join(ln for ln in unit.splitlines() if not ln.startswith("#")), \
        "a LoadCredential= copy is never refreshed: a rotated token would not reach the daemon"
    cfg_text = (SYSTEMD / "etc" / "fabricmon" / f"{role}.yaml").read_text()
    cfg = yaml.safe_load(cfg_text.replace("/etc/fabricmon/", f"{root}/etc/fabricmon/"))
    path = Path(_config_path(unit))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, cfg


def kubelet_update(mount: Path, version: str, text: str) -> None:
    """One Secret update as the kubelet writes it (atomic_writer.go): new dir, ..data renamed over."""
    mount.mkdir(parents=True, exist_ok=True)
    d = mount / f"..{version}"
    d.mkdir()
    (d / "token").write_text(text)
    tmp = mount / "..data_tmp"
    tmp.symlink_to(d.name)
    os.replace(tmp, mount / "..data")
    if not (mount / "token").is_symlink():
        (mount / "token").symlink_to("..data/token")


class Deployment:
    """The rendered aggregator and agent, started on free loopback ports, token where ``token_file`` says."""

    def __init__(self, tmp: Path, root: Path, token_file: str | None = None) -> None:
        self.tmp, self.root = tmp, root
        self.sockdir = short_dir()
        self.procs: list[Proc] = []
        tree = render_node(tmp / "node")
        self.node = tree.name
        agg_path, agg = render(root, "aggregator")
        a_path, a = render(root, "agent")
        if token_file is not None:
            agg["auth"]["token_file"] = a["stream"]["token_file"] = token_file
        self.token_file = Path(agg["auth"]["token_file"])
        assert self.token_file == Path(a["stream"]["token_file"])  # one token file, both roles
        self.gport, self.hport, self.aport = free_port(), free_port(), free_port()
        agg.update(topology=str(topology_yaml(tmp / "topology.yaml")), cluster="rig",
                   grpc_listen=f"127.0.0.1:{self.gport}", http_listen=f"127.0.0.1:{self.hport}",
                   state_file=str(tmp / "incidents.json"), tick_seconds=0.1)
        agg["alertmanager"]["urls"] = [f"http://127.0.0.1:{free_port()}"]  # none: alerts are not looked at here
        agg_path.write_text(yaml.safe_dump(agg))
        mine = agent_config(tree, listen=f"127.0.0.1:{self.aport}", aggregator=f"127.0.0.1:{self.gport}",
                            spool=tmp / "spool", sock=os.path.join(self.sockdir, "ranks.sock"))
        mine["stream"] = {**a["stream"], **mine["stream"]}  # the shipped stream section: its token_file
        a_path.write_text(yaml.safe_dump(mine))
        self.agg_path, self.a_path = agg_path, a_path

    def start(self) -> None:
        env = {"FABRICMON_SECRET_WATCH_S": str(PERIOD)}
        self.agg = Proc(["aggregator", "--config", str(self.agg_path), "--log-format", "json"],
                        self.tmp / "aggregator.log", env)
        self.procs.append(self.agg)
        assert self.agg.wait_log("aggregator_started"), self.agg.text()
        self.agent = Proc(["agent", "--config", str(self.a_path)], self.tmp / "agent.log", env)
        self.procs.append(self.agent)
        assert wait_until(lambda: _value(metrics(self.hport), "fabricmon_agents_connected") == 1, 30), \
            self.agent.text()[-3000:]

    def accepts(self, token: str) -> bool:
        """Does the aggregator let a stream presenting ``token`` start (a raw gRPC stream, no hello)."""
        _, code = raw_stream(f"127.0.0.1:{self.gport}", [], metadata=[("authorization", f"Bearer {token}")],
                             timeout=5)
        return code != grpc.StatusCode.UNAUTHENTICATED

    def agg_value(self, name: str) -> float | None:
        return _value(metrics(self.hport), name)

    def agent_value(self, name: str) -> float | None:
        """An agent metric; the stream's carry the node label."""
        body = metrics(self.aport)
        if name.startswith("fabricmon_stream_"):
            name = f'{name}{{node="{self.node}"}}'
        return _value(body, name)

    def close(self) -> None:
        for p in reversed(self.procs):  # the agent first: the aggregator then has no stream to wait for
            p.stop()
        shutil.rmtree(self.sockdir, ignore_errors=True)


@pytest.fixture
def deployment(tmp_path):
    made: list[Deployment] = []

    def make(token_file: str | None = None) -> Deployment:
        root = tmp_path / "root"
        d = Deployment(tmp_path, root, token_file.replace("/etc/", f"{root}/etc/", 1) if token_file else None)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
    for d in made:  # nothing was signalled: every reload came from the watch
        assert '"trigger": "SIGHUP"' not in d.agg.text() + d.agent.text()


def test_systemd_token_rewritten_in_place_reaches_both_daemons_without_a_reload(deployment):
    d = deployment()
    assert d.token_file.parent.name == "fabricmon" and d.token_file.name == "token"  # /etc/fabricmon/token
    d.token_file.write_text(OLD + "\n")
    d.start()
    assert d.accepts(OLD) and not d.accepts(NEW)

    # 1. the new token added on a line of its own (the documented rotation's first step), in place:
    # the aggregator takes both, the agent reconnects presenting the last line
    d.token_file.write_text(f"{OLD}\n{NEW}\n")
    assert wait_until(lambda: d.accepts(NEW), 15), d.agg.text()[-3000:]
    assert wait_until(lambda: d.agent_value("fabricmon_stream_connects_total") == 2
                      and d.agent_value("fabricmon_stream_connected") == 1, 15), d.agent.text()[-3000:]
    assert d.agent.wait_log('"trigger": "file change"'), d.agent.text()[-3000:]

    # 2. the old token removed, the file replaced by rename (an editor, install -m): refused from now on;
    # the agent already presents the new one, so nothing is cut
    tmp = d.token_file.with_name(".token.new")
    tmp.write_text(NEW + "\n")
    os.replace(tmp, d.token_file)
    assert wait_until(lambda: not d.accepts(OLD), 15), d.agg.text()[-3000:]
    assert d.accepts(NEW)
    assert d.agg_value('fabricmon_grpc_streams_refused_total{reason="revoked"}') == 0
    assert d.agg_value("fabricmon_agents_connected") == 1 and d.agent_value("fabricmon_stream_connects_total") == 2
    assert d.agg_value('fabricmon_config_reloads_total{result="success"}') == 2
    assert d.agg_value("fabricmon_secret_file_changes_total") == 2
    assert d.agg_value("fabricmon_secret_files_watched") == 1 and d.agent_value("fabricmon_secret_files_watched") == 1


def test_kubernetes_secret_update_reaches_both_daemons_and_a_bad_one_is_refused(deployment):
    # the path the shipped manifests mount the Secret at and name in the configs
    base = (REPO / "deploy" / "kubernetes" / "base")
    assert "token_file: /etc/fabricmon/token/token" in (base / "aggregator-configmap.yaml").read_text()
    assert "mountPath: /etc/fabricmon/token," in (base / "agent-daemonset.yaml").read_text()
    d = deployment("/etc/fabricmon/token/token")
    mount = d.token_file.parent
    kubelet_update(mount, "2026_11_28_10_00_00.1", OLD + "\n")
    d.start()
    assert d.accepts(OLD) and not d.accepts(NEW)

    # the Secret changed (kubectl apply): the old token is refused, and the agent comes back with the new
    # one by itself
    kubelet_update(mount, "2026_11_28_10_05_00.2", NEW + "\n")
    assert wait_until(lambda: d.accepts(NEW) and not d.accepts(OLD), 15), d.agg.text()[-3000:]
    # whichever daemon sees the new Secret first, the agent ends on a new stream presenting the new token:
    # the aggregator cut the old one (revoked), or the agent reconnected with the new token by itself
    assert wait_until(lambda: (d.agent_value("fabricmon_stream_connects_total") or 0) >= 2, 15), d.agent.text()[-3000:]
    assert wait_until(lambda: d.agent_value("fabricmon_stream_connected") == 1
                      and d.agg_value("fabricmon_agents_connected") == 1, 15), d.agent.text()[-3000:]

    # a Secret whose token holds two words: refused as a bad SIGHUP is, the running token kept
    failures = d.agg_value('fabricmon_config_reloads_total{result="failure"}')
    kubelet_update(mount, "2026_11_28_10_10_00.3", "not a token\n")
    assert wait_until(lambda: d.agg_value("fabricmon_config_last_reload_successful") == 0, 15), d.agg.text()[-3000:]
    assert d.agg_value('fabricmon_config_reloads_total{result="failure"}') == (failures or 0) + 1
    assert d.agg.wait_log("holds whitespace")
    # the agent refuses it too (it would present half of it): its stream stays, its reload gauge says so
    assert wait_until(lambda: d.agent_value("fabricmon_config_last_reload_successful") == 0, 15), \
        d.agent.text()[-3000:]
    assert d.accepts(NEW) and d.agg_value("fabricmon_agents_connected") == 1
    assert d.agent_value("fabricmon_stream_connected") == 1
