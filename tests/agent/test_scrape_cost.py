"""A scrape of the agent's /metrics only copies what the poll rendered (issue 39), and the agent
loads only what its enabled sources need.

The snapshot and the build and process metrics are rendered once per poll (and the latter on each
supervisor pass); the HTTP listener keeps its handler threads for the next connection; a source
whose section is disabled, and the aggregator stream with its gRPC, are never imported by an agent
that does not use them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from fabricmon.agent.exporter import RenderedSnapshot
from fabricmon.agent.runtime import GIL_SWITCH_INTERVAL, build_agent
from fabricmon.agent.selfmetrics import AgentSelfCollector, self_exposition
from fabricmon.agent.stream import AGGREGATOR_DROP_REASONS, BATCH_DROP_REASONS, REFUSAL_REASONS
from fabricmon.agent.supervise import Supervisor
from fabricmon.config import load_agent_config
from fabricmon.httpserve import TEXT, RoutedHTTPServer
from fabricmon.model import Snapshot
from support.paths import REPO
from support.waiting import wait_until


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read()


def test_a_scrape_reads_no_proc_file_and_renders_nothing_of_the_poll(make_fixture, monkeypatch):
    root = make_fixture(layout="ib")
    cfg = load_agent_config(None, {"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                                   "nvml": f"fake:{root / 'nvml.json'}", "listen": "127.0.0.1:0"})
    agent = build_agent(cfg, inline_sources=True)
    process_reads = []
    real_collect = ProcessCollector.collect
    monkeypatch.setattr(ProcessCollector, "collect", lambda self: (process_reads.append(1), real_collect(self))[1])
    import fabricmon.agent.exporter as exporter

    renders = []
    real_render = exporter.render_snapshot
    monkeypatch.setattr(exporter, "render_snapshot", lambda *a: (renders.append(1), real_render(*a))[1])
    port = agent.start_http()
    try:
        agent.poller.poll_once()
        after_poll = (len(renders), len(process_reads))
        assert after_poll[0] == 1 and after_poll[1] >= 1  # rendered in the poll, not by a scrape
        bodies = [_scrape(port) for _ in range(5)]
        assert (len(renders), len(process_reads)) == after_poll
        for body in bodies:
            assert b"process_cpu_seconds_total" in body and b"fabricmon_build_info{" in body
            assert b"fabricmon_snapshot_age_seconds{" in body and b"fabricmon_ib_port_state{" in body
            assert b"fabricmon_agent_thread_up" in body  # the agent's own counters: read at the scrape
    finally:
        agent.stop()


def test_a_scrape_writes_the_agents_own_counters_without_prometheus_client(make_fixture, monkeypatch):
    """The delivery and thread counters are read at each scrape (a count shows once its event
    happened) but written from cached HELP/TYPE lines and series prefixes: no metric family objects,
    no generate_latest (it cost a streaming agent 0.34 ms a scrape, a third of its p50)."""
    root = make_fixture(layout="ib")
    cfg = load_agent_config(None, {"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                                   "nvml": f"fake:{root / 'nvml.json'}", "listen": "127.0.0.1:0"})
    agent = build_agent(cfg, inline_sources=True)
    collects = []
    real_collect = AgentSelfCollector.collect
    monkeypatch.setattr(AgentSelfCollector, "collect", lambda self: (collects.append(1), real_collect(self))[1])
    restarts = [0]
    monkeypatch.setattr(agent.supervisor, "stats", lambda: {"poller": (1, restarts[0])})
    port = agent.start_http()
    try:
        agent.poller.poll_once()
        assert b'fabricmon_agent_thread_restarts_total{node="node-000",thread="poller"} 0.0\n' in _scrape(port)
        restarts[0] = 7
        assert b'fabricmon_agent_thread_restarts_total{node="node-000",thread="poller"} 7.0\n' in _scrape(port)
        assert collects == []
    finally:
        agent.stop()


def _every_stat() -> dict:
    """A stream's stats with every key the exposition reads, non-zero and of several float forms."""
    from fabricmon.agent.ras_query import QUERY_OUTCOMES
    from fabricmon.agent.selfmetrics import _STREAM_SCALARS
    from fabricmon.agent.wire_guard import ITEM_REASONS

    stats: dict = {key: 1e21 * i if i % 3 == 0 else i + 0.25 for i, (key, *_rest) in enumerate(_STREAM_SCALARS)}
    stats["batches_dropped"] = {r: i for i, r in enumerate(BATCH_DROP_REASONS)}
    stats["aggregator_dropped"] = {r: i + 1 for i, r in enumerate(AGGREGATOR_DROP_REASONS)}
    stats["refused"] = {r: 2 for r in REFUSAL_REASONS.values()}
    stats["items_dropped"] = {r: 3 for r in ITEM_REASONS}
    stats["nccl_ras"] = {"outcomes": {o: 4 for o in QUERY_OUTCOMES}, "seconds_total": 1e-7}
    return stats


def test_the_agents_own_counters_are_the_bytes_prometheus_client_writes():
    """Same text as generate_latest over the collector, for every family (stream, threads, link
    watch) and for label values that need escaping."""
    threads = {"poller": (1, 0), "stream": (0, 3), 'od"d\\na\nme': (1, 2)}
    link_watch = {"interval_seconds": 0.1, "passes_total": 12345678901.0, "links_unwatched": 1.0}
    for node, stream, thread_stats, watch in (("node-000", _every_stat, lambda: threads, lambda: link_watch),
                                              ('no"de\\1', None, lambda: threads, None),
                                              ("n", lambda: {}, lambda: {}, lambda: {}),
                                              ("n", None, None, None)):
        collector = AgentSelfCollector(node, stream, thread_stats, watch)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        fast = self_exposition(collector)
        assert fast() == generate_latest(registry)
        assert fast() == generate_latest(registry)  # from the caches too


def test_process_metrics_nobody_refreshed_are_rendered_by_the_scrape():
    """An agent whose poll thread and supervisor are both gone still tells the truth: past
    ``extras_max_age`` a scrape renders them itself."""
    now = [100.0]
    calls = []

    def extra() -> bytes:
        calls.append(now[0])
        return f"x_total {len(calls)}\n".encode()

    snap = Snapshot(node="n1", ts=5.0, seq=1, interval_seconds=1.0, samples=(), deltas=(), sources=())
    rendered = RenderedSnapshot(lambda: snap, clock=lambda: 6.0, extras=[extra], extras_max_age=2.0,
                                monotonic=lambda: now[0])
    assert b"x_total 1\n" in rendered.body()  # the first scrape renders (the poll listener had not run)
    now[0] += 1.5
    assert b"x_total 1\n" in rendered.body() and len(calls) == 1  # fresh enough: copied
    now[0] += 1.0
    assert b"x_total 2\n" in rendered.body() and len(calls) == 2  # stale: rendered now
    rendered.refresh_extras()
    assert b"x_total 3\n" in rendered.body() and len(calls) == 3


def test_a_scrape_before_the_poll_listener_rendered_serves_the_previous_body(monkeypatch):
    """Between the poller publishing a snapshot and its listener rendering it, a scrape serves the
    body already rendered, with that snapshot's own age line; it renders the new one itself only
    when nothing did for ``extras_max_age`` (a poll thread whose listener is gone)."""
    from fabricmon.agent import exporter

    def snap(ts: float, value: float) -> Snapshot:
        from fabricmon.model import Sample
        return Snapshot(node="n1", ts=ts, seq=int(ts), interval_seconds=1.0, deltas=(), sources=(),
                        samples=(Sample("fabricmon_gpu_up", (("gpu", "0"),), value),))

    renders = []
    real = exporter.render_snapshot
    monkeypatch.setattr(exporter, "render_snapshot", lambda s, p=None: renders.append(s.ts) or real(s, p))
    latest = [snap(10.0, 1.0)]
    rendered = RenderedSnapshot(lambda: latest[0], clock=lambda: 12.5, extras_max_age=2.0)
    rendered.refresh()
    assert renders == [10.0]
    latest[0] = snap(11.0, 0.0)  # published, its listener not yet run
    body = rendered.body().decode()
    assert renders == [10.0]  # the scrape rendered nothing
    assert 'fabricmon_gpu_up{gpu="0",node="n1"} 1.0\n' in body
    assert 'fabricmon_snapshot_age_seconds{node="n1"} 2.5\n' in body  # the age of what it shows
    rendered.refresh(latest[0])  # the listener
    body = rendered.body().decode()
    assert renders == [10.0, 11.0] and 'fabricmon_gpu_up{gpu="0",node="n1"} 0.0\n' in body
    assert 'fabricmon_snapshot_age_seconds{node="n1"} 1.5\n' in body
    latest[0] = snap(13.5, 1.0)  # 2.5 s past what was rendered: nothing renders, so the scrape does
    assert 'fabricmon_gpu_up{gpu="0",node="n1"} 1.0\n' in rendered.body().decode()
    assert renders == [10.0, 11.0, 13.5]
    latest[0] = snap(5.0, 0.0)  # the clock stepped back past extras_max_age: rendered too, not kept stale
    assert 'fabricmon_gpu_up{gpu="0",node="n1"} 0.0\n' in rendered.body().decode()
    assert renders == [10.0, 11.0, 13.5, 5.0]


def test_each_supervisor_pass_runs_its_hooks_even_when_one_fails():
    sup = Supervisor()
    ran = threading.Event()
    sup.after_check(lambda: 1 / 0)
    sup.after_check(ran.set)
    stop = threading.Event()
    sup.start(stop, every=0.01)
    try:
        assert ran.wait(10)
    finally:
        stop.set()
        sup.halt()


def test_handler_threads_serve_the_next_connection_and_end_at_stop():
    seen: list[threading.Thread] = []

    def route(_q):
        seen.append(threading.current_thread())
        return 200, b"ok\n", TEXT

    srv = RoutedHTTPServer("127.0.0.1", 0, {"/ok": route})
    workers = srv._server._workers
    srv.start()
    try:
        for i in range(10):
            # the previous connection's thread is back waiting (a condition, not a sleep: under load the
            # next request could otherwise come before it returned, and get a thread of its own)
            assert i == 0 or wait_until(lambda: workers._idle >= 1, 10)
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/ok", timeout=10) as r:
                assert r.read() == b"ok\n"
    finally:
        srv.stop()
    assert len(seen) == 10 and len({id(t) for t in seen}) == 1  # not one new thread per connection
    assert wait_until(lambda: not any(t.is_alive() for t in seen), 10)  # idle ones end with the server


def test_the_shipped_sources_load_neither_grpc_nor_disabled_sources(make_fixture, tmp_path):
    """The shipped agent.yaml's sources, exporting only: no gRPC/protobuf (the stream's), no switch
    sweeper or transceiver module (disabled there)."""
    root = make_fixture(layout="ib")
    code = textwrap.dedent(f"""
        import sys
        from dataclasses import replace
        from fabricmon.agent.runtime import build_agent
        from fabricmon.config import load_agent_config
        cfg = load_agent_config({str(REPO / "systemd/etc/fabricmon/agent.yaml")!r}, {{
            "sysfs_root": {str(root / "sys")!r}, "ethtool_dir": {str(root / "ethtool")!r},
            "nvml": "fake:" + {str(root / "nvml.json")!r}, "listen": "127.0.0.1:0"}})
        assert not cfg.sources.ib_switches.enabled and not cfg.sources.transceiver.enabled
        agent = build_agent(cfg, inline_sources=True)
        agent.start_http()
        agent.poller.poll_once()
        names = sorted(s for s in agent.poller.source_names)
        agent.stop()
        loaded = [m for m in sys.modules if m.split(".")[0] in ("grpc", "google")
                  or m.startswith(("fabricmon.sources.ib_switches", "fabricmon.sources.transceiver",
                                   "fabricmon.topology_import", "fabricmon.agent.stream"))]
        print(names, sorted(loaded))
        sys.exit(1 if loaded else 0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "'infiniband'" in out.stdout and "'ethtool'" in out.stdout


@pytest.mark.integration
def test_the_agent_process_hands_the_gil_over_within_half_a_millisecond(make_fixture, tmp_path):
    """``fabricmon agent`` lowers CPython's GIL switch interval (5 ms): a scrape that needs the GIL
    while the poll or the stream thread runs Python waits at most that long, at each of its steps."""
    root = make_fixture(layout="ib")
    code = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from fabricmon.cli import main

        default = sys.getswitchinterval()

        def report():
            end = time.monotonic() + 60
            while sys.getswitchinterval() == default and time.monotonic() < end:
                time.sleep(0.01)
            print("interval", default, sys.getswitchinterval(), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=report, daemon=True).start()
        sys.exit(main(["agent", "--sysfs-root", {str(root / "sys")!r}, "--ethtool-dir", {str(root / "ethtool")!r},
                       "--nvml", "fake:" + {str(root / "nvml.json")!r}, "--listen", "127.0.0.1:0",
                       "--config", {str(tmp_path / "agent.yaml")!r}]))
    """)
    (tmp_path / "agent.yaml").write_text(f"intake:\n  listen: null\n  socket: {tmp_path / 'ranks.sock'}\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert f"interval 0.005 {GIL_SWITCH_INTERVAL}" in out.stdout and GIL_SWITCH_INTERVAL == 0.0005
