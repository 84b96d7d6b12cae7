"""The fast renderer writes the same exposition as prometheus_client, and a scrape never touches hardware."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest

from fabricmon.agent.exporter import RenderedSnapshot, exposition, make_registry, render_snapshot
from fabricmon.agent.runtime import build_agent
from fabricmon.config import load_agent_config
from fabricmon.model import Sample, Snapshot, SourceStatus


def _agent(root):
    cfg = load_agent_config(None, {"sysfs_root": str(root / "sys"), "ethtool_dir": str(root / "ethtool"),
                                   "nvml": f"fake:{root / 'nvml.json'}", "listen": "127.0.0.1:0"})
    return build_agent(cfg)


def _without_age(text: bytes) -> bytes:
    return b"\n".join(line for line in text.split(b"\n") if b"snapshot_age_seconds" not in line)


def test_fast_renderer_equals_prometheus_client(make_fixture):
    agent = _agent(make_fixture(layout="roce", fault="pfc_storm"))
    try:
        snap = agent.poller.poll_once()
        snap = agent.poller.poll_once()
    finally:
        agent.poller.close()
    ours = render_snapshot(snap)
    theirs = generate_latest(make_registry(lambda: snap, clock=lambda: snap.ts))
    assert len(ours) > 100_000
    assert _without_age(ours) == _without_age(theirs)
    assert exposition(snap, now=snap.ts) == theirs


def test_label_values_are_escaped_like_prometheus_client():
    odd = 'a"b\\c\nd'
    snap = Snapshot(node='n"1', ts=5.0, seq=1, samples=(
        Sample("fabricmon_ethtool_stat", (("interface", odd), ("stat", "x")), float("nan")),
        Sample("fabricmon_host_load1", (), float("inf")),
        Sample("fabricmon_ib_port_receive_bytes_total", (("device", "mlx5_0"), ("port", "1")), 1.2345678901234567e19),
    ), deltas=(), interval_seconds=0.0, sources=(SourceStatus("host", True, True, 0.001, 2),))
    theirs = generate_latest(make_registry(lambda: snap, clock=lambda: 5.0))
    assert exposition(snap, now=5.0) == theirs


def test_scrape_serves_rendered_bytes_without_polling(make_fixture):
    agent = _agent(make_fixture(layout="ib"))
    try:
        port = agent.start_http("127.0.0.1:0")
        agent.poller.poll_once()
        calls = []
        for st in agent.poller._states:  # a scrape must not call any source
            orig = st.source.poll
            st.source.poll = lambda inv, _o=orig: calls.append(1) or _o(inv)
        bodies = [urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read() for _ in range(3)]
        assert not calls
        assert all(b"fabricmon_ib_port_receive_bytes_total" in b for b in bodies)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    finally:
        agent.stop()


def test_rendered_snapshot_renders_each_snapshot_once(make_fixture):
    agent = _agent(make_fixture(layout="ib"))
    try:
        snap = agent.poller.poll_once()
        rendered = RenderedSnapshot(lambda: snap, clock=lambda: snap.ts + 1)
        rendered.refresh()
        first = rendered._body
        rendered.body()
        assert rendered._body is first
    finally:
        agent.poller.close()
