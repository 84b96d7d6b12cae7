"""Every agent thread is supervised, and /readyz says whether the agent still does its job.

Threads are killed for real (an exception no handler in them catches: ``SystemExit``
raised once from inside the thread, or the HTTP server's own shutdown); the
supervisor must notice, restart with backoff, count it on /metrics, and /readyz must
reflect what is down.  Spool write failures are injected at the file system (a tiny
tmpfs when this runs as root with mount rights) or at the spool's writer.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from itertools import pairwise

import pytest

from fabricmon.agent.supervise import Supervisor
from support.agentrig import LiveAgent, SimNode, free_port, http_get, metric, parse_metrics, wait_until

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_supervisor_restarts_with_backoff_and_counts():
    clock = FakeClock()
    sup = Supervisor(backoff_min=1.0, backoff_max=4.0, clock=clock)
    state = {"alive": False, "starts": 0}

    def restart():
        state["starts"] += 1  # dies again at once: the backoff must space the restarts

    sup.add("worker", lambda: state["alive"], restart)
    sup.add("listener", lambda: False)  # cannot be restarted: reported down
    times = []
    for step in range(40):  # 10 s of fake time in 0.25 s steps
        clock.t = step * 0.25
        before = state["starts"]
        sup.check()
        if state["starts"] > before:
            times.append(clock.t)
    gaps = [b - a for a, b in pairwise(times)]
    assert gaps[:3] == [1.0, 2.0, 4.0] and all(g == 4.0 for g in gaps[3:]), times
    assert sup.stats()["worker"] == (0, len(times))
    assert sup.stats()["listener"] == (0, 0) and "listener" in sup.down()
    state["alive"] = True
    sup.check()
    assert sup.stats()["worker"][0] == 1 and "worker" not in sup.down()
    sup.halt()
    state["alive"] = False
    n = state["starts"]
    clock.t += 100
    sup.check()
    assert state["starts"] == n  # halted: parts being stopped on purpose are left alone


def test_supervisor_loop_survives_a_failing_check():
    sup = Supervisor(backoff_min=0.01, backoff_max=0.01)
    calls = []

    def alive():
        calls.append(1)
        raise RuntimeError("check blew up")

    sup.add("odd", alive, lambda: None)
    stop = threading.Event()
    sup.start(stop, every=0.01)
    try:
        assert wait_until(lambda: len(calls) >= 10, 5)
        assert sup.running()
    finally:
        stop.set()
        sup.halt()


@pytest.fixture
def node(tmp_path):
    n = SimNode(tmp_path / "tree")
    yield n
    n.stop()


def _die_once(obj, name: str):
    """Make ``obj.name`` raise SystemExit (which no thread here catches) the next time it runs."""
    real = getattr(obj, name)
    fired = threading.Event()

    def once(*a, **kw):
        if not fired.is_set():
            fired.set()
            raise SystemExit("killed by the test")
        return real(*a, **kw)

    setattr(obj, name, once)
    return fired


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # killed on purpose
def test_dead_threads_are_restarted_and_counted(tmp_path, node):
    agent = LiveAgent(node, tmp_path, f"127.0.0.1:{free_port()}")
    try:
        assert wait_until(lambda: http_get(agent.url("/readyz"))[0] == 200, 20)
        # the stream thread
        fired = _die_once(agent.stream.reconnect, "spool_for")
        assert wait_until(fired.is_set, 10)
        assert wait_until(lambda: metric(agent.metrics(), "fabricmon_agent_thread_restarts_total", thread="stream")
                          == 1.0, 10)
        assert wait_until(agent.stream.alive, 5)
        n = len(agent.spooled)
        assert wait_until(lambda: len(agent.spooled) > n + 1, 10)  # spooling again
        # the poll thread
        fired = _die_once(agent.agent.poller, "poll_once")
        assert wait_until(fired.is_set, 10)
        assert wait_until(lambda: metric(agent.metrics(), "fabricmon_agent_thread_restarts_total", thread="poller")
                          == 1.0, 10)
        seq = agent.agent.poller.latest.seq
        assert wait_until(lambda: agent.agent.poller.latest.seq > seq + 1, 10)  # polling again
        # the exporter's HTTP thread: its server stops serving; the same port must answer again
        port = agent.port
        agent.agent.http._server.shutdown()
        assert wait_until(lambda: http_get(agent.url("/metrics"))[0] == 200
                          and metric(agent.metrics(), "fabricmon_agent_thread_restarts_total", thread="exporter")
                          == 1.0, 15)
        assert agent.agent.http.port == port
        m = agent.metrics()
        for t in ("poller", "stream", "exporter", "intake"):
            assert metric(m, "fabricmon_agent_thread_up", thread=t) == 1.0, t
        assert wait_until(lambda: http_get(agent.url("/readyz"))[0] == 200, 10), http_get(agent.url("/readyz"))
    finally:
        agent.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # killed on purpose
def test_readyz_reports_a_dead_poller_and_stream_when_unsupervised(tmp_path, node):
    agent = LiveAgent(node, tmp_path, f"127.0.0.1:{free_port()}", supervise=False)
    try:
        assert wait_until(lambda: http_get(agent.url("/readyz"))[0] == 200, 20)
        fired = _die_once(agent.stream.reconnect, "spool_for")
        assert wait_until(fired.is_set, 10)
        assert wait_until(lambda: not agent.stream.alive(), 10)
        code, body = http_get(agent.url("/readyz"))
        assert code == 503 and b"stream thread down" in body, body
        assert http_get(agent.url("/healthz"))[0] == 200  # polling still runs
        fired = _die_once(agent.agent.poller, "poll_once")
        assert wait_until(fired.is_set, 10)
        assert wait_until(lambda: b"poller thread down" in http_get(agent.url("/readyz"))[1], 10)
        assert http_get(agent.url("/healthz"))[0] == 503  # nothing will restart it: let the orchestrator
        # and once the snapshot is old, /readyz says so too (3 intervals, at least 5 s)
        assert wait_until(lambda: b"last poll" in http_get(agent.url("/readyz"))[1], 15)
        m = agent.metrics()
        assert metric(m, "fabricmon_agent_thread_up", thread="poller") == 0.0
    finally:
        agent.stop()


def _enospc_store(spool):
    def store(seq, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    spool._store = store


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (a real ENOSPC), or None where mounting is not allowed."""
    d = tmp_path / "tiny"
    d.mkdir()
    if os.geteuid() != 0:
        yield None
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True, timeout=10)
    if r.returncode != 0:
        yield None
        return
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=10)


@pytest.mark.parametrize("how", ["tmpfs", "injected"])
def test_spool_write_failures_are_counted_and_make_readyz_fail(tmp_path, node, tiny_tmpfs, how):
    if how == "tmpfs" and tiny_tmpfs is None:
        pytest.skip("cannot mount a tmpfs here (not root or no mount rights); the injected case covers it")
    spool_dir = tiny_tmpfs / "spool" if how == "tmpfs" else None
    agent = LiveAgent(node, tmp_path, f"127.0.0.1:{free_port()}", spool_dir=spool_dir)
    try:
        if how == "injected":
            _enospc_store(agent.stream.spool)
        assert wait_until(lambda: agent.stream.stats()["spool_write_failures_total"] >= 2, 60), \
            agent.stream.stats()
        m = agent.metrics()
        fails = metric(m, "fabricmon_stream_spool_write_failures_total")
        assert fails >= 2
        assert metric(m, "fabricmon_stream_batches_dropped_total", reason="spool_write_failed") == fails
        code, body = http_get(agent.url("/readyz"))
        assert code == 503 and b"stream neither connected nor spooling" in body, body
        assert agent.stream.alive()
        assert http_get(agent.url("/healthz"))[0] == 200
        # every batch made is accounted for: stored in the spool, or counted as lost
        def accounted() -> bool:
            st = agent.stream.stats()
            made = st["next_seq"] - agent.first_seq
            return made == len(agent.spooled) + st["spool_write_failures_total"] + st["batches_dropped"]["unencodable"]

        assert wait_until(accounted, 10), agent.stream.stats()
    finally:
        agent.stop()


def test_self_metrics_are_promtool_clean(tmp_path, node):
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    agent = LiveAgent(node, tmp_path, f"127.0.0.1:{free_port()}")
    try:
        assert wait_until(lambda: len(agent.spooled) >= 1, 20)
        code, body = http_get(agent.url("/metrics"))
        assert code == 200
        parse_metrics(body)
    finally:
        agent.stop()
    ours = b"".join(line + b"\n" for line in body.splitlines()
                    if b"fabricmon_stream_" in line or b"fabricmon_agent_thread" in line)
    r = subprocess.run([promtool, "check", "metrics"], input=ours, capture_output=True, timeout=30)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
    assert b"fabricmon_stream_batches_dropped_total" in ours
